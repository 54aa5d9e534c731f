"""How often the gate fails runs that changed nothing: each run gated alone against a baseline.

    python tools/gate_false_alarms.py \\
        --baseline reports/baselines/cpu-amd-epyc-2cpu/baseline.json \\
        fresh/run*.json [--threshold 0.10 --threshold 0.15] [--group 3]

Prints, per threshold, each candidate's verdict counts and the cases that
failed, then the false-alarm rate (candidates failed / candidates). A
candidate is one run, or with ``--group N`` every combination of N runs
pooled (as ``nox -s gate`` pools three). Give it runs of unchanged code made
on the baseline's machine (``attn-harness bench --out runN.json``, one
process each): any FAIL among them is a false alarm.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence

from harness.gate import judge, load_baseline
from harness.results.store import load_results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("runs", nargs="+", help="results files of unchanged code")
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--threshold", type=float, action="append", default=[])
    parser.add_argument("--group", type=int, default=1, help="runs pooled per candidate")
    args = parser.parse_args(argv)
    baseline = load_baseline(args.baseline)
    runs = [(path, load_results(path)) for path in args.runs]
    candidates = list(itertools.combinations(runs, args.group))
    for threshold in args.threshold or [0.10]:
        failed = 0
        print(f"threshold {threshold:.0%}:")
        for group in candidates:
            report = judge([run for _, run in group], baseline.runs, threshold=threshold)
            counts = {v: report.count(v) for v in ("FAIL", "INCONCLUSIVE", "PASS", "IMPROVED")}
            failed += report.failed
            if args.group == 1 or report.failed:
                print(f"  {' + '.join(path for path, _ in group)}: {counts}")
            for case in report.cases:
                if case.verdict == "FAIL":
                    print(f"    FAIL {case.key} ({case.detail})")
        print(f"  false alarms: {failed} of {len(candidates)} candidates\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
