"""The prepared GPU script: what can be checked without a GPU.

It degrades to a clear report where there is no GPU, skips a backend that
is not registered or cannot be loaded, keeps to its time budget, stops a
step at its limit without losing that step's reports, and builds its summary
from whatever files exist. The bench step's incremental runner is driven on
the CPU with a tiny workload.
"""

from __future__ import annotations

import json
import signal
import sys
import tarfile
import time

import pytest
import torch

from harness.bench.runner import BenchConfig
from harness.bench.timing import TimingConfig
from harness.bench.workloads import CaseSpec, Workload
from harness.core.registry import BackendEntry
from harness.gpu import bench_step
from harness.gpu import check as gpu_check
from harness.gpu.check import StepResult, main
from harness.results.store import load_results, save_results
from reference_backends import SdpaBackend

pytestmark = pytest.mark.integration  # real processes: `nox -s integration`

SMALL = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "page_size": 4}
DECODE = (
    CaseSpec("decode a", (9, 5), (1, 1), seed=1, **SMALL),
    CaseSpec("decode b", (13, 7), (1, 1), seed=2, **SMALL),
    CaseSpec("decode c", (21, 3), (1, 1), seed=3, **SMALL),
)
PREFILL = (CaseSpec("prefill a", (6, 3), (6, 3), seed=4, **SMALL),)
WORKLOADS = (
    Workload("tiny-decode", 1, "decode", "tests only", DECODE, DECODE),
    Workload("tiny-prefill", 1, "prefill", "tests only", PREFILL, PREFILL),
)
FAST = BenchConfig(
    timing=TimingConfig(warmup=1, min_samples=5, max_samples=5, cold_cache=False),
    prepare_timing=TimingConfig(warmup=0, min_samples=5, max_samples=5, cold_cache=False),
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_a_gpu_every_step_reports_and_the_run_fails(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    archive = tmp_path / "run.tar.gz"
    code = main(
        ["out", "--quick", "--backend", "sdpa", "--backend", "no-such", "--archive", str(archive)]
    )
    assert code == 1
    out = capsys.readouterr().out
    run = tmp_path / "out"  # a relative OUT_DIR is made absolute: steps run from the checkout
    assert "no CUDA device visible" in out
    assert "skip no-such: not registered" in out
    assert "conformance (kill profile, cuda):" in out
    assert "sdpa: exit " in out
    assert "sdpa: exit 0" not in out
    assert "no CUDA" in (run / "conformance-sdpa.log").read_text()
    assert not (run / "conformance-no-such.log").exists()
    assert "graph-mode check (cuda): exit 2" in out
    assert "no CUDA device" in (run / "graph-check.log").read_text()
    assert "no results file" in out
    assert "no CUDA device" in (run / "bench.log").read_text()
    assert (run / "environment.txt").exists()
    assert "SDPA enabled: flash" in (run / "environment.txt").read_text()
    assert not (run / "bench-cuda.json").exists()
    assert out.rstrip().splitlines()[-1].startswith("archive: ")
    with tarfile.open(archive) as tar:
        assert "out/environment.txt" in tar.getnames()


def test_only_unknown_backends_runs_nothing(tmp_path, capsys):
    assert main([str(tmp_path), "--quick", "--backend", "no-such"]) == 1
    out = capsys.readouterr().out
    assert "skip no-such: not registered" in out
    assert "not run (no backend to check)" in out
    assert not list(tmp_path.glob("*.log"))


def test_a_backend_that_cannot_be_imported_is_skipped_with_its_error():
    found, skipped = gpu_check.available_backends(
        ["sdpa", "tests/fixtures/broken_backend.py:Nope", "no-such"]
    )
    assert found == ["sdpa"]
    assert "cannot be loaded" in skipped[0]
    assert "exploded" in skipped[0]
    assert skipped[1].startswith("skip no-such: not registered")


def test_steps_past_the_total_budget_are_skipped_not_started(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_check, "QUICK_TOTAL_S", gpu_check.RESERVE_S + 5)
    assert main([str(tmp_path), "--quick", "--backend", "sdpa"]) == 1
    out = capsys.readouterr().out
    assert out.count("not run (out of time") >= 3
    assert not list(tmp_path.glob("*.log"))


class _FakeClock:
    """``time`` for the check's module: only the steps, run to their limits, move it."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


def _simulated_run(monkeypatch, tmp_path, argv, *, overrun):
    """``main`` with every step running to its limit (``overrun``: and past it, to the kill).

    Returns each started step's (name, limit, seconds into the run it started at) and the
    simulated seconds the whole run took.
    """
    clock = _FakeClock()
    begun = clock.now
    started = []

    def run_to_the_limit(name, command, out, timeout):
        assert command  # the step's command was built for that limit
        started.append((name, timeout, clock.now - begun))
        took = timeout + (gpu_check.INTERRUPT_GRACE_S if overrun else 0.0)
        clock.now += took
        return StepResult(name, 124, took, timeout)

    monkeypatch.setattr(gpu_check, "time", clock)
    monkeypatch.setattr(gpu_check, "_run", run_to_the_limit)
    assert main([str(tmp_path), "--device", "cpu", "--backend", "sdpa", *argv]) == 1
    return started, clock.now - begun


@pytest.mark.parametrize(
    ("argv", "total_s", "lease_s", "limits"),
    [
        ([], gpu_check.FULL_TOTAL_S, 8 * 60, gpu_check.FULL_LIMITS),
        (["--quick"], gpu_check.QUICK_TOTAL_S, 4 * 60, gpu_check.QUICK_LIMITS),
    ],
)
def test_the_budget_fits_the_lease(tmp_path, capsys, monkeypatch, argv, total_s, lease_s, limits):
    """Every step gets its whole limit when those before used theirs; when every step
    ignores the interrupt until the kill, later steps get only what the total leaves,
    and the run still ends inside the lease."""
    names = ["conformance-sdpa", "graph-check", "bench"]
    wanted = [limits.conformance, limits.graph, limits.bench]
    started, _ = _simulated_run(monkeypatch, tmp_path, argv, overrun=False)
    assert [(name, limit) for name, limit, _ in started] == list(zip(names, wanted, strict=True))
    out = capsys.readouterr().out
    assert "not run (out of time" not in out
    assert f"bench (cpu): stopped at its {limits.bench:.0f} s limit" in out

    started, took = _simulated_run(monkeypatch, tmp_path, argv, overrun=True)
    assert [name for name, _, _ in started] == names  # late, but every step still started
    for (_, limit, at), want in zip(started, wanted, strict=True):
        assert limit == min(want, total_s - at - gpu_check.RESERVE_S)  # the summary's reserve
    assert took < lease_s
    capsys.readouterr()


@pytest.mark.parametrize("parent_sigint", ["default", "ignored"])
def test_a_step_past_its_limit_is_interrupted_and_reported(tmp_path, parent_sigint):
    """SIGINT first, so the step can still write its reports; no kill was needed.

    "ignored": the script itself started in the background by a shell, whose
    children inherit SIGINT ignored; the step must still take the interrupt.
    The limit leaves the child seconds to start Python and enter its ``try``
    (on a loaded machine a 1 s limit could interrupt the interpreter's own
    start-up, and the step would then only end at the kill).
    """
    previous = signal.getsignal(signal.SIGINT)
    if parent_sigint == "ignored":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    start = time.monotonic()
    script = (
        "import time\n"
        "try:\n    time.sleep(120)\n"
        "except KeyboardInterrupt:\n    print('wrote my report')\n    raise"
    )
    try:
        result = gpu_check._run("slow", [sys.executable, "-c", script], tmp_path, timeout=5.0)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 5.0 + gpu_check.INTERRUPT_GRACE_S
    assert result.rc == 124
    assert result.timed_out
    log = (tmp_path / "slow.log").read_text()
    assert "wrote my report" in log
    assert "stopped after 5 s" in log


def test_a_step_ignoring_sigint_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "INTERRUPT_GRACE_S", 1.0)
    script = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)"
    start = time.monotonic()
    result = gpu_check._run("stubborn", [sys.executable, "-c", script], tmp_path, timeout=1.0)
    assert time.monotonic() - start < 25  # killed, not left to finish its 30 s
    assert result.rc == 124


def test_conformance_runs_production_shapes_first_one_backend_per_run(tmp_path):
    command = gpu_check.conformance_command(tmp_path, "path/to/my.py:Backend", "ci")
    modules = [a for a in command if a.startswith("suites.conformance.")]
    assert modules[0] == "suites.conformance.test_production_shapes"
    assert len(modules) == len(set(modules)) > 5
    assert command[command.index("--backend") + 1] == "path/to/my.py:Backend"
    assert f"--junitxml={tmp_path / 'conformance-path_to_my.py_Backend.xml'}" in command
    assert command[command.index("--conformance-device") + 1] == "cuda"


def test_sdpa_runs_once_more_without_cudnn_attention_where_torch_may_pick_it(tmp_path):
    runs = gpu_check.conformance_runs(["triton", "sdpa"], "ci", cudnn_on=True)
    assert [(r.label, r.backend, r.profile, r.cudnn_off) for r in runs] == [
        ("triton", "triton", "ci", False),
        ("sdpa", "sdpa", "ci", False),
        ("sdpa-no-cudnn", "sdpa", "kill", True),
    ]
    assert len(gpu_check.conformance_runs(["triton", "sdpa"], "ci", cudnn_on=False)) == 2
    assert len(gpu_check.conformance_runs(["triton"], "ci", cudnn_on=True)) == 1
    command = runs[-1].command(tmp_path)
    assert command[command.index("--backend") + 1] == "sdpa"
    assert f"--junitxml={tmp_path / 'conformance-sdpa-no-cudnn.xml'}" in command
    plugin = ["-p", "harness.gpu.sdpa_cudnn_off"]
    assert any(command[i : i + 2] == plugin for i in range(len(command)))
    plain = runs[1].command(tmp_path)
    assert not any(plain[i : i + 2] == plugin for i in range(len(plain)))


def test_the_cudnn_off_plugin_turns_cudnn_attention_off():
    import harness.gpu.sdpa_cudnn_off as plugin

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        plugin.pytest_configure(None)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_conformance_counts_survive_a_broken_report(tmp_path):
    report = tmp_path / "conformance-x.xml"
    report.write_text("<testsuites><testsuite")
    assert gpu_check._conformance_counts(report) == {}


def test_bench_step_saves_after_every_case_in_workload_order(tmp_path, capsys):
    path = tmp_path / "bench.json"
    entry = BackendEntry("sdpa", SdpaBackend, "test")
    record = bench_step.run_bench_step(path, [entry], WORKLOADS, FAST, deadline_s=600)
    assert record is not None
    log = capsys.readouterr().out
    # the workloads' cases alternate, so a step cut short has some of each
    order = [line.split("] ")[1] for line in log.splitlines() if line.startswith("[")]
    assert order == [
        "tiny-decode@1/decode a",
        "tiny-prefill@1/prefill a",
        "tiny-decode@1/decode b",
        "tiny-decode@1/decode c",
    ]
    saved = load_results(path)
    assert [(c.case, c.backend) for c in saved.cases] == [
        (case, backend)
        for case in ("decode a", "decode b", "decode c", "prefill a")
        for backend in ("contiguous-sdpa", "sdpa")
    ]
    assert {w["name"] for w in saved.workloads} == {"tiny-decode", "tiny-prefill"}
    assert all(c.status == "PASSED" for c in saved.cases)
    assert saved.ceilings["used"] == "measured"  # probed once, by the first case
    bandwidth = saved.ceilings["measured"]["memory_bandwidth"]
    for case in saved.cases:  # every case against the first case's ceilings
        work = CaseSpec.from_json(case.spec).work()
        expected = work.bytes / case.metrics["median_s"] / bandwidth
        assert case.metrics["bandwidth_fraction"] == pytest.approx(expected)
    backends = [c for c in saved.cases if c.role == "backend"]
    assert all(c.metrics["ratio_to_peer"] is not None for c in backends)
    assert not saved.partial  # every planned case ran


def test_a_bench_step_interrupted_mid_run_keeps_a_valid_file_marked_partial(tmp_path, monkeypatch):
    import harness.bench.runner

    path = tmp_path / "bench.json"
    entry = BackendEntry("sdpa", SdpaBackend, "test")
    real = harness.bench.runner._Runner.run_case
    calls = []

    def interrupted_second_case(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # SIGINT arrives during the second case
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(harness.bench.runner._Runner, "run_case", interrupted_second_case)
    with pytest.raises(KeyboardInterrupt):
        bench_step.run_bench_step(path, [entry], WORKLOADS, FAST, deadline_s=600)
    saved = load_results(path)  # strict load: a valid file
    assert saved.partial
    assert [c.case for c in saved.cases] == ["decode a", "decode a"]  # the peer and sdpa
    assert all(c.status == "PASSED" for c in saved.cases)


def test_bench_step_starts_no_case_past_its_deadline(tmp_path, capsys):
    path = tmp_path / "bench.json"
    entry = BackendEntry("sdpa", SdpaBackend, "test")
    record = bench_step.run_bench_step(path, [entry], WORKLOADS[:1], FAST, deadline_s=0.0)
    assert record is None
    assert "out of time: 3 cases not started" in capsys.readouterr().out
    assert not path.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_bench_step_without_cuda_says_so(tmp_path, capsys):
    code = bench_step.bench_main(
        [
            str(tmp_path / "b.json"),
            "--workload",
            "decode-sweep",
            "--backend",
            "sdpa",
            "--deadline",
            "9",
        ]
    )
    assert code == 2
    assert "no CUDA device" in capsys.readouterr().out


def test_summary_is_built_from_whatever_files_exist(tmp_path, capsys):
    entry = BackendEntry("sdpa", SdpaBackend, "test")
    bench_step.run_bench_step(
        tmp_path / "bench-cuda.json", [entry], [WORKLOADS[1]], FAST, deadline_s=600
    )
    capsys.readouterr()
    (tmp_path / "graph-check.json").write_text(
        json.dumps({"backends": [{"backend": "sdpa", "status": "PASS", "reason": "2 shapes"}]})
    )
    (tmp_path / "conformance-sdpa.xml").write_text(
        '<testsuites><testsuite><testcase name="t"><properties>'
        '<property name="backend" value="sdpa"/></properties></testcase>'
        '<testcase name="u"><properties><property name="backend" value="sdpa"/>'
        '</properties><failure message="x"/></testcase></testsuite></testsuites>'
    )
    conformance = [("sdpa", StepResult("conformance-sdpa", 124, 50.0, 50.0))]
    steps = [StepResult("graph-check", 1, 3.0, 60.0), StepResult("bench", None, note="out of time")]
    text = gpu_check.summary(
        tmp_path, "env line", ["skip flex: not registered"], conformance, steps, "ci"
    )
    assert "sdpa: stopped at its 50 s limit" in text
    assert "passed   1  failed   1" in text
    assert "PASS sdpa: 2 shapes" in text
    assert "prefill a" in text  # the bench table, from the results file
    assert text.splitlines()[-1].startswith("bench ")  # the short table is last
    assert "not run (out of time)" in text.splitlines()[-1]


def test_a_cpu_rehearsal_points_every_step_at_the_cpu(tmp_path):
    """``--device cpu`` runs the same steps on the CPU, before a lease is spent on them."""
    run = gpu_check.ConformanceRun("sdpa", "sdpa", "kill", device="cpu")
    command = run.command(tmp_path)
    assert command[command.index("--conformance-device") + 1] == "cpu"
    bench = bench_step.bench_command(tmp_path, ["sdpa"], ["decode-sweep"], 60.0, "cpu")
    assert str(tmp_path / "bench-cpu.json") in bench
    assert bench[bench.index("--device") + 1] == "cpu"
    assert gpu_check.conformance_runs(["sdpa"], "kill", False, "cpu") == [run]
    text = gpu_check.summary(
        tmp_path, "env", [], [], [StepResult("graph-check", 0, 1.0, 9.0)] * 2, "kill", "cpu"
    )
    assert "graph-mode check (cpu)" in text
    assert "bench (cpu)" in text


def test_the_summary_says_when_the_bench_file_is_partial(tmp_path):
    entry = BackendEntry("sdpa", SdpaBackend, "test")
    path = tmp_path / "bench-cuda.json"
    bench_step.run_bench_step(path, [entry], [WORKLOADS[1]], FAST, deadline_s=600)
    assert "PARTIAL" not in gpu_check._bench_text(path)
    record = load_results(path)
    record.partial = True
    save_results(record, path)
    assert gpu_check._bench_text(path).startswith("  PARTIAL: the step stopped")


def test_engine_kernels_join_the_default_run_only_where_installed(monkeypatch):
    from reference_backends.engine_backend import EngineKernelBackend

    monkeypatch.setattr(EngineKernelBackend, "installed", classmethod(lambda cls: False))
    assert gpu_check.default_backends() == list(gpu_check.DEFAULT_BACKENDS)
    monkeypatch.setattr(EngineKernelBackend, "installed", classmethod(lambda cls: True))
    assert gpu_check.default_backends()[-2:] == ["sglang-triton", "vllm-triton"]


def test_conformance_spreads_over_workers_in_collection_order(tmp_path, monkeypatch):
    spread = gpu_check.conformance_command(tmp_path, "sdpa", "ci", workers=3)
    assert spread[spread.index("-n") + 1] == "3"
    assert spread[spread.index("--dist") + 1] == "load"  # production shapes still first
    assert "-n" not in gpu_check.conformance_command(tmp_path, "sdpa", "ci")
    monkeypatch.setattr("harness.bench.environment.usable_cpus", lambda: 16)
    assert gpu_check.conformance_workers() == gpu_check.GPU_CONFORMANCE_WORKERS
    monkeypatch.setattr("harness.bench.environment.usable_cpus", lambda: 1)
    assert gpu_check.conformance_workers() == 1


def test_with_a_pair_revision_each_backend_is_paired_after_the_bench(tmp_path, capsys, monkeypatch):
    """``--pair-rev``: one ``attn-harness ab`` step per backend, last, within its own limit,
    the total grown by that limit (the other steps keep theirs)."""
    from harness.gpu.pair_step import PAIR_LAST_ROUND_S, PAIR_LIMIT_S

    started, _ = _simulated_run(monkeypatch, tmp_path, ["--pair-rev", "HEAD~1"], overrun=False)
    limits = gpu_check.FULL_LIMITS
    assert [(name, limit) for name, limit, _ in started] == [
        ("conformance-sdpa", limits.conformance),
        ("graph-check", limits.graph),
        ("bench", limits.bench),
        ("pair-sdpa", PAIR_LIMIT_S),
    ]
    assert "pair-sdpa (cpu): stopped at its" in capsys.readouterr().out
    command = gpu_check.pair_command(tmp_path, "sdpa", "sdpa", "HEAD~1", PAIR_LIMIT_S, "cuda")
    assert command[command.index("--base-rev") + 1] == "HEAD~1"
    assert command[command.index("--device") + 1] == "cuda"
    budget = float(command[command.index("--time-budget") + 1])
    assert budget == PAIR_LIMIT_S - PAIR_LAST_ROUND_S  # the last round ends inside the limit
    assert str(tmp_path / "pair-sdpa.json") in command


def test_the_summary_says_each_paired_verdict_from_the_document(tmp_path):
    (tmp_path / "pair-triton.json").write_text(
        json.dumps(
            {
                "wall_s": 61.2,
                "cases": [
                    {"key": "decode-sweep@1/ctx=1024", "verdict": "PASS", "detail": "+1%"},
                    {"key": "decode-sweep@1/ctx=8192", "verdict": "FAIL", "detail": "+14.0%"},
                ],
            }
        )
    )
    steps = [
        StepResult("graph-check", 0, 1.0, 9.0),
        StepResult("bench", 0, 1.0, 9.0),
        StepResult("pair-triton", 1, 61.5, 120.0),
        StepResult("pair-sdpa", None, note="out of time"),
    ]
    text = gpu_check.summary(tmp_path, "env", [], [], steps, "ci")
    assert "pair-triton (cuda): exit 1, 62 s" in text
    assert "1 FAIL, 1 PASS over 2 cases, 61 s" in text
    assert "FAIL decode-sweep@1/ctx=8192: +14.0%" in text
    assert "no pair-sdpa.json; see pair-sdpa.log" in text
    assert text.splitlines()[-1].startswith("pair-sdpa ")  # the step table is still last
