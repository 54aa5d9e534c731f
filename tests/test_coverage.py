"""Coverage accounting: labels per dimension, what a claim promises, gaps, the stateful
machine's programs, and the balance of the draws behind them."""

from __future__ import annotations

import pkgutil
import statistics
from collections import Counter
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import Capabilities, PoolLayout
from harness.conformance.claim_coverage import CoverageLog, StatefulRun, labels
from harness.conformance.coverage_promises import Requirement, requirements
from harness.conformance.options import ConformanceOptions
from harness.conformance.profiles import get_profile
from harness.conformance.run_coverage import coverage_gaps, whole_suite_ran
from harness.conformance.session import ConformanceSession
from harness.conformance.session_lines import problems_of
from harness.conformance.stateful import RULES, conformance_machine, run_machine
from harness.conformance.step_strategies import multi_rank_scenarios
from harness.conformance.strategies import CI_BUDGET
from harness.core.registry import default_registry
from harness.core.variants import AttentionVariant
from harness.numerics.scenario import Scenario

FP8_NAMES = ("fp8_e5m2", "fp8_e4m3")  # recorded in the opposite order to their names
BASE = Scenario(num_heads=8, num_kv_heads=2, page_size=3, context_lens=(5,), query_lens=(1,))


def wanted(
    caps: Capabilities, dp_aware: bool = True, large_pool: bool = False
) -> set[tuple[str, str]]:
    found = requirements(
        caps,
        dp_aware=dp_aware,
        max_dp_size=CI_BUDGET.max_dp_size,
        max_context=CI_BUDGET.max_context,
        limit=CI_BUDGET.production,
        large_pool=large_pool,
    )
    return {(r.dimension, r.wanted) for r in found}


@pytest.mark.parametrize(
    ("changes", "dimension", "label"),
    [
        ({}, "rank", "only"),
        ({"dp_size": 4, "dp_rank": 0}, "rank", "first"),
        ({"dp_size": 4, "dp_rank": 2}, "rank", "middle"),
        ({"dp_size": 4, "dp_rank": 3}, "rank", "last"),
        ({"dp_size": 12, "dp_rank": 3}, "dp_size", "9-16"),
        ({"num_kv_heads": 1}, "heads", "MQA"),
        ({"num_heads": 2}, "heads", "MHA"),
        ({"num_heads": 24}, "heads", "GQA 9+"),
        ({"context_lens": (5, 7), "query_lens": (1, 7)}, "batch", "mixed"),
        ({"context_lens": (7,), "query_lens": (3,)}, "batch", "extend"),
        ({"context_lens": (32769,), "query_lens": (1,)}, "context", "32769+"),
        ({"context_lens": (300,), "query_lens": (129,)}, "query", "129+"),
        ({"pad_to": 3}, "padding", "graph-padded"),
        ({"combined_kv": True}, "cache", "combined K/V"),
        ({"layout": PoolLayout.PER_RANK}, "layout", "per_rank"),
    ],
)
def test_labels(changes, dimension, label):
    assert labels(replace(BASE, **changes))[dimension] == label


def test_default_claim_promises_every_dimension():
    found = wanted(Capabilities())
    for value in ("float32", "float16", "bfloat16"):
        assert ("dtype", value) in found
    assert {("dp_size", "17-64"), ("rank", "middle"), ("context", "32769+")} <= found
    assert {("padding", "graph-padded"), ("mask", "non-causal"), ("query", "129+")} <= found
    assert ("page_size", "not a power of two") in found


def test_a_narrow_claim_promises_only_what_it_claims_and_can_afford():
    caps = Capabilities(
        dtypes=(torch.float32,),
        page_sizes=(256,),
        head_dims=(256,),
        max_dp_size=1,
        graph_mode=False,
        non_causal=False,
    )
    found = wanted(caps)
    assert ("dtype", "float16") not in found
    assert ("page_size", "256") in found
    assert ("head_dim", "256") in found
    assert not any(d == "dp_size" and v != "1" for d, v in found)
    assert ("rank", "first") not in found
    assert ("padding", "graph-padded") not in found
    assert ("mask", "non-causal") not in found
    assert ("shared_prefix", "shared") not in found  # a 256-token page cannot be shared here
    assert ("context", "32769+") not in found  # 32769 keys x 256 dims > the cost limit


def test_a_long_claim_promises_its_ends_and_an_odd_value():
    found = wanted(Capabilities(page_sizes=tuple(range(1, 41))))
    pages = {v for d, v in found if d == "page_size"}
    assert pages == {"1", "3", "40"}


def test_max_seq_len_limits_the_context_buckets():
    found = wanted(Capabilities(max_seq_len=200))
    contexts = {v for d, v in found if d == "context"}
    assert contexts == {"1-64", "65-256"}
    assert ("query", "129+") in found


def test_gaps_are_named_in_the_table_and_the_json():
    log = CoverageLog()
    log.record("b", "test_x", [BASE])
    need = [
        Requirement("dtype", "float32", lambda v: v == "float32"),
        Requirement("dtype", "bfloat16", lambda v: v == "bfloat16"),
    ]
    assert [r.wanted for r in log.backends["b"].missing(need)] == ["bfloat16"]
    assert "never checked, though claimed: dtype bfloat16" in "\n".join(log.table("b", need))
    data = log.as_json({"b": need})["b"]
    assert data["coverage_required"] is True
    assert log.as_json()["b"]["coverage_required"] is False
    assert data["never_checked"] == ["dtype: bfloat16"]
    assert data["examples"] == 1
    assert data["dimensions"]["page_size"] == {"3": 1}


def test_the_plugin_fails_a_complete_run_with_a_gap():
    """Enforced only when every conformance module ran and nothing was deselected."""
    import suites.conformance as package

    reference = default_registry().resolve("reference")
    log = CoverageLog()
    log.record("reference", "test_x", [BASE])
    every = {
        f"suites.conformance.{m.name}"
        for m in pkgutil.iter_modules(package.__path__)
        if m.name.startswith("test_")
    }
    run = ConformanceSession(ConformanceOptions(profile="ci"), entries=[reference], coverage=log)
    run.modules["reference"] = set(every)
    assert whole_suite_ran(run, "reference")
    gaps = coverage_gaps(run)["reference"]
    assert ("dtype", "bfloat16") in {(g.dimension, g.wanted) for g in gaps}
    ((what, meaning),) = problems_of(run)
    assert "passed nothing for" in what
    assert "Declare what the backend cannot do" in meaning
    run.verdicts.record("reference", "test_outputs_match_oracle", "failed")
    ((what, meaning),) = problems_of(run)  # a gap after failures is no limitation to declare
    assert "passed nothing for" in what
    assert "fix the failures first" in meaning
    assert "Declare" not in meaning
    partial = ConformanceSession(
        ConformanceOptions(profile="ci"), entries=[reference], coverage=log
    )
    partial.modules["reference"] = {f"suites.conformance.{m}" for m in ("test_oracle",)}
    assert not whole_suite_ran(partial, "reference")  # a partial run reports, never fails
    assert coverage_gaps(partial) == {}
    deselected = ConformanceSession(ConformanceOptions(), entries=[reference], coverage=log)
    deselected.modules["reference"] = set(every)
    deselected.deselected = True
    assert coverage_gaps(deselected) == {}


def test_the_stateful_machine_runs_real_programs():
    """Median >= 8 forward steps per ci run; every rule reached in most runs."""
    profile = get_profile("ci")
    runs: list[StatefulRun] = []
    machine = conformance_machine(
        default_registry().resolve("reference"), profile.budget, on_run=runs.append
    )
    run_machine(
        machine,
        settings(
            profile.settings,
            max_examples=profile.stateful_examples,
            stateful_step_count=profile.stateful_steps,
        ),
    )
    assert len(runs) == profile.stateful_examples
    assert statistics.median(r.steps for r in runs) >= 8
    reached = Counter(rule for r in runs for rule in r.reached)
    for rule in RULES:
        assert reached[rule] > len(runs) / 2, (rule, reached)


def test_multi_rank_draws_are_mostly_real_groups():
    sizes = []

    @settings(get_profile("ci").settings, max_examples=100)
    @given(data=st.data())
    def draw(data):
        sizes.append(data.draw(multi_rank_scenarios(Capabilities()))[0].dp_size)

    draw()
    assert sum(size >= 2 for size in sizes) >= 0.7 * len(sizes)


def test_labels_print_in_a_fixed_order_and_stateful_steps_are_not_examples():
    log = CoverageLog()
    log.record("b", "test_x", [replace(BASE, dp_size=3, dp_rank=2)])
    log.record("b", "test_x", [replace(BASE, dp_size=3, dp_rank=0)])
    log.record("b", "test_steps", [BASE, BASE], example=False)
    log.record_stateful("b", "test_steps", StatefulRun(steps=2))
    rank_line = next(line for line in log.table("b") if line.strip().startswith("rank"))
    assert rank_line.split()[1:] == ["only", "2", "first", "1", "last", "1"]
    assert log.as_json()["b"]["examples_by_test"] == {"test_steps": 1, "test_x": 2}


def test_labels_outside_the_fixed_order_print_by_name_whichever_came_first():
    """Workers merge in any order; the table and JSON must not show which finished first."""
    fp8 = tuple(replace(BASE, variant=AttentionVariant(kv_cache_dtype=d)) for d in FP8_NAMES)
    logs = []
    for draws in (fp8, fp8[::-1]):
        log = CoverageLog()
        for scenario in draws:
            log.record("b", "test_x", [scenario])
        logs.append(log)
    rows = [next(r for r in log.table("b") if r.strip().startswith("kv_cache")) for log in logs]
    assert rows[0] == rows[1]
    assert rows[0].split()[1:] == ["fp8_e4m3", "1", "fp8_e5m2", "1"]
    dims = [list(log.as_json()["b"]["dimensions"]["kv_cache"]) for log in logs]
    assert dims[0] == dims[1] == ["fp8_e4m3", "fp8_e5m2"]


def test_ci_promises_the_field_regimes():
    promised = wanted(Capabilities(), large_pool=True)
    assert ("batch", "spec-decode") in promised
    assert {("tokens", b) for b in ("8193-16384", "16385-65536")} <= promised
    assert {("logit_offset", "-3e4 or past"), ("logit_offset", "+3e4 or past")} <= promised
    assert ("pool", "2^31+") in promised
    fp16 = wanted(Capabilities(dtypes=(torch.float16,)))
    assert ("logit_offset", "-1e3 to -3e4") in fp16
    assert ("pool", "2^31+") not in fp16
    short = wanted(Capabilities(max_seq_len=32))
    assert not any(d == "tokens" and b != "1-8192" for d, b in short)
