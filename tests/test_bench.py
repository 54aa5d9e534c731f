"""The benchmark runner and ``attn-harness bench``: statuses, peers, metrics, usage errors.

Tiny workloads and five samples per timing keep this file fast; nothing
here asserts a timing, only what is recorded and how failures are reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from torch.nn.attention.bias import CausalBias

import harness.bench.case_check as case_check
import harness.bench.ceiling_evidence as ceiling_evidence
import harness.bench.runner as bench
import harness.cli.bench as bench_cli
import harness.core.registry as registry
from harness.bench.case_check import build_backend, prepare_case
from harness.bench.ceilings import Ceilings, RunCeilings
from harness.bench.peer import PEER_NAME, ContiguousPeer
from harness.bench.run_results import failed
from harness.bench.runner import BenchConfig, run_benchmarks
from harness.bench.timed_checks import PeerTarget
from harness.bench.timing import TimingConfig
from harness.bench.workloads import WORKLOADS, CaseSpec, Workload
from harness.core.registry import BackendEntry, BackendRegistry
from harness.results.store import load_results
from reference_backends import ReferenceBackend, SdpaBackend
from tests.fixtures import bench_backends as fx

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bench_backends.py"
SMALL = dict(num_heads=4, num_kv_heads=2, head_dim=16, page_size=4)
TINY_CASES = (
    CaseSpec("decode", (9, 5, 13), (1, 1, 1), seed=1, **SMALL),
    CaseSpec("prefill", (6, 3), (6, 3), seed=2, **SMALL),
    CaseSpec("extend", (11, 8), (4, 8), seed=3, **SMALL),
    CaseSpec("mixed", (1, 13, 8, 21, 6), (1, 13, 3, 1, 6), seed=4, **SMALL),
    CaseSpec("dp=3", (7, 9), (1, 1), dp_size=3, dp_rank=2, layout="per_rank", seed=5, **SMALL),
)
TINY = Workload("tiny", 1, "mixed", "tests only", TINY_CASES, TINY_CASES)
ONE = Workload("one", 2, "decode", "tests only", TINY_CASES[:1], TINY_CASES[:1])
FAST = TimingConfig(warmup=1, min_samples=5, max_samples=5, cold_cache=False)
CONFIG = BenchConfig(timing=FAST, prepare_timing=FAST, probe_ceilings=False)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    """Tiny workloads by name, a fresh registry without real entry points."""
    monkeypatch.setitem(WORKLOADS, "tiny", TINY)
    monkeypatch.setitem(WORKLOADS, "one", ONE)
    monkeypatch.setattr(registry, "entry_points", lambda *, group: [])
    monkeypatch.setattr(registry, "_DEFAULT", BackendRegistry())


def entry(cls: type, name: str | None = None) -> BackendEntry:
    return BackendEntry(name or cls.__name__, cls, "test")


def by_backend(record, name):
    return [c for c in record.cases if c.backend == name]


# -- the runner ----------------------------------------------------------------------


def test_builtins_pass_every_tiny_case_with_peer_metrics_and_raw_samples(ratio_ci_by_hand):
    record = run_benchmarks(
        [entry(SdpaBackend, "sdpa"), entry(ReferenceBackend, "ref")], [TINY], CONFIG
    )
    assert len(record.cases) == 3 * len(TINY_CASES)
    assert {c.status for c in record.cases} == {"PASSED"}, [c.error for c in record.cases]
    assert not failed(record)
    for c in record.cases:
        assert len(c.forward.samples_ns) >= 5
        assert c.oracle["passed"]
        assert c.metrics["tokens"] == sum(CaseSpec.from_json(c.spec).query_lens)
        if c.role == "peer":
            assert c.backend == PEER_NAME
            assert c.prepare is None
            assert c.metrics["ratio_to_peer"] is None
        else:
            assert c.peer == f"tiny@1/{c.case}::{PEER_NAME}"
            assert c.id == f"tiny@1/{c.case}::{c.backend}"
            assert len(c.prepare.samples_ns) >= 5
            # the ratio and its interval are recomputable from the raw samples recorded
            mine, peers = c.forward.samples_ns, record.case(c.peer).forward.samples_ns
            ratio = statistics.median(mine) / statistics.median(peers)
            assert c.metrics["ratio_to_peer"] == pytest.approx(ratio, rel=1e-12)
            low, high = c.metrics["ratio_to_peer_ci"]
            assert low <= ratio <= high
            # no resample's median ratio can lie outside the samples' extreme ratios
            assert min(mine) / max(peers) <= low
            assert high <= max(mine) / min(peers)
            assert [low, high] == pytest.approx(ratio_ci_by_hand(mine, peers), rel=1e-12)
    assert record.timing["threads"] >= 1
    assert len(record.timing["overhead"]["samples_ns"]) == 50
    assert record.environment["threads"] == record.timing["threads"]


def test_pinned_sdpa_kernel_is_used_for_check_and_timing_and_recorded(monkeypatch):
    """On CUDA the peer's and sdpa's SDPA kernel is pinned (forced here on the CPU)."""
    import harness.bench.sdpa_pin as sdpa_pin

    # the CPU has no memory-efficient kernel: the first choice cannot run, the next is taken
    monkeypatch.setattr(sdpa_pin, "PIN_ORDER", ("EFFICIENT_ATTENTION", "MATH"))
    monkeypatch.setattr(
        bench, "first_kernel_that_runs",
        lambda attempt, no_kernel: sdpa_pin.first_kernel_that_runs(
            attempt, no_kernel, sdpa_pin.PIN_ORDER
        ),
    )  # fmt: skip
    config = BenchConfig(timing=FAST, prepare_timing=FAST, probe_ceilings=False, pin_sdpa=True)
    record = run_benchmarks(
        [entry(SdpaBackend, "sdpa"), entry(ReferenceBackend, "ref")], [ONE], config
    )
    kernels = {c.backend: c.sdpa_kernel for c in record.cases}
    assert kernels == {PEER_NAME: "MATH", "sdpa": "MATH", "ref": None}
    assert {c.status for c in record.cases} == {"PASSED"}
    default = run_benchmarks([entry(SdpaBackend, "sdpa")], [ONE], CONFIG)
    assert "sdpa_kernel" not in default.cases[0].to_json()  # no pin on the CPU by default


def test_a_kernel_that_cannot_run_is_skipped_and_any_other_outcome_kept():
    from harness.bench.sdpa_pin import first_kernel_that_runs

    tried = []

    def attempt():
        tried.append(len(tried))
        return "No available kernel" if len(tried) == 1 else f"ran on try {len(tried)}"

    name, result = first_kernel_that_runs(attempt, lambda r: r.startswith("No available"))
    assert (name, result) == ("EFFICIENT_ATTENTION", "ran on try 2")
    with pytest.raises(ValueError, match="no SDPA kernel"):
        first_kernel_that_runs(attempt, lambda r: False, ())


def test_peer_uses_one_sdpa_call_per_shape_and_a_bottom_right_mask():
    case = prepare_case(TINY, TINY_CASES[3], "cpu")  # mixed: five different (q, L)
    peer = ContiguousPeer(case.inputs)
    assert len(peer.groups) == 5
    extend = next(g for g in peer.groups if g.query.shape[2] == 3)  # q=3 of L=8
    assert isinstance(extend.mask, CausalBias)  # SDPA's flash path, not a boolean mask
    assert (extend.mask.seq_len_q, extend.mask.seq_len_kv) == (3, 8)
    visible = extend.mask._materialize()
    assert visible[0].tolist() == [True] * 6 + [False] * 2  # position 5 sees 0..5
    prompt = next(g for g in peer.groups if g.query.shape[2] == 13)
    assert prompt.is_causal
    assert prompt.mask is None
    assert case_check.check_output(case, peer.assemble(peer())).status == "PASSED"


def test_incorrect_backend_is_reported_and_never_timed():
    record = run_benchmarks(
        [entry(fx.ScaledOutputBackend), entry(SdpaBackend, "sdpa")], [ONE], CONFIG
    )
    (bad,) = by_backend(record, "ScaledOutputBackend")
    assert bad.status == "INCORRECT_NUMERICAL"
    assert "oracle" in bad.error
    assert not bad.oracle["passed"]
    assert not bad.valid
    assert bad.metrics is None
    assert bad.forward is None  # a wrong answer gets no samples at all
    assert bad.prepare is None
    assert by_backend(record, "sdpa")[0].status == "PASSED"
    assert failed(record)


def test_backend_raising_mid_run_is_a_runtime_error_and_the_others_are_recorded():
    backends = [entry(fx.RaisesMidRunBackend), entry(SdpaBackend, "sdpa")]
    record = run_benchmarks(backends, [TINY], CONFIG)
    for c in by_backend(record, "RaisesMidRunBackend"):
        assert c.status == "RUNTIME_ERROR"
        assert "during timing: RuntimeError: device lost" in c.error
        assert c.forward is None
        assert c.metrics is None
    assert {c.status for c in by_backend(record, "sdpa")} == {"PASSED"}
    assert {c.status for c in by_backend(record, PEER_NAME)} == {"PASSED"}


@pytest.mark.parametrize(
    ("cls", "status", "message"),
    [
        (fx.RefusesBackend, "UNSUPPORTED", "supports no batch"),
        (fx.RejectsBackend, "REJECTED_VALID", "block_table"),
        (fx.WrongShapeBackend, "INCORRECT_SHAPE", "expected (3, 4, 16)"),
        (fx.Bf16OnlyBackend, "UNSUPPORTED", "dtype torch.float32"),
    ],
)
def test_each_failure_gets_its_status(cls, status, message):
    record = run_benchmarks([entry(cls)], [ONE], CONFIG)
    (c,) = by_backend(record, cls.__name__)
    assert c.status == status
    assert message in c.error
    assert c.metrics is None


def test_cuda_graph_timing_needs_a_graph_mode_claim():
    case = prepare_case(ONE, TINY_CASES[0], "cpu")
    checked = case_check.check_backend(entry(fx.NoGraphModeBackend), case, graph_mode=True)
    assert checked.verdict.status == "UNSUPPORTED"
    assert "graph_mode" in checked.verdict.error
    checked = case_check.check_backend(entry(SdpaBackend), case, graph_mode=True)
    assert checked.verdict.status == "PASSED"
    assert checked.graph_mode


@pytest.mark.parametrize("skips_first", [True, False])
def test_each_backend_gets_the_caches_as_built_whatever_ran_before(skips_first):
    """A backend that never writes the new K/V must fail even after one that did."""
    backends = [entry(fx.SkipsCacheWriteBackend), entry(SdpaBackend, "sdpa")]
    record = run_benchmarks(backends[:: 1 if skips_first else -1], [ONE], CONFIG)
    assert by_backend(record, "SkipsCacheWriteBackend")[0].status == "INCORRECT_NUMERICAL"
    assert by_backend(record, "sdpa")[0].status == "PASSED"


def test_non_dp_backend_is_unsupported_for_dp_cases_only():
    record = run_benchmarks([entry(fx.NonDPBackend)], [TINY], CONFIG)
    statuses = {c.case: c.status for c in by_backend(record, "NonDPBackend")}
    assert statuses.pop("dp=3") == "UNSUPPORTED"
    assert set(statuses.values()) == {"PASSED"}


def test_a_hanging_backend_times_out(monkeypatch):
    # a deadline a loaded machine's sdpa run keeps well inside, a hang overruns
    config = BenchConfig(timing=FAST, prepare_timing=FAST, probe_ceilings=False, case_timeout_s=3)
    record = run_benchmarks([entry(fx.SlowBackend), entry(SdpaBackend, "sdpa")], [ONE], config)
    (slow,) = by_backend(record, "SlowBackend")
    assert slow.status == "TIMEOUT"
    assert "3 s" in slow.error
    assert by_backend(record, "sdpa")[0].status == "PASSED"


def test_validate_false_only_where_the_constructor_takes_it():
    spec = TINY_CASES[0]
    assert build_backend(entry(SdpaBackend), spec, for_timing=True).validate is False
    assert build_backend(entry(SdpaBackend), spec, for_timing=False).validate is True
    fx.KwargsOnlyBackend.seen.clear()
    record = run_benchmarks([entry(fx.KwargsOnlyBackend)], [ONE], CONFIG)
    assert by_backend(record, "KwargsOnlyBackend")[0].status == "PASSED"
    assert all("validate" not in kw for kw in fx.KwargsOnlyBackend.seen)


def test_the_timed_instance_is_checked_too():
    record = run_benchmarks([entry(fx.WrongWithoutValidationBackend)], [ONE], CONFIG)
    (c,) = by_backend(record, "WrongWithoutValidationBackend")
    assert c.status == "INCORRECT_NUMERICAL"
    assert "validate=False" in c.error
    assert c.forward is None
    assert c.prepare is None


def test_rates_above_the_ceiling_are_flagged_and_their_fractions_withheld(monkeypatch):
    """A ceiling a busy probe set too low: a note, not a failure. (Far above every ceiling
    is a time that cannot be the work, and fails: ``test_timed_integrity.py``; the margin
    is lifted here so that these 1 byte/s ceilings stand for a busy probe.)"""
    tiny = Ceilings("measured", "fake", 1.0, {"float32": 1.0})  # 1 byte/s, 1 FLOP/s
    monkeypatch.setattr(bench, "run_ceilings", lambda *a, **k: RunCeilings(tiny, None))
    monkeypatch.setattr(ceiling_evidence, "IMPOSSIBLE_MARGIN", float("inf"))
    record = run_benchmarks([entry(SdpaBackend, "sdpa")], [ONE], CONFIG)
    for c in record.cases:
        assert c.metrics["bandwidth_fraction"] is None
        assert c.metrics["compute_fraction"] is None
        assert c.metrics["roofline_fraction"] is None
        assert c.metrics["withheld"] == ["bandwidth", "compute"]
        assert c.metrics["ceiling_source"] == "measured"
        assert any(f.startswith("measurement error: bandwidth at") for f in c.flags)
    assert [f.split(":")[0] for f in record.flags] == ["ceiling contradicted"] * 2


def test_nothing_passing_is_a_failed_run():
    record = run_benchmarks([entry(fx.RefusesBackend)], [ONE], CONFIG)
    assert failed(record) is False  # the peer passed
    record.cases = [c for c in record.cases if c.role == "backend"]
    assert failed(record) is True


# -- the command line ------------------------------------------------------------------


def _wired() -> bool:
    """Whether ``harness.cli.main`` has the ``bench`` subcommand yet."""
    from harness.cli import main as main_cli

    parser = main_cli.build_parser()
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return bool(subparsers) and "bench" in subparsers[0].choices


def cli(*argv: str) -> int:
    """``attn-harness bench ...`` through ``harness.cli.main.main`` once wired, else bench_cli's."""
    if _wired():
        from harness.cli import main as main_cli

        return main_cli.main(["bench", *argv])
    return bench_cli.main(["bench", *argv])


QUICK = ("--no-probe", "--warm-cache", "--no-progress", "--max-samples", "5", "--budget", "0.01")


def test_cli_lists_workloads():
    assert cli("--list-workloads") == 0


def test_cli_list_output(capsys):
    cli("--list-workloads")
    out = capsys.readouterr().out
    for name in ("decode-sweep", "prefill-sweep", "extend", "mixed", "dp-scaling"):
        assert name in out


def test_cli_run_writes_a_loadable_file_and_prints_a_table(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = cli("--backend", "sdpa", "--workload", "one", "--out", str(out), *QUICK)
    printed = capsys.readouterr()
    assert code == 0, printed.err
    record = load_results(out)
    assert [c.backend for c in record.cases] == [PEER_NAME, "sdpa"]
    assert "PASSED" in printed.out
    assert "x peer" in printed.out
    assert f"results written to {out}" in printed.out


def test_cli_incorrect_backend_exits_1_and_still_saves_every_case(tmp_path, capsys):
    out = tmp_path / "r.json"
    spec = f"{FIXTURES}:ScaledOutputBackend"
    code = cli(
        "--backend", spec, "--backend", "sdpa", "--workload", "one", "--out", str(out), *QUICK
    )
    assert code == 1
    statuses = {c.backend: c.status for c in load_results(out).cases}
    assert statuses == {PEER_NAME: "PASSED", spec: "INCORRECT_NUMERICAL", "sdpa": "PASSED"}
    assert "INCORRECT_NUMERICAL" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--workload", "nope"), "Unknown workload 'nope'"),
        (("--backend", "nope"), "Unknown attention backend 'nope'"),
        (("--backend", "no/such/file.py:Cls"), "does not exist"),
        (("--min-samples", "9", "--max-samples", "5"), "--max-samples (5) is below"),
        (("--out", "/dev/null/r.json"), "/dev/null is not a directory"),
        (("--out", "{tmp}"), "is a directory"),
    ],
)
def test_cli_usage_errors_exit_2_before_running_and_write_nothing(
    tmp_path, capsys, monkeypatch, argv, message
):
    monkeypatch.setattr(bench, "run_benchmarks", pytest.fail)  # nothing may run
    argv = tuple(a.replace("{tmp}", str(tmp_path)) for a in argv)
    has_out = "--out" in argv
    out_args = () if has_out else ("--out", str(tmp_path / "r.json"))
    assert cli("--workload", "one", *argv, *out_args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_cli_cuda_without_a_device_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert cli("--device", "cuda", "--out", str(tmp_path / "r.json")) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def _interrupted_at_case(monkeypatch, n: int) -> None:
    """Ctrl-C arrives as the ``n``-th case starts."""
    real, calls = bench._Runner.run_case, []

    def run_case(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(bench._Runner, "run_case", run_case)


def test_cli_interrupted_run_keeps_every_finished_case_marked_partial(
    tmp_path, capsys, monkeypatch
):
    _interrupted_at_case(monkeypatch, 3)
    out = tmp_path / "r.json"
    assert cli("--workload", "tiny", "--backend", "sdpa", "--out", str(out), *QUICK) == 130
    err = capsys.readouterr().err
    assert f"interrupted after 2 of 5 cases; those 2 are in {out}, marked partial" in err
    saved = load_results(out)  # strict load: a valid file
    assert saved.partial
    assert [(c.case, c.backend) for c in saved.cases] == [
        (case, backend) for case in ("decode", "prefill") for backend in (PEER_NAME, "sdpa")
    ]
    assert all(c.status == "PASSED" and c.metrics for c in saved.cases)
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_cli_interrupted_before_a_case_finished_writes_nothing(tmp_path, capsys, monkeypatch):
    _interrupted_at_case(monkeypatch, 1)
    assert cli("--workload", "one", "--out", str(tmp_path / "r.json"), *QUICK) == 130
    assert "interrupted before the first case finished; nothing written" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_cli_interrupted_without_out_says_nothing_was_asked_for(capsys, monkeypatch):
    _interrupted_at_case(monkeypatch, 2)
    assert cli("--workload", "tiny", "--backend", "sdpa", *QUICK) == 130
    assert "interrupted; no results written (no --out)" in capsys.readouterr().err


def test_a_finished_run_saved_after_every_case_is_not_partial(tmp_path, monkeypatch):
    saves = []
    real = bench_cli.KeptCases.__call__

    def counted(self, record):
        saves.append(record.partial)
        real(self, record)

    monkeypatch.setattr(bench_cli.KeptCases, "__call__", counted)
    out = tmp_path / "r.json"
    assert cli("--workload", "tiny", "--backend", "sdpa", "--out", str(out), *QUICK) == 0
    assert saves == [True] * 4 + [False]  # after each of the 5 cases; the last one finished
    assert not load_results(out).partial


def test_cli_a_results_file_that_cannot_be_saved_stops_the_run(tmp_path, capsys, monkeypatch):
    from harness.results import store

    def full_disk(record, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "save_results", full_disk)
    ran = []
    real = bench._Runner.run_case
    monkeypatch.setattr(
        bench._Runner, "run_case", lambda self, *a, **k: (ran.append(1), real(self, *a, **k))
    )
    out = tmp_path / "r.json"
    assert cli("--workload", "tiny", "--backend", "sdpa", "--out", str(out), *QUICK) == 2
    assert "results not saved: [Errno 28] No space left on device" in capsys.readouterr().err
    assert len(ran) == 1  # no case is timed after the first that could not be kept
    assert not out.exists()


def test_interleaved_order_takes_the_workloads_in_turn_and_records_keep_workload_order():
    two = Workload("two", 1, "decode", "tests only", TINY_CASES[1:3], TINY_CASES[1:3])
    config = replace(CONFIG, interleave=True)
    order = [(w.name, spec.name) for _, w, spec in bench.run_order([TINY, two], config)]
    assert order[:4] == [
        ("tiny", "decode"),
        ("two", "prefill"),
        ("tiny", "prefill"),
        ("two", "extend"),
    ]
    record = run_benchmarks([entry(SdpaBackend, "sdpa")], [ONE, two], config)
    assert [(c.workload, c.case) for c in record.cases if c.role == "peer"] == [
        ("one", "decode"),
        ("two", "prefill"),
        ("two", "extend"),
    ]


def test_no_case_starts_past_the_last_start_and_the_run_says_so():
    record = run_benchmarks([entry(SdpaBackend, "sdpa")], [TINY], replace(CONFIG, last_start_s=0.0))
    assert record.cases == []
    assert record.partial
    assert record.flags == ["out of time: 5 cases not started"]


def test_cli_bad_numbers_are_argparse_usage_errors(capsys):
    assert cli("--threads", "0") == 2
    assert "must be >= 1" in capsys.readouterr().err


def test_results_json_is_plain_json(tmp_path):
    out = tmp_path / "r.json"
    cli("--backend", "reference", "--workload", "one", "--out", str(out), *QUICK)
    data = json.loads(out.read_text())
    assert data["schema_version"] == 1
    assert data["workloads"] == [
        {"name": "one", "version": 2, "size": "cpu", "kind": "decode", "description": "tests only"}
    ]


def _swallow_first_alarm(seconds: float) -> int:
    """Loop under a deadline, swallowing the first alarm as a gc callback would."""
    import time

    swallowed = 0
    with bench.deadline(seconds):
        end = time.monotonic() + 5
        while time.monotonic() < end:
            try:
                time.sleep(0.01)
            except bench.CaseTimeout:
                if swallowed:
                    raise
                swallowed += 1
    return swallowed


def test_deadline_fires_again_when_an_alarm_is_swallowed():
    """An alarm caught by code that swallows exceptions must not lose the deadline."""
    with pytest.raises(bench.CaseTimeout):
        _swallow_first_alarm(0.05)


def test_a_shielded_section_finishes_and_the_deadline_fires_just_after_it():
    """A CUDA graph capture must not be cut in half: the deadline waits for the shield."""
    import time

    from harness.core.deadlines import shielded

    done = []
    started = time.monotonic()

    def capture_past_the_deadline() -> None:
        with bench.deadline(0.05):
            with shielded():
                end = time.monotonic() + 0.3  # past the deadline, in bytecode and in sleep
                while time.monotonic() < end:
                    time.sleep(0.01)
                done.append(time.monotonic() - started)
            time.sleep(5)

    with pytest.raises(bench.CaseTimeout):
        capture_past_the_deadline()
    assert done  # the section ran to its end
    assert time.monotonic() - started < 3.0  # fired right after it, long before the sleep ends


def test_deadline_does_not_raise_inside_a_gc_callback(monkeypatch):
    """An alarm landing in a gc callback is raised after it, not lost as 'unraisable'."""
    import gc
    import sys
    import time

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    finished = []

    def slow_callback(phase, info):
        if phase == "start":
            end = time.monotonic() + 0.3
            while time.monotonic() < end:  # bytecode, where a signal handler runs
                pass
            finished.append(phase)

    def collect_then_hang() -> None:
        with bench.deadline(0.05):
            gc.collect()  # the alarm fires while slow_callback runs
            time.sleep(5)

    gc.callbacks.append(slow_callback)
    try:
        with pytest.raises(bench.CaseTimeout):
            collect_then_hang()
    finally:
        gc.callbacks.remove(slow_callback)
    assert [u.exc_value for u in unraisable] == []
    assert finished == ["start"]  # the callback ran to its end


def test_an_alarm_handled_after_the_block_raises_nothing():
    """An alarm due just as the block ends is handled after it: it must not raise there."""
    import signal

    before = signal.getsignal(signal.SIGALRM)
    with bench.deadline(60):
        handler = signal.getsignal(signal.SIGALRM)
        with pytest.raises(bench.CaseTimeout, match="deadline of 60 s"):
            handler(signal.SIGALRM, None)  # inside the block, the same handler interrupts
    assert signal.getsignal(signal.SIGALRM) is before  # the previous handler is back
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # and the timer is cleared
    # as if it had been pending when the timer was cleared: handled, and nothing raised
    assert handler(signal.SIGALRM, None) is None


def test_failing_backends_spend_none_of_the_timing_budget(monkeypatch):
    timed = []
    real = bench.measure

    def counting(fn, **kwargs):
        timed.append(fn)
        return real(fn, **kwargs)

    monkeypatch.setattr(bench, "measure", counting)
    failing = [
        fx.ScaledOutputBackend,
        fx.RejectsBackend,
        fx.RefusesBackend,
        fx.WrongShapeBackend,
        fx.WrongWithoutValidationBackend,
    ]
    record = run_benchmarks([entry(cls) for cls in failing], [ONE], CONFIG)
    assert timed  # the peer's forward (twice, where a busy machine made it unreliable)...
    assert all(isinstance(fn, PeerTarget) for fn in timed)  # ...and nothing else
    for c in record.cases:
        if c.role == "backend":
            assert c.status != "PASSED"
            assert (c.forward, c.prepare, c.metrics) == (None, None, None)


def test_file_spec_ids_have_no_double_slash_and_name_the_file(tmp_path):
    spec = f"{FIXTURES}:ScaledOutputBackend"
    record = run_benchmarks([registry.default_registry().resolve(spec)], [ONE], CONFIG)
    (c,) = by_backend(record, spec)
    assert c.id == f"one@2/decode::{spec}"
    assert c.peer == f"one@2/decode::{PEER_NAME}"
    assert c.backend_class == f"{FIXTURES}:ScaledOutputBackend"  # not its internal module
    assert all("//" not in r.id for r in record.cases)
    assert load_results(bench_cli_save(record, tmp_path)).case(c.id).backend == spec


def bench_cli_save(record, tmp_path):
    from harness.results.store import save_results

    return save_results(record, tmp_path / "r.json")


def test_results_with_old_slash_ids_still_load_and_render(tmp_path):
    record = run_benchmarks([entry(SdpaBackend, "sdpa")], [ONE], CONFIG)
    for c in record.cases:  # ids as files written before '::' have them
        c.id = c.id.replace("::", "/")
        c.peer = c.peer and c.peer.replace("::", "/")
    loaded = load_results(bench_cli_save(record, tmp_path))
    (mine,) = by_backend(loaded, "sdpa")
    assert mine.peer == f"one@2/decode/{PEER_NAME}"
    assert loaded.case(mine.peer).role == "peer"
    assert "PASSED" in bench_cli.render(loaded).splitlines()[4]


def _bench_parser() -> argparse.ArgumentParser:
    parser = bench_cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices["bench"]


def test_every_bench_option_says_what_it_does_and_its_default(capsys):
    for action in _bench_parser()._actions:
        if action.dest == "help":
            continue
        assert action.help, action.option_strings
        assert len(action.help) > 30, action.option_strings
        assert "default: " in action.help, action.option_strings
    with pytest.raises(SystemExit):
        bench_cli.main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--min-samples N timed forward calls" in text
    assert "(default: 5)" in text
    assert "--max-samples N most timed forward calls" in text
    assert "(default: 100)" in text


def test_help_defaults_are_the_librarys():
    from harness.bench.timing import TimingConfig
    from harness.bench.workloads import DEFAULT_WORKLOADS

    defaults = TimingConfig()
    assert bench_cli.DEFAULT_WORKLOAD_NAMES == DEFAULT_WORKLOADS
    spelled_out = (
        bench_cli.DEFAULT_MIN_SAMPLES,
        bench_cli.DEFAULT_MAX_SAMPLES,
        bench_cli.DEFAULT_BUDGET_S,
        bench_cli.DEFAULT_TARGET_CI,
        bench_cli.DEFAULT_TIMEOUT_S,
    )
    library = (
        defaults.min_samples,
        defaults.max_samples,
        defaults.budget_s,
        defaults.target_rel_ci,
        BenchConfig().case_timeout_s,
    )
    assert spelled_out == library
    args = _bench_parser().parse_args([])
    assert (args.min_samples, args.max_samples) == (defaults.min_samples, defaults.max_samples)


def test_bench_cli_builds_its_parser_without_torch():
    """``attn-harness --help`` must not wait for torch on bench's account.

    ``harness/__init__.py`` imports torch itself, so the package is stubbed
    here: what is measured is bench_cli's own imports.
    """
    import subprocess
    import sys
    import textwrap

    package = Path(bench_cli.__file__).parents[1]
    code = textwrap.dedent(
        f"""
        import sys, types
        stub = types.ModuleType("harness")
        stub.__path__ = [{str(package)!r}]
        sys.modules["harness"] = stub
        import harness.cli.bench as bench_cli
        parser = bench_cli.build_parser()
        parser.parse_args(["bench", "--workload", "decode-sweep", "--max-samples", "9"])
        parser.format_help()
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "harness")))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "['harness', 'harness.bench', 'harness.bench.table', 'harness.cli', "
        "'harness.cli.bench', 'harness.cli.usage', 'harness.core', 'harness.core.arg_types', "
        "'harness.core.atomic_file', 'harness.core.exit_codes', 'harness.core.shards', "
        "'harness.core.text_table', 'harness.processes', 'harness.processes.progress_file']"
    )


def test_cli_file_spec_without_class_says_so_and_names_its_backends(capsys, monkeypatch):
    monkeypatch.setattr(bench, "run_benchmarks", pytest.fail)
    assert cli("--backend", str(FIXTURES), "--workload", "one") == 2
    err = capsys.readouterr().err
    assert "Unknown attention backend" not in err
    assert "a file spec needs ':Class'" in err
    assert f"e.g. '{FIXTURES}:ScaledOutputBackend'" in err
    classes = err.split("backend classes in it: ")[1].strip().split(", ")
    assert {"SlowBackend", "ZerosBackend", "NonDPBackend"} <= set(classes)
    assert "SdpaBackend" not in classes  # imported there, not defined


def test_progress_is_plain_lines_in_a_log_and_a_live_bar_on_a_terminal():
    import io

    log = io.StringIO()
    progress = bench_cli.Progress(enabled=True, stream=log)
    progress(1, 3, "one/decode sdpa")
    progress(2, 3, "one/decode reference")
    progress.close()
    assert log.getvalue().splitlines() == ["[1/3] one/decode sdpa", "[2/3] one/decode reference"]

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    live = bench_cli.Progress(enabled=True, stream=terminal)
    live(1, 3, "one/decode sdpa")
    live.close()
    assert "[1/3]" not in terminal.getvalue()  # the bar, not a line per step
    assert "1/3" in terminal.getvalue()
