"""Every option of every command refuses a bad value at once: one line, exit 2, nothing written.

The cases are checked against the parsers: every option (and positional)
that takes a value needs a bad-value case here or a reason in ``EXEMPT``, so
a new option without one fails ``test_every_option_has_a_bad_value_case``.
Each command runs in-process (``harness.cli.main.main``) in an empty folder,
with stdout and stderr captured at the file-descriptor level.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import harness.core.registry as registry
from harness.cli.main import build_parser, main
from harness.core.exit_codes import EXIT_USAGE
from harness.core.registry import BackendRegistry

ROOT = Path(__file__).resolve().parents[1]
RESULTS = str(ROOT / "tests" / "data" / "gate" / "bench-small.json")
BASELINE = str(ROOT / "reports" / "baselines" / "cpu-amd-epyc-2cpu" / "baseline.json")
BLOCKER = "blocker"
"""A plain file the test folder holds: an output path below it cannot be made."""

LIMIT_S = 3.0
"""Wall time for one refused command line: it must not start any work."""


@dataclass(frozen=True)
class Case:
    """One bad value: the command line, the value, what else the message must name."""

    command: str
    option: str  # as the parser names it: "--out", or a positional's metavar ("RESULTS")
    argv: tuple[str, ...]
    value: str
    also: tuple[str, ...] = ()  # the valid choices, where there is a list


def case(command: str, option: str, value: str, *rest: str, also: tuple[str, ...] = ()) -> Case:
    """``attn-harness COMMAND [rest...] OPTION VALUE`` (a positional: just the value)."""
    flag = () if option.isupper() or option == "--" else (option,)
    return Case(command, option, (command, *rest, *flag, value), value, also)


DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "float16", "bfloat16")
PROFILES = ("ci", "thorough", "kill")
DIST = ("--dp-size", "2", "--backend", "sdpa")
DIST_BENCH = ("--backend", "sdpa", "--out", "scaling.json")
GATE = ("--baseline", BASELINE, RESULTS)
AB = ("--base", "sdpa")

CASES = [
    case("list", "--backend", "nope", also=("reference", "sdpa")),
    case("check", "--backend", "nope", also=("reference", "sdpa")),
    case("conform", "--backend", "no_such_module:Thing"),
    case("conform", "--profile", "fast", also=PROFILES),
    case("conform", "--device", "tpu", also=DEVICES),
    case("conform", "--junitxml", f"{BLOCKER}/conform.xml"),
    case("conform", "--replay", "test_x@6.1:"),
    case("conform", "--workers", "0"),
    case("conform", "--shard", "3/2", "--junitxml", "c.xml"),
    case("conform", "--", "--no-such-option", "--backend", "reference", "--"),
    case("bench", "--backend", "nope"),
    case("bench", "--workload", "decode-swep", also=("decode-sweep", "prefill-sweep")),
    case("bench", "--device", "tpu", also=DEVICES),
    case("bench", "--size", "huge", also=("cpu", "gpu")),
    case("bench", "--dtype", "float64", also=("float32", "bfloat16")),
    case("bench", "--out", f"{BLOCKER}/bench.json"),
    case("bench", "--threads", "0"),
    case("bench", "--budget", "0"),
    case("bench", "--min-samples", "0"),
    case("bench", "--max-samples", "-3"),
    case("bench", "--max-samples", "6", "--min-samples", "10"),
    case("bench", "--target-ci", "nan"),
    case("bench", "--timeout", "-1"),
    case("bench", "--shard", "0/2"),
    case("run", "--backend", "nope"),
    case("run", "--out", f"{BLOCKER}/run"),
    case("run", "--device", "tpu", also=DEVICES),
    case("run", "--profile", "fast", also=PROFILES),
    case("run", "--workers", "0"),  # as conform: 0 is not "auto", it is refused
    case("run", "--workload", "decode-swep", also=("decode-sweep",)),
    case("run", "--shard", "half"),
    case("report", "RESULTS", "missing.json", "--out", "report"),
    case("report", "--out", BLOCKER, RESULTS),
    case("gate", "RESULTS", "missing.json", "--baseline", BASELINE),
    case("gate", "--baseline", "missing.json", RESULTS),
    case("gate", "--threshold", "0", *GATE),
    case("gate", "--junitxml", f"{BLOCKER}/gate.xml", *GATE),
    case("gate", "--match", "renamed", *GATE),
    case("ab", "--base", "nope"),
    case("ab", "--candidate", "nope", *AB),
    case("ab", "--base-rev", "no-such-revision", *AB),
    case("ab", "--candidate-rev", "no-such-revision", *AB),
    case("ab", "--workload", "decode-swep", *AB, also=("decode-sweep",)),
    case("ab", "--case", "no-such-case", *AB),
    case("ab", "--threshold", "0", *AB),
    case("ab", "--alpha", "0.7", *AB),
    case("ab", "--beta", "-1", *AB),
    case("ab", "--min-rounds", "2", *AB),
    case("ab", "--max-rounds", "4", *AB),
    case("ab", "--samples", "3", *AB),
    case("ab", "--time-budget", "0", *AB),
    case("ab", "--device", "tpu", *AB, also=DEVICES),
    case("ab", "--size", "huge", *AB, also=("cpu", "gpu")),
    case("ab", "--threads", "0", *AB),
    case("ab", "--cpus", "3-1", *AB),
    case("ab", "--cpus", "4096", *AB),
    case("ab", "--cpus", "0", "--threads", "2", *AB),
    case("ab", "--out", f"{BLOCKER}/ab.json", *AB),
    case("ab", "--junitxml", f"{BLOCKER}/ab.xml", *AB),
    case("baseline", "RESULTS", "missing.json"),
    case("baseline", "--out", f"{BLOCKER}/baseline.json", RESULTS, RESULTS, RESULTS),
    case("dist", "--dp-size", "0", "--backend", "sdpa"),
    case("dist", "--backend", "nope", "--dp-size", "2"),
    case("dist", "--steps", "0", *DIST),
    case("dist", "--timeout", "0", *DIST),
    case("dist", "--seed", "x", *DIST),
    case("dist", "--dtype", "float8", *DIST, also=DTYPES),
    case("dist", "--device", "tpu", *DIST, also=DEVICES),
    case("dist", "--dist-backend", "mpi", *DIST, also=("gloo", "nccl")),
    case("dist", "--json", f"{BLOCKER}/dist.json", *DIST),
    case("dist", "--inject", "boom", *DIST, also=("raise", "hang", "kill")),
    case("dist", "--inject", "raise@2:1", *DIST),  # a rank the group does not have
    case("dist", "--nnodes", "0", *DIST),
    case("dist", "--node-rank", "-1", *DIST),
    case("dist", "--master", "head-node", *DIST),
    case("merge", "--out", f"{BLOCKER}/merged.json", RESULTS),
    case("merge", "SHARD", "missing.xml", "--out", "merged.xml"),
    case("dist-bench", "--backend", "nope", "--out", "scaling.json"),
    case("dist-bench", "--dp-sizes", "0-2", *DIST_BENCH),
    case("dist-bench", "--sequences", "0", *DIST_BENCH),
    case("dist-bench", "--context", "0", *DIST_BENCH),
    case("dist-bench", "--steps", "4", *DIST_BENCH),
    case("dist-bench", "--warmup", "-1", *DIST_BENCH),
    case("dist-bench", "--dtype", "float8", *DIST_BENCH, also=DTYPES),
    case("dist-bench", "--device", "tpu", *DIST_BENCH, also=DEVICES),
    case("dist-bench", "--timeout", "0", *DIST_BENCH),
    case("dist-bench", "--out", f"{BLOCKER}/scaling.json", "--backend", "sdpa"),
]

EXEMPT = {
    ("report", "--title"): "free text: any heading is a valid one",
}
"""Options that take a value but have no bad one, and why."""


def _cuda_cases() -> list[Case]:
    """``--device cuda`` where torch sees no GPU: refused before any worker starts."""
    import torch

    if torch.cuda.is_available():
        return []
    return [
        case(command, "--device", "cuda", *rest)
        for command, rest in [
            ("conform", ()),
            ("bench", ()),
            ("run", ()),
            ("ab", AB),
            ("dist", DIST),
            ("dist-bench", DIST_BENCH),
        ]
    ]


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _name(action: argparse.Action) -> str:
    if action.option_strings:
        return max(action.option_strings, key=len)
    if action.nargs == argparse.REMAINDER:
        return "--"  # what follows -- goes to pytest
    return str(action.metavar or action.dest)


def options_taking_values() -> set[tuple[str, str]]:
    """Every (command, option) whose option or positional takes a value, from the parsers."""
    return {
        (command, _name(action))
        for command, parser in _subcommands().items()
        for action in parser._actions
        if action.nargs != 0 and not isinstance(action, argparse._HelpAction)
    }


def test_every_option_has_a_bad_value_case() -> None:
    wanted = options_taking_values() - set(EXEMPT)
    covered = {(c.command, c.option) for c in CASES}
    assert not wanted - covered, f"options without a bad-value case: {sorted(wanted - covered)}"
    assert not covered - options_taking_values(), "cases for options that are not there"
    assert set(EXEMPT) <= options_taking_values()
    assert len(wanted) >= 50  # the walk found the parsers' options, not nothing


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture
def in_empty_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder holding only the blocker file; a fresh registry, no entry points."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "entry_points", lambda *, group: [])
    monkeypatch.setattr(registry, "_DEFAULT", BackendRegistry())
    (tmp_path / BLOCKER).write_text("")
    return tmp_path


@pytest.fixture(scope="module", autouse=True)
def _torch_loaded() -> None:
    """torch imported once: the time limit is for the command, not the interpreter's first
    import of torch (which every fresh ``attn-harness`` process pays, refusals included)."""
    import torch  # noqa: F401


@pytest.mark.parametrize(
    "bad", [*CASES, *_cuda_cases()], ids=lambda c: f"{c.command} {c.option} {c.value}"
)
def test_a_bad_value_is_one_line_exit_2_nothing_written_at_once(
    bad: Case, in_empty_folder: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    before = _tree(in_empty_folder)
    started = time.perf_counter()
    code = main(list(bad.argv))
    seconds = time.perf_counter() - started
    out, err = capfd.readouterr()
    assert code == EXIT_USAGE, (out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    (line,) = lines
    assert line.startswith(f"attn-harness {bad.command}: error: "), line
    assert bad.value in line, line
    if bad.option != "--":
        assert bad.option in line, line
    for choice in bad.also:
        assert choice in line, line
    assert _tree(in_empty_folder) == before
    assert seconds < LIMIT_S, f"{seconds:.1f} s to refuse {bad.argv}"


def test_a_good_value_of_the_same_option_gets_past_the_check(
    in_empty_folder: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The cases fail for their bad value: with it fixed the same command line runs."""
    assert main(["bench", "--list-workloads", "--threads", "1"]) == 0
    assert "decode-sweep" in capfd.readouterr().out
    assert main(["gate", "--threshold", "0.5", *GATE]) in (0, 1)
    assert "attn-harness gate:" in capfd.readouterr().out
