"""``attn-harness conform`` and the pytest plugin: exit codes, reports, claims, profiles."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.conform import EXIT_FAILED, EXIT_OK, EXIT_USAGE, pytest_arguments

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = "tests/fixtures/conform_backends.py"


def conform(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a subprocess: the suite's modules read the profile at import."""
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


def test_builtin_passes_every_property():
    result = conform("--backend", "sdpa", "--profile", "kill", "--", "-q")
    assert result.returncode == EXIT_OK, result.stdout[-3000:]
    assert " passed" in result.stdout
    assert "failed" not in result.stdout


def test_failing_backend_exits_1_with_scenario_and_replay():
    result = conform(
        "--backend", f"{FIXTURES}:OffByOneScale", "--", "-q", "-k", "test_outputs_match_oracle"
    )
    assert result.returncode == EXIT_FAILED
    out = result.stdout
    assert "outputs match the oracle violated by backend" in out
    assert "scenario: dp " in out  # the shrunk example, in words
    assert "EXCEEDS bound" in out
    assert "replay" in out
    assert f"--backend '{FIXTURES}:OffByOneScale'" in out


def test_constructor_raising_is_a_reported_failure_not_a_traceback_only():
    result = conform(
        "--backend",
        f"{FIXTURES}:ConstructorRaises",
        "--",
        "-q",
        "-k",
        "test_outputs_match_oracle and float32",
    )
    assert result.returncode == EXIT_FAILED
    assert "RuntimeError: cannot build" in result.stdout
    assert "1 failed" in result.stdout


def test_nothing_checkable_on_this_device_fails_and_says_so():
    result = conform("--backend", f"{FIXTURES}:CudaOnly")
    assert result.returncode == EXIT_FAILED
    assert "nothing could be checked for backend" in result.stdout


def test_backend_refusing_everything_fails():
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


def test_examples_option_and_the_coverage_json_next_to_the_junit_report(tmp_path):
    junit = tmp_path / "conform.xml"
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
    header = "coverage of 'reference': 6 examples held in 1 test functions, 6 rank-steps"
    assert header in result.stdout
    data = json.loads((tmp_path / "conform.coverage.json").read_text())
    reference = data["backends"]["reference"]
    assert reference["examples_by_test"] == {"test_outputs_match_oracle": 6}
    assert reference["dimensions"]["dtype"] == {"float32": 2, "float16": 2, "bfloat16": 2}
    assert reference["never_checked"] == []  # a partial run reports; it does not require
    assert reference["coverage_required"] is False
    assert data["examples_per_test"] == 6
    assert "--examples 6, fewer than the ci profile's 100" in result.stdout
    names = {p.get("name") for p in ET.parse(junit).iter("property")}
    assert "coverage[reference].dtype" in names


def test_narrow_claim_is_respected():
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
    """`pytest --pyargs suites.conformance --backend SPEC` runs the same suite."""
    result = run_pytest(
        "-q",
        "--backend",
        f"{FIXTURES}:OffByOneScale",
        "-k",
        "test_second_run_is_bit_identical or (test_outputs_match_oracle and float32)",
    )
    assert result.returncode == 1
    assert "1 failed, 1 passed" in result.stdout


def test_pytest_usage_error_for_a_bad_spec():
    result = run_pytest("--backend", "nope:Nope")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR
    assert "--backend nope:Nope" in result.stderr


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--examples", "0"], "--examples must be >= 1"),
        (["--shrink-time-limit", "0"], "--shrink-time-limit must be > 0"),
    ],
)
def test_pytest_usage_error_for_bad_budgets(option, message):
    result = run_pytest(*option)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr


def test_shrink_time_limit_sets_hypothesis_budget(monkeypatch):
    from hypothesis.internal.conjecture import engine

    import attn_harness_pytest

    monkeypatch.setattr(engine, "MAX_SHRINKING_SECONDS", engine.MAX_SHRINKING_SECONDS)
    attn_harness_pytest._limit_shrinking(12.5)
    assert engine.MAX_SHRINKING_SECONDS == 12.5


def test_pytest_arguments():
    args = pytest_arguments(["a", "b.py:C"], "thorough", "out.xml", ["-x"])
    assert args[args.index("--conformance-profile") + 1] == "thorough"
    assert args.count("--backend") == 2
    assert "--junitxml" in args
    assert args[-1] == "-x"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_device_without_a_gpu_is_a_usage_error():
    result = conform("--backend", "sdpa", "--device", "cuda")
    assert result.returncode == EXIT_USAGE
    assert "no CUDA device" in result.stderr


def test_a_hang_on_a_production_shape_fails_within_the_example_time_limit():
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


def test_replay_of_a_production_failure_names_its_regime():
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
    assert "-k 'test_production_shapes_match_oracle and many-sequences'" in result.stdout
