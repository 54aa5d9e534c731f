"""How often ``attn-harness ab`` FAILs unchanged code, and how often it catches a planted slowdown.

    python tools/ab_error_rates.py --runs 20 --slowdown 0 --slowdown 0.10 \\
        [--runs-for 0.05=10] [--threshold 0.10] [--out-dir DIR] [-- AB_ARGS]

Each run is one ``attn-harness ab`` process: ``sdpa`` against itself for a
slowdown of 0 (A/A), else against ``suites/mutants/slowdown.py:SlowedSdpa``
with ``ATTN_HARNESS_SLOWDOWN`` set (A/B: the candidate's forward made that
fraction slower, outputs unchanged). Prints, per slowdown, how many runs
FAILed (any case FAIL), the verdict counts over all cases, the rounds the
sequential test needed per case, and the wall time per run, as a Markdown
table. Arguments after ``--`` go to every ``attn-harness ab`` run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

SLOWED = "suites/mutants/slowdown.py:SlowedSdpa"
VERDICTS = ("FAIL", "INCONCLUSIVE", "PASS", "IMPROVED")


def one_run(slowdown: float, threshold: float, out: Path, extra: Sequence[str]) -> dict:
    command = [sys.executable, "-m", "harness", "ab", "--base", "sdpa", "--no-progress"]
    if slowdown > 0:
        command += ["--candidate", SLOWED]
    command += ["--threshold", str(threshold), "--out", str(out), *extra]
    env = {**os.environ, "ATTN_HARNESS_SLOWDOWN": str(slowdown)}
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if done.returncode not in (0, 1) or not out.exists():
        raise SystemExit(f"ab run failed ({done.returncode}):\n{done.stderr[-2000:]}")
    record = json.loads(out.read_text())
    cases = record["cases"]
    return {
        "failed": done.returncode == 1,
        "verdicts": Counter(c["verdict"] for c in cases),
        "rounds": [len(c["rounds"]) for c in cases if c["rounds"]],
        "wall_s": wall,
        "fail_cases": [c["key"] for c in cases if c["verdict"] == "FAIL"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--slowdown", type=float, action="append", default=[])
    parser.add_argument(
        "--runs-for", action="append", default=[], metavar="SLOWDOWN=N", help="runs per slowdown"
    )
    parser.add_argument("--threshold", type=float, default=0.10)
    parser.add_argument("--out-dir", type=Path, default=None, help="keep every run's document")
    parser.add_argument("ab_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    extra = [a for a in args.ab_args if a != "--"]
    runs_for = {float(k): int(v) for k, v in (item.split("=") for item in args.runs_for)}
    folder = args.out_dir or Path(tempfile.mkdtemp(prefix="ab-error-rates-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"threshold {args.threshold:.0%}; ab arguments: {' '.join(extra) or '(defaults)'}")
    print("| slowdown | runs | runs FAILed | case verdicts | rounds per case | wall per run |")
    print("|---|---|---|---|---|---|")
    for slowdown in args.slowdown or [0.0]:
        results = []
        for index in range(runs_for.get(slowdown, args.runs)):
            out = folder / f"slow{slowdown:g}-run{index + 1}.json"
            results.append(one_run(slowdown, args.threshold, out, extra))
            failed = results[-1]["fail_cases"]
            said = "FAIL " + ", ".join(failed) if failed else "no FAIL"
            print(
                f"  slowdown {slowdown:g} run {index + 1}: {said}",
                file=sys.stderr,
            )
        counts: Counter[str] = Counter()
        for result in results:
            counts.update(result["verdicts"])
        rounds = [n for r in results for n in r["rounds"]]
        walls = [r["wall_s"] for r in results]
        told = ", ".join(f"{counts[v]} {v}" for v in VERDICTS if counts[v])
        print(
            f"| {slowdown:.0%} | {len(results)} | {sum(r['failed'] for r in results)} | {told} | "
            f"median {statistics.median(rounds):.0f}, max {max(rounds)} | "
            f"median {statistics.median(walls):.0f} s, max {max(walls):.0f} s |",
            flush=True,
        )
    print(f"documents: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
