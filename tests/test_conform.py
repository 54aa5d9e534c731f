"""``attn-harness conform`` and the pytest plugin: exit codes, reports, claims, profiles."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from harness.cli.main import main
from harness.conformance.report import printed_replay
from harness.conformance.runner import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    pytest_arguments,
    wants_pytest_output,
)

pytestmark = pytest.mark.integration  # real processes: `nox -s integration`

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = "tests/fixtures/conform_backends.py"


def conform_subprocess(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh interpreter: for what only a process boundary shows."""
    return subprocess.run(
        [sys.executable, "-m", "harness", "conform", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def run_pytest(*args: str) -> subprocess.CompletedProcess[str]:
    """The suite under plain pytest with the plugin, as a user without the CLI runs it."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "suites.conformance",
        "-p",
        "attn_harness_pytest",
        "-p",
        "no:cacheprovider",
        *args,
    ]
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )


def test_a_passing_run_prints_header_table_and_verdict_only(conform):
    """The whole suite passing every built-in is tests/test_mutants.py's (the kill profile)."""
    result = conform(
        "--backend",
        "sdpa",
        "--profile",
        "kill",
        "--",
        "-k",
        "test_outputs_match_oracle or test_second_run_is_bit_identical",
    )
    assert result.returncode == EXIT_OK, result.stdout[-3000:]
    out = result.stdout
    assert out.startswith("attn-harness conform: sdpa · 2 properties")
    assert "PASSED: every property held for sdpa" in out.splitlines()[-1]
    table = out[out.index("property ") :]
    assert "test_outputs_match_oracle" in table
    assert "passed (" in table
    assert "FAILED" not in out
    assert "site-packages" not in out
    progress = [line for line in out.splitlines() if line.startswith("[")]
    assert all(PROGRESS.match(line) for line in progress), progress  # only progress lines


PROGRESS = re.compile(r"\[ *\d+ s\] [^:]+: \d+/\d+ tests done")


def test_without_a_terminal_progress_lines_say_tests_done_and_what_runs(conform):
    result = conform(
        "--backend", "reference", "--", "-k", "test_outputs_match_oracle", "--progress-every", "0.2"
    )
    assert result.returncode == EXIT_OK, result.stdout[-2000:]
    progress = [line for line in result.stdout.splitlines() if PROGRESS.match(line)]
    assert progress, result.stdout[-2000:]
    assert all("reference: " in line and "/3 tests done" in line for line in progress)
    assert any("(now test_outputs_match_oracle[" in line for line in progress)


def test_failing_backend_exits_1_with_scenario_error_and_a_replay_that_reruns_it(conform):
    result = conform(
        "--backend",
        f"{FIXTURES}:OffByOneScale",
        "--",
        "-k",
        "test_outputs_match_oracle and float32",
    )
    assert result.returncode == EXIT_FAILED
    out = result.stdout
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("FAILED "))
    entry = lines[start]  # a log keeps whole lines
    assert f"FAILED {FIXTURES}:OffByOneScale · test_outputs_match_oracle[float32]: " in entry
    assert "EXCEEDS bound" in entry  # the error against the bound
    assert "scenario: dp " in out  # the shrunk example, in words
    assert "Traceback" not in out
    assert "reproduce_failure" not in out
    assert "def " not in out  # no harness source lines
    assert len(out.splitlines()) < 25
    command = printed_replay(out)
    assert command[:3] == [sys.executable, "-m", "harness"]
    assert "@" in command[command.index("--replay") + 1]
    assert command[3] == "conform"
    again = conform(*command[4:])  # the printed command, run as printed (in this process)
    assert again.returncode == EXIT_FAILED
    assert "1 test" in again.stdout.splitlines()[0]  # exactly the failing test
    assert lines[start] in again.stdout  # the same example fails the same way
    assert "EXCEEDS bound" in again.stdout


def test_replay_that_no_longer_fails_says_so(conform):
    failing = conform("--backend", f"{FIXTURES}:OffByOneScale", "--", "-k", "oracle and float32")
    token = printed_replay(failing.stdout)[-1]
    fixed = token.replace(f"{FIXTURES}:OffByOneScale", "reference")
    result = conform("--backend", "reference", "--replay", fixed)
    assert result.returncode == EXIT_OK, result.stdout[-2000:]
    last = result.stdout.splitlines()[-1]
    assert "PASSED: the replayed example of test_outputs_match_oracle" in last
    assert "passes now (the fix held)" in last
    assert "DidNotReproduce" not in result.stdout


def test_replay_whose_data_no_longer_fits_the_test_still_fails(conform):
    """A blob the test cannot draw its example from (a changed strategy) is no pass."""
    from hypothesis import __version__
    from hypothesis.core import encode_failure

    empty = encode_failure(()).decode()  # no choices: the first draw runs out of data
    token = f"test_outputs_match_oracle[reference-float32]@{__version__}:{empty}"
    result = conform("--backend", "reference", "--replay", token)
    assert result.returncode == EXIT_FAILED, result.stdout[-2000:]
    assert "the fix held" not in result.stdout
    assert "The shape of the test data has changed" in result.stdout


def test_bad_replay_values_are_usage_errors(conform):
    result = conform("--backend", "reference", "--replay", "test_nope[reference]")
    assert result.returncode == EXIT_USAGE
    assert "no conformance test named 'test_nope[reference]'" in result.stderr
    assert "TEST@VERSION:BLOB" in result.stderr  # the form it takes
    assert result.stdout == ""  # no header, no verdict
    result = conform("--backend", "reference", "--replay", "test_x@6.1:")
    assert result.returncode == EXIT_USAGE
    assert "--replay expects TEST@VERSION:BLOB" in result.stderr


def test_constructor_raising_is_one_clear_line(conform):
    result = conform("--backend", f"{FIXTURES}:ConstructorRaises")
    assert result.returncode == EXIT_FAILED
    assert "cannot be built with valid arguments" in result.stderr
    assert "RuntimeError: cannot build" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_pytest_output_on_request(conform):
    result = conform(
        "--backend", "reference", "-v", "--", "-k", "test_second_run", "--examples", "3"
    )
    assert result.returncode == EXIT_OK, result.stdout[-3000:]
    assert "PASSED" in result.stdout  # pytest's own per-test lines
    assert "coverage of 'reference'" in result.stdout
    assert "dtype " in result.stdout  # the full coverage table
    assert "test_second_run_is_bit_identical  passed (3 ex)" in result.stdout


def test_isolated_from_the_callers_pytest_setup(tmp_path):
    """A project's addopts, conftest.py, PYTEST_ADDOPTS and cwd do not reach the suite."""
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "--cov=x"\n')
    (tmp_path / "conftest.py").write_text("raise RuntimeError('the caller conftest ran')\n")
    env = {**os.environ, "PYTEST_ADDOPTS": "--no-such-option", "PYTHONPATH": str(ROOT)}
    env.pop("HYPOTHESIS_STORAGE_DIRECTORY", None)
    env["ATTN_HARNESS_CACHE"] = str(tmp_path / "cache")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "conform",
            "--backend",
            "reference",
            "--",
            "-k",
            "test_second_run",
            "--examples",
            "2",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == EXIT_OK, result.stdout[-2000:] + result.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "conftest.py", "pyproject.toml"]


def test_unknown_pytest_option_is_one_line_exit_2(conform):
    result = conform("--backend", "reference", "--", "--no-such-option")
    assert result.returncode == EXIT_USAGE
    assert result.stderr.strip().splitlines() == [
        "attn-harness conform: error: unrecognized arguments: --no-such-option "
        "(arguments after -- go to pytest)"
    ]


def test_interrupted_run_exits_130_and_writes_no_report(tmp_path, conform):
    junit = tmp_path / "out" / "conform.xml"
    junit.parent.mkdir()
    result = conform(
        "--backend",
        f"{FIXTURES}:InterruptedMidRun",
        "--junitxml",
        str(junit),
        "--",
        "-k",
        "test_second_run",
    )
    assert result.returncode == EXIT_INTERRUPTED, result.stdout[-2000:] + result.stderr[-2000:]
    assert "interrupted" in result.stderr
    assert list(junit.parent.iterdir()) == []


def test_a_junit_report_under_a_file_is_a_usage_error(tmp_path, conform):
    (tmp_path / "a-file").write_text("x")
    result = conform("--backend", "reference", "--junitxml", str(tmp_path / "a-file" / "c.xml"))
    assert result.returncode == EXIT_USAGE
    assert "a-file is not a directory" in result.stderr
    assert result.stdout == ""
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]


def test_a_backend_printing_to_stdout_does_not_break_the_report(conform):
    result = conform(
        "--backend",
        f"{FIXTURES}:PrintsToStdout",
        "--profile",
        "kill",
        "--",
        "-k",
        "test_outputs_match_oracle or test_stateful_steps or test_every_rank_matches_oracle",
    )
    assert "3 properties" in result.stdout.splitlines()[0]
    assert result.returncode == EXIT_OK, result.stdout[-2000:]
    assert "preparing a step" not in result.stdout


def test_a_backend_claiming_another_device_is_a_usage_error_naming_it(conform):
    result = conform("--backend", f"{FIXTURES}:CudaOnly")
    assert result.returncode == EXIT_USAGE
    assert "unavailable here: it claims cuda only, not 'cpu'" in result.stderr
    assert result.stdout == ""


def test_an_empty_page_size_claim_checks_nothing_and_fails(conform):
    result = conform("--backend", f"{FIXTURES}:ClaimsNoPageSize")
    assert result.returncode == EXIT_FAILED
    assert "nothing could be checked for backend" in result.stdout
    assert "passed (" not in result.stdout  # nothing drawn outside the claim


def test_backend_refusing_everything_fails(conform):
    result = conform(
        "--backend",
        f"{FIXTURES}:RefusesEverything",
        "--",
        "-q",
        "-k",
        "test_outputs_match_oracle and float32",
    )
    assert result.returncode == EXIT_FAILED
    assert "raised Unsupported for a step inside its declared capabilities" in result.stdout
    assert "this backend supports nothing after all" in result.stdout
    assert "claimed vs drawn: dtype " in result.stdout


def test_examples_option_and_the_coverage_json_next_to_the_junit_report(tmp_path, conform):
    """The README's ``--junitxml out/conform.xml``: a folder not there yet is made."""
    junit = tmp_path / "out" / "conform.xml"
    result = conform(
        "--backend",
        "reference",
        "--junitxml",
        str(junit),
        "--",
        "-q",
        "--examples",
        "6",
        "-k",
        "test_outputs_match_oracle",
    )
    assert result.returncode == EXIT_OK, result.stdout[-3000:]
    header = "coverage of 'reference': 6 examples held, 6 rank-steps"
    assert header in result.stdout
    assert junit.is_file()
    data = json.loads((tmp_path / "out" / "conform.coverage.json").read_text())
    reference = data["backends"]["reference"]
    assert reference["examples_by_test"] == {"test_outputs_match_oracle": 6}
    assert reference["dimensions"]["dtype"] == {"float32": 2, "float16": 2, "bfloat16": 2}
    assert reference["never_checked"] == []  # a partial run reports; it does not require
    assert reference["coverage_required"] is False
    assert data["examples_per_test"] == 6
    assert "--examples 6, fewer than the ci profile's 100" in result.stdout
    names = {p.get("name") for p in ET.parse(junit).iter("property")}
    assert "coverage[reference].dtype" in names


def test_narrow_claim_is_respected(conform):
    result = conform("--backend", f"{FIXTURES}:Float32Only", "--profile", "kill", "--", "-q")
    assert result.returncode == EXIT_OK, result.stdout[-3000:]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "no_such_module:Thing"], "cannot import module 'no_such_module'"),
        (["--backend", "tests/fixtures/missing.py:X"], "does not exist"),
        (["--backend", "unknown-name"], "Unknown attention backend 'unknown-name'"),
        (["--profile", "fast"], "unknown profile 'fast'"),
    ],
)
def test_usage_errors_exit_2_before_running(capsys, args, message):
    assert main(["conform", *args]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_pytest_directly_with_the_plugin():
    """`pytest --pyargs suites.conformance --backend SPEC` runs the same suite, same verdicts."""
    result = run_pytest(
        "-q",
        "--backend",
        f"{FIXTURES}:OffByOneScale",
        "-k",
        "test_second_run_is_bit_identical or (test_outputs_match_oracle and float32)",
    )
    assert result.returncode == 1
    assert "1 failed, 1 passed" in result.stdout
    assert "test_second_run_is_bit_identical  passed (" in result.stdout  # the verdict table
    assert f"FAILED {FIXTURES}:OffByOneScale · test_outputs_match_oracle[float32]" in result.stdout
    replay = printed_replay(result.stdout)
    assert replay[1:5] == ["-m", "pytest", "--pyargs", "suites.conformance"]
    assert "--replay" in replay


def pytest_in_process(capfd: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``run_pytest``'s command line through ``pytest.main`` here: for runs that end
    before collection, without a fresh interpreter's seconds of imports."""
    code = pytest.main(
        ["--pyargs", "suites.conformance", "-p", "attn_harness_pytest", "-p", "no:cacheprovider",
         "-s", *args]
    )  # fmt: skip
    return code, capfd.readouterr().err


def test_pytest_usage_error_for_a_bad_spec(capfd):
    code, err = pytest_in_process(capfd, "--backend", "nope:Nope")
    assert code == pytest.ExitCode.USAGE_ERROR
    assert "--backend nope:Nope" in err


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--examples", "0"], "--examples must be >= 1"),
        (["--shrink-time-limit", "0"], "--shrink-time-limit must be > 0"),
        (["--max-shrinks", "0"], "--max-shrinks must be > 0, got 0"),
    ],
)
def test_pytest_usage_error_for_bad_budgets(capfd, option, message):
    code, err = pytest_in_process(capfd, *option)
    assert code == pytest.ExitCode.USAGE_ERROR
    assert message in err


def test_shrink_time_limit_sets_hypothesis_budget(monkeypatch):
    from hypothesis.internal.conjecture import engine

    import attn_harness_pytest

    monkeypatch.setattr(engine, "MAX_SHRINKING_SECONDS", engine.MAX_SHRINKING_SECONDS)
    attn_harness_pytest._limit_shrinking(12.5)
    assert engine.MAX_SHRINKING_SECONDS == 12.5


def test_max_shrinks_sets_hypothesis_budget(monkeypatch):
    from hypothesis.internal.conjecture import engine

    import attn_harness_pytest

    monkeypatch.setattr(engine, "MAX_SHRINKS", engine.MAX_SHRINKS)
    attn_harness_pytest._limit_shrinks(40)
    assert engine.MAX_SHRINKS == 40


def test_pytest_arguments():
    args = pytest_arguments(["a", "b.py:C"], "thorough", "out.xml", ["-x"])
    assert args[args.index("--conformance-profile") + 1] == "thorough"
    assert args.count("--backend") == 2
    assert "--junitxml" in args
    config = Path(args[args.index("-c") + 1])
    assert config.name == "isolated.ini"  # the suite's own, empty configuration
    assert config.read_text().split("[pytest]", 1)[1].strip() == ""
    assert args[args.index("--conformance-output") + 1] == "compact"
    assert "_hypothesis_pytestplugin" in args  # autoloading is off: hypothesis's own, by name
    assert args[-1] == "-x"


@pytest.mark.parametrize(
    ("extra", "wanted"),
    [([], False), (["-q", "-x"], False), (["-v"], True), (["--tb=long"], True), (["-vv"], True)],
)
def test_pytest_report_when_pytest_arguments_ask_for_it(extra, wanted):
    assert wants_pytest_output(extra) is wanted


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_device_without_a_gpu_is_a_usage_error(conform):
    result = conform("--backend", "sdpa", "--device", "cuda")
    assert result.returncode == EXIT_USAGE
    assert "no CUDA device" in result.stderr


def test_a_hang_on_a_production_shape_fails_within_the_example_time_limit(conform):
    result = conform(
        "--backend",
        f"{FIXTURES}:HangsPastOneSplit",
        "--",
        "-q",
        "-x",
        "--example-time-limit",
        "2",
        "-k",
        "test_production_shapes_match_oracle and split-kv",
    )
    assert result.returncode == EXIT_FAILED, result.stdout[-3000:]
    out = result.stdout
    assert "per-example limit" in out
    assert "ExampleTimeout" in out
    assert "scenario: dp " in out  # the shape that hung, in words


def test_replay_of_a_production_failure_names_its_regime(conform):
    result = conform(
        "--backend",
        "suites.mutants.thresholds:GridCap64",
        "--profile",
        "kill",
        "--",
        "-q",
        "-k",
        "test_production_shapes_match_oracle and many-sequences",
    )
    assert result.returncode == EXIT_FAILED, result.stdout[-3000:]
    assert "test_production_shapes_match_oracle[many-sequences]: " in result.stdout
    assert "many-sequences]@" in result.stdout  # the replay names the regime


def test_cpu_conformance_runs_torch_on_one_thread_unless_omp_says_otherwise():
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    args = [sys.executable, "-m", "harness", "conform", "--backend", "reference"]
    args += ["--workers", "1", "--"]  # the header's count is this process's
    args += ["-k", "test_second_run", "--examples", "1"]
    for env, threads in ((base, 1), ({**base, "OMP_NUM_THREADS": "2"}, 2)):
        result = subprocess.run(
            args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert result.returncode == EXIT_OK, result.stdout[-2000:]
        assert result.stdout.splitlines()[0].endswith(f"· torch threads {threads}")


def test_with_columns_every_line_fits_and_the_replay_still_pastes(conform, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    result = conform(
        "--backend", f"{FIXTURES}:OffByOneScale", "--", "-k", "test_outputs_match_oracle"
    )
    assert result.returncode == EXIT_FAILED
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert any(line.startswith("CAUSE  ") for line in lines)  # three failures: grouped
    command = printed_replay(result.stdout)
    assert command[command.index("--replay") + 1].count("@") == 1


@pytest.mark.parametrize("workers", ["1", "2"])
def test_stop_at_the_first_failure_reports_it_with_any_number_of_workers(
    workers, tmp_path, conform
):
    """``-- -x`` under pytest-xdist once read as a Ctrl-C: exit 130, the failure lost."""
    junit = tmp_path / "conform.xml"
    result = conform(
        "--workers",
        workers,
        "--backend",
        "suites.mutants.backends:TopLeftCausal",
        "--profile",
        "kill",
        "--junitxml",
        str(junit),
        "--",
        "-x",
        "-k",
        "test_outputs_match_oracle or test_every_rank_matches_oracle or test_second_run",
    )
    assert result.returncode == EXIT_FAILED, result.stdout[-2000:] + result.stderr[-2000:]
    assert "interrupted" not in result.stderr
    assert "FAILED suites.mutants.backends:TopLeftCausal · test_" in result.stdout
    assert "replay:" in result.stdout
    assert 'failures="0"' not in junit.read_text()


def test_conform_writes_its_progress_as_data_for_a_parent(tmp_path):
    """One JSON line per test started, in the file ``ATTN_HARNESS_PROGRESS`` names: what
    the main job follows (never the human-readable lines)."""
    from harness.processes.progress_file import PROGRESS_ENV

    path = tmp_path / "progress.jsonl"
    args = [sys.executable, "-m", "harness", "conform", "--backend", "reference"]
    args += [
        "--workers",
        "1",
        "--",
        "-k",
        "test_second_run or test_foreign_slot",
        "--examples",
        "1",
    ]
    env = {**os.environ, PROGRESS_ENV: str(path)}
    result = subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == EXIT_OK, result.stdout[-2000:]
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["done"] for r in records] == list(range(len(records)))
    assert len(records) >= 2
    assert {r["total"] for r in records} == {len(records)}
    assert any(r["label"].startswith("test_second_run") for r in records)
