"""An interpreted backend's run sized by what its examples cost, not by how many there are."""

from __future__ import annotations

import re

import pytest

from harness.conformance.cost_budget import CostLedger, CostMeter, scenarios_work, step_work
from harness.conformance.options import ConformanceOptions
from harness.conformance.profiles import get_profile
from harness.conformance.session import ConformanceSession
from harness.core.registry import BackendEntry
from harness.numerics.scenario import Scenario
from harness.report import build_report
from reference_backends import SdpaBackend, TritonBackend
from tests.test_conform import EXIT_FAILED, EXIT_OK, EXIT_USAGE, FIXTURES


def test_step_work_counts_tiles_per_head_and_layer():
    assert step_work(1, 1, [1], [1]) == 1 + 1  # a launch and one tile
    assert step_work(1, 1, [1], [32]) == step_work(1, 1, [1], [1])  # one key tile holds 32
    assert step_work(1, 1, [1], [33]) == 1 + 2
    assert step_work(1, 1, [17], [64]) == 1 + 2 * 2  # two query tiles of 16, two key tiles
    assert step_work(2, 4, [1, 1], [40, 8]) == 2 * (1 + 4 * (2 + 1))


def test_scenarios_work_sums_every_step():
    one = Scenario(context_lens=(40,), query_lens=(1,), num_heads=4, num_layers=2)
    assert scenarios_work([one]) == step_work(2, 4, [1], [40])
    assert scenarios_work([one, one]) == 2 * scenarios_work([one])


def test_the_meter_predicts_nothing_before_it_has_measured():
    assert CostMeter().predict(100) is None


def test_the_meter_fits_a_fixed_cost_and_a_cost_per_tile():
    meter = CostMeter()
    for work in (2, 10, 40, 200):
        meter.observe(work, 0.8 + 0.01 * work)  # what an interpreted kernel's examples look like
    fixed, per_tile = meter.fit()
    assert fixed == pytest.approx(0.8)
    assert per_tile == pytest.approx(0.01)
    assert meter.predict(8000) == pytest.approx(80.8)  # not 8000 x the small examples' rate


def test_the_meter_never_fits_a_negative_part():
    falling = CostMeter()
    falling.observe(10, 2.0)
    falling.observe(20, 1.0)
    assert falling.fit() == (1.5, 0.0)
    proportional = CostMeter()
    proportional.observe(10, 0.1)
    proportional.observe(20, 0.5)  # the line through them crosses zero below 0
    fixed, per_tile = proportional.fit()
    assert fixed == 0.0
    assert per_tile > 0


def test_one_size_seen_is_taken_as_half_fixed_half_per_tile():
    meter = CostMeter()
    meter.observe(100, 2.0)
    assert meter.predict(100) == pytest.approx(2.0)
    assert meter.predict(300) == pytest.approx(4.0)


def test_the_ledger_admits_what_fits_and_records_the_rest():
    ledger = CostLedger(budget_s=60.0, tests={"k": 18})  # 3 x 60 / 18 = 10 s for the first
    assert ledger.admit("k", "t", 100, "first")  # no prediction yet: it runs
    ledger.charge("k", "t", 100, 4.0)  # taken as 2 s fixed, 0.02 s per tile; 6 s left
    assert ledger.admit("k", "t", 190, "fits")  # 5.8 s predicted
    assert not ledger.admit("k", "t", 300, "too big")  # 8 s predicted
    assert ledger.checked_in("k", "t") == 1
    (skipped,) = ledger.not_checked("k")
    assert (skipped.test, skipped.seconds, skipped.timed_out) == ("t", pytest.approx(8.0), False)
    assert ledger.admit("k", "other", 200, "a new test has its own part")


def test_a_cheap_test_leaves_its_seconds_to_the_tests_after_it():
    ledger = CostLedger(budget_s=60.0, tests={"k": 6})
    assert ledger.allowance("k", "first") == 30.0  # up to 3 of the 6 equal parts
    ledger.charge("k", "first", 10, 1.0)
    assert ledger.allowance("k", "second") == pytest.approx(3 * 59 / 5)
    ledger.charge("k", "second", 10, 35.4)
    assert ledger.allowance("k", "third") == pytest.approx(3 * 23.6 / 4)
    assert ledger.allowance("other backend", "first") == 60.0  # its own budget, tests uncounted
    last = CostLedger(budget_s=10.0, tests={"k": 1})
    assert last.allowance("k", "only") == 10.0  # never more than is left


def test_an_overrun_is_not_checked_and_teaches_the_meter():
    ledger = CostLedger(budget_s=10.0)
    ledger.overran("k", "t", 10, 5.0, "hung")
    assert ledger.checked_in("k", "t") == 0
    assert ledger.not_checked("k")[0].timed_out
    assert not ledger.admit("k", "t", 30, "predicted at 10 s, 5 s left")
    (line,) = ledger.summary_lines("ci (interpreted)")
    assert "2 example(s) of 'k' not checked" in line
    assert "1 of them stopped at their deadline" in line
    assert "profile's 10 s of examples for the run" in line
    assert "the costliest, 10 s in t: predicted at 10 s" in line


def test_the_deadline_is_what_is_left_but_never_under_a_quarter_of_the_part():
    ledger = CostLedger(budget_s=8.0)
    assert ledger.deadline_s("k", "t") == 8.0
    ledger.charge("k", "t", 1, 7.5)
    assert ledger.deadline_s("k", "t") == 2.0


def test_only_a_backend_interpreted_on_the_device_gets_a_ledger():
    run = ConformanceSession(ConformanceOptions(profile="ci", device="cpu"))
    assert run.cost_ledger(BackendEntry("sdpa", SdpaBackend, "built-in")) is None
    ledger = run.cost_ledger(BackendEntry("triton", TritonBackend, "built-in"))
    assert ledger.budget_s == get_profile("ci").interpreted_budget_s
    bigger = ConformanceSession(ConformanceOptions(device="cpu", interpreted_budget=30.0))
    assert bigger.cost_ledger(BackendEntry("triton", TritonBackend, "built-in")).budget_s == 30


def test_a_bad_budget_is_a_usage_error(conform):
    result = conform("--backend", "reference", "--", "--interpreted-budget", "0")
    assert result.returncode == EXIT_USAGE
    assert "--interpreted-budget must be > 0" in result.stdout + result.stderr


def test_a_slow_interpreted_backend_leaves_examples_unchecked_and_says_so(conform, tmp_path):
    junit = tmp_path / "conform.xml"
    result = conform(
        "--backend",
        f"{FIXTURES}:SlowInterpreted",
        "--junitxml",
        str(junit),
        "--",
        "--interpreted-budget",
        "1",
        "-k",
        "test_outputs_match_oracle or test_second_run_is_bit_identical",
    )
    out = result.stdout
    assert result.returncode == EXIT_OK, out[-3000:]
    assert "at most 1 s of examples in all" in out  # the header says how it is sized
    table = out[out.index("property ") :]
    assert "not checked" in table
    assert "example(s) of 'tests/fixtures/conform_backends.py:SlowInterpreted' not checked" in out
    assert "FAILED" not in out
    assert "not checked, over budget" in out.splitlines()[-1]  # the verdict says it too
    said = re.search(r"(\d+) examples? not checked, over budget", out.splitlines()[-1])
    assert said is not None
    build_report([junit], tmp_path / "report")  # and the report, not the console alone
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert f"({said.group(1)} examples not checked: over budget)" in summary
    page = (tmp_path / "report" / "index.html").read_text()
    assert f"({said.group(1)} not checked: over the interpreted budget)" in page


def test_an_interpreted_example_past_its_deadline_is_not_checked_not_failed(conform):
    result = conform(
        "--backend",
        f"{FIXTURES}:InterpretedHangs",
        "--",
        "--interpreted-budget",
        "2",
        "-k",
        "test_outputs_match_oracle or test_second_run_is_bit_identical",
    )
    out = result.stdout
    assert "ExampleTimeout" not in out, out[-3000:]
    assert "stopped at their deadline" in out, out[-3000:]
    table = out[out.index("property ") :]
    assert "not checked (" in table  # every example over budget: the test checked nothing
    assert "passed" not in table
    assert "nothing could be checked" in out  # and a run that checked nothing fails
    assert result.returncode == EXIT_FAILED, out[-3000:]


def test_after_a_failure_every_example_runs_so_the_replay_sees_it_fail_again():
    ledger = CostLedger(budget_s=4.0)
    ledger.charge("k", "t", 10, 4.0)  # the part is spent
    assert not ledger.admit("k", "t", 10, "refused while the test holds")
    ledger.failed("k", "t")
    assert ledger.admit("k", "t", 10_000, "shrinking and the replay run it")
    assert ledger.deadline_s("k", "t") == float("inf")  # the profile's own limit applies
    assert not ledger.admit("k", "other", 10, "the spent budget still binds other tests")


def test_a_failing_tests_shrinking_comes_out_of_the_budget():
    ledger = CostLedger(budget_s=60.0, tests={"k": 3})
    ledger.failed("k", "failing")
    ledger.spend("k", "failing", 50.0)  # its failing examples and shrinking
    assert ledger.allowance("k", "next") == pytest.approx(10.0)  # 3 x 10 / 2, capped at 10
    assert ledger.checked_in("k", "failing") == 0
    assert ledger.meters.get(("k", "")) is None  # a failure's time predicts nothing


def test_the_stateful_step_cap_is_fixed_at_the_tests_start():
    ledger = CostLedger(budget_s=30.0, tests={"k": 3})  # 30 s for the first test
    ledger.charge("k", "warm-up", 10, 1.0)
    ledger.charge("k", "warm-up", 110, 2.0)  # fitted: 0.9 s fixed, 0.01 s per tile
    costs = ledger.for_test("k", "stateful")
    cap = ledger.step_cap("k", "stateful", 10)  # its part, 30 - 3 s left, over 10 steps
    assert cap == pytest.approx((2.7 - 0.9) / 0.01)
    assert costs.admit_step(int(cap), "fits", 10)
    assert not costs.admit_step(int(cap) + 1, "too big", 10)
    ledger.charge("k", "stateful", 1, 1000.0)  # however the clock runs afterwards
    assert ledger.step_cap("k", "stateful", 10) == cap
    assert costs.admit_step(int(cap), "still fits", 10)
    (skipped,) = ledger.not_checked("k")
    assert skipped.kind == "stateful step"


def test_a_step_cap_never_refuses_the_smallest_steps():
    ledger = CostLedger(budget_s=1.0)
    ledger.charge("k", "slow", 10, 5.0)
    ledger.charge("k", "slow", 20, 6.0)
    assert ledger.step_cap("k", "stateful", 100) == 16


def test_a_decode_only_kernel_pays_per_query_token():
    """``Capabilities.query_tile=1``: a prefill of 40 tokens is 40 decode rows, not 3 blocks."""
    assert step_work(1, 1, [40], [40], query_tile=1) == 1 + 40 * 2
    assert step_work(1, 1, [40], [40]) == 1 + 3 * 2
