"""The figures docs/write-a-backend.md quotes, measured as a reader of the guide gets them.

    python tools/guide_figures.py [--counts-only] [--print-output]

The guide says how many cases ``attn-harness check`` runs on its backend, how
many of them fail with the causal mask aligned top-left, how many tests
``attn-harness conform`` runs, and how long each took. The counts change with
the code and the times with the machine, so they come from this script, not
from memory. It writes the guide's ``my_backend.py`` (the guide's own code
block) and ``top_left.py`` (the same backend, class ``TopLeft``, its mask
``visible.tril()``) into a temporary folder; runs ``python -m harness check``
on both, again on the guide's backend with ``OMP_NUM_THREADS=2``, and
``python -m harness conform`` on it, from that folder; times each; and prints
the figures as one Markdown table with the CPU, its cores, the load and the
date. ``--print-output`` adds what each command printed, for the guide's
example output blocks.

``--counts-only`` prints, in seconds, the counts that need no backend run:
the quick check's cases (from the backend's claim) and the conform tests
(pytest's collection of the suite, with the arguments ``conform`` passes).
tests/test_docs_figures.py checks the guide's counts against them.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a plain checkout, as `python tools/guide_figures.py`

from tools.doc_blocks import doc_files  # noqa: E402

GUIDE = ROOT / "docs" / "write-a-backend.md"
COMMAND = "python tools/guide_figures.py"
GUIDE_FILE, GUIDE_CLASS = "my_backend.py", "MyBackend"
TOP_LEFT_FILE, TOP_LEFT_CLASS = "top_left.py", "TopLeft"
GUIDE_SPEC = f"{GUIDE_FILE}:{GUIDE_CLASS}"
TOP_LEFT_SPEC = f"{TOP_LEFT_FILE}:{TOP_LEFT_CLASS}"
MASK = re.compile(r"visible\.tril\(([^)]*)\)")
BUSY_LOAD = 2.0  # a 1-minute load average above this: the times were measured beside other work
CHECK_ROW = re.compile(r"^(?P<spec>\S+)\s+(?P<passed>\d+)\s+(?P<failed>\d+)\s+(?P<errors>\d+)\s")
CONFORM_TESTS = re.compile(r"\((\d+) tests?\) in (\d+) s$", re.MULTILINE)
COLLECTED = re.compile(r"^(\d+) tests? collected", re.MULTILINE)


def guide_backend() -> str:
    """The guide's ``my_backend.py``, exactly as its code block holds it."""
    files = doc_files(GUIDE)
    if GUIDE_FILE not in files:
        raise ValueError(f"{GUIDE.name} has no Python block starting `# {GUIDE_FILE}`")
    return files[GUIDE_FILE]


def top_left_backend(source: str) -> str:
    """``source`` with its causal mask aligned top-left (``visible.tril()``), as ``TopLeft``."""
    masks = MASK.findall(source)
    if len(masks) != 1 or not masks[0].strip():
        raise ValueError(
            f"{GUIDE_FILE}: expected one bottom-right mask `visible.tril(OFFSET)`, found {masks}"
        )
    renamed = re.sub(rf"\b{GUIDE_CLASS}\b", TOP_LEFT_CLASS, MASK.sub("visible.tril()", source))
    return renamed.replace(f"# {GUIDE_FILE}", f"# {TOP_LEFT_FILE}", 1)


def write_backends(folder: Path) -> dict[str, Path]:
    """The guide's backend and its top-left copy, written into ``folder``: spec -> file."""
    source = guide_backend()
    (folder / GUIDE_FILE).write_text(source)
    (folder / TOP_LEFT_FILE).write_text(top_left_backend(source))
    return {GUIDE_SPEC: folder / GUIDE_FILE, TOP_LEFT_SPEC: folder / TOP_LEFT_FILE}


def quick_case_count(path: Path, cls: str = GUIDE_CLASS) -> int:
    """How many cases ``attn-harness check`` runs on the backend: its claim decides."""
    from harness.conformance.check_matrix import quick_scenarios
    from harness.core.registry import BackendRegistry

    entry = BackendRegistry(autoload=False).resolve(f"{path}:{cls}")
    return sum(1 for _ in quick_scenarios(entry.capabilities))


def reader_env(**extra: str) -> dict[str, str]:
    """The environment of a reader who set nothing: no thread count, no pytest options."""
    unset = ("OMP_NUM_THREADS", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "TRITON_INTERPRET")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["COLUMNS"] = "200"  # the check table unfitted, as in the guide
    return env | extra


def conform_test_count(folder: Path, spec: str = GUIDE_SPEC) -> int:
    """How many tests ``attn-harness conform --backend SPEC`` runs: pytest collects them."""
    from harness.conformance.runner import pytest_arguments

    args = pytest_arguments([spec], "ci", None, pytest_output=True)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "--collect-only", "-q"],
        cwd=folder,
        env=reader_env(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"),
        capture_output=True,
        text=True,
        check=False,
    )
    found = COLLECTED.search(done.stdout)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"collecting the conform tests failed:\n{done.stdout}{done.stderr}")
    return int(found.group(1))


@dataclass(frozen=True)
class Timed:
    """One command as a reader runs it: its line, exit code, output and wall time."""

    line: str
    code: int
    output: str
    seconds: float


def run_timed(args: list[str], folder: Path, env: dict[str, str]) -> Timed:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    return Timed("attn-harness " + " ".join(args), done.returncode, done.stdout, seconds)


def check_counts(run: Timed, spec: str) -> tuple[int, int]:
    """(cases, cases failed or in error) from the table ``check`` printed for ``spec``."""
    for line in run.output.splitlines():
        row = CHECK_ROW.match(line)
        if row and row["spec"] == spec:
            bad = int(row["failed"]) + int(row["errors"])
            return int(row["passed"]) + bad, bad
    raise RuntimeError(f"`{run.line}` printed no row for {spec}:\n{run.output}")


def cpu_model() -> str:
    """The CPU's model name: ``lscpu``'s, else /proc/cpuinfo's, else ``unknown CPU``."""
    try:
        listed = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        listed = ""
    for line in listed.splitlines():
        if line.startswith("Model name:"):
            return " ".join(line.split(":", 1)[1].split())
    with_cpuinfo = Path("/proc/cpuinfo")
    if with_cpuinfo.exists():
        for line in with_cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    return "unknown CPU"


def machine_line(load: float | None) -> str:
    """``COMMAND, DATE, CPU, N cores[, load: measured beside other work]``."""
    parts = [COMMAND, datetime.date.today().isoformat(), cpu_model(), f"{os.cpu_count()} cores"]
    if load is not None:
        busy = ": measured beside other work" if load > BUSY_LOAD else ""
        parts.append(f"load average {load:.1f}{busy}")
    return ", ".join(parts)


def table(rows: list[tuple[str, str]]) -> str:
    return "\n".join(["| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def counts_only(folder: Path) -> str:
    files = write_backends(folder)
    rows = [
        (f"`check` cases, {GUIDE_SPEC}", str(quick_case_count(files[GUIDE_SPEC]))),
        (f"`conform` tests, {GUIDE_SPEC}", str(conform_test_count(folder))),
    ]
    return f"guide counts ({COMMAND} --counts-only)\n\n{table(rows)}"


def measure(folder: Path, print_output: bool) -> tuple[str, bool]:
    """The guide's figures, and whether every command ended as the guide says it does."""
    write_backends(folder)
    load = os.getloadavg()[0]
    check = run_timed(["check", "--backend", GUIDE_SPEC], folder, reader_env())
    two = run_timed(["check", "--backend", GUIDE_SPEC], folder, reader_env(OMP_NUM_THREADS="2"))
    top_left = run_timed(["check", "--backend", TOP_LEFT_SPEC], folder, reader_env())
    conform = run_timed(["conform", "--backend", GUIDE_SPEC], folder, reader_env())
    load = max(load, os.getloadavg()[0])
    cases, failed = check_counts(check, GUIDE_SPEC)
    top_cases, top_failed = check_counts(top_left, TOP_LEFT_SPEC)
    closing = CONFORM_TESTS.search(conform.output)
    tests = closing.group(1) if closing else "?"
    rows = [
        (f"`check` cases, {GUIDE_SPEC}", f"{cases} ({failed} failed)"),
        (f"`check` cases failed, {TOP_LEFT_SPEC}", f"{top_failed} of {top_cases}"),
        (f"`conform` tests, {GUIDE_SPEC}", tests),
        (f"`check` seconds, {GUIDE_SPEC}, one torch thread", f"{check.seconds:.1f}"),
        (f"`check` seconds, {GUIDE_SPEC}, OMP_NUM_THREADS=2", f"{two.seconds:.1f}"),
        (f"`check` seconds, {TOP_LEFT_SPEC}", f"{top_left.seconds:.1f}"),
        (f"`conform` seconds, {GUIDE_SPEC}", f"{conform.seconds:.0f}"),
    ]
    text = f"guide figures ({machine_line(load)})\n\n{table(rows)}"
    if print_output:
        for run in (check, two, top_left, conform):
            text += f"\n\n$ {run.line}  (exit {run.code})\n{run.output.rstrip()}"
    as_guide_says = check.code == 0 and failed == 0 and top_failed > 0 and conform.code == 0
    return text, as_guide_says


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--counts-only",
        action="store_true",
        help="only the counts that need no backend run (quick-check cases, conform tests)",
    )
    parser.add_argument(
        "--print-output", action="store_true", help="also print what each command printed"
    )
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="guide-figures-") as name:
            if args.counts_only:
                print(counts_only(Path(name)))
                return 0
            text, as_guide_says = measure(Path(name), args.print_output)
    except (ValueError, RuntimeError) as exc:
        print(f"guide_figures: error: {exc}", file=sys.stderr)
        return 2
    print(text)
    if not as_guide_says:
        print(
            "guide_figures: a command did not end as the guide says (--print-output shows it)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
