"""The ceiling probe beside busy loops: what one round reports, and what the best of rounds does.

    python tools/probe_under_load.py [--runs 3] [--rounds 2] [--busy 2]

Each run stands for one bench run on a machine that is busy when the run
starts: its first probe round runs beside ``--busy`` loops (``yes >
/dev/null``), which are then killed, and its other rounds run without them
(as ``attn-harness bench``'s later rounds do, after and between the cases).
For each run it prints the first round's float32 matmul and copy figures
(what a single probe reported) and the best over the rounds (what a run
reports now); then, over the runs, the spread of each, ``(best - low) / best``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

import torch

from harness.bench.ceilings import ProbeRound, RunCeilings, probe


def _spread(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low / 1e9:.1f}-{high / 1e9:.1f} ({(high - low) / high:.0%})"


def one_run(rounds: int, busy: int) -> RunCeilings:
    ceilings = RunCeilings(None, None)
    started = time.monotonic()
    for index in range(rounds):
        loops = [
            subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)
            for _ in range(busy if index == 0 else 0)
        ]
        try:
            measured = probe("cpu", dtypes=(torch.float32,))
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()
        when = f"beside {busy} busy loops" if loops else "loops killed"
        ceilings = ceilings.with_round(ProbeRound(when, time.monotonic() - started, measured))
    return ceilings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--busy", type=int, default=2)
    args = parser.parse_args()
    print(
        f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    single: dict[str, list[float]] = {"matmul": [], "copy": []}
    best: dict[str, list[float]] = {"matmul": [], "copy": []}
    for run in range(args.runs):
        c = one_run(args.rounds, args.busy)
        first, measured = c.probes[0].ceilings, c.measured
        assert measured is not None
        single["matmul"].append(first.flops_for("float32") or 0.0)
        single["copy"].append(first.memory_bandwidth or 0.0)
        best["matmul"].append(measured.flops_for("float32") or 0.0)
        best["copy"].append(measured.memory_bandwidth or 0.0)
        rounds = ", ".join(f"{(r.ceilings.flops_for('float32') or 0) / 1e9:.1f}" for r in c.probes)
        print(
            f"run {run + 1}: float32 matmul per round {rounds} GFLOP/s; one round reports "
            f"{single['matmul'][-1] / 1e9:.1f}, the best of {args.rounds} "
            f"{best['matmul'][-1] / 1e9:.1f}; copy {single['copy'][-1] / 1e9:.2f} -> "
            f"{best['copy'][-1] / 1e9:.2f} GB/s",
            flush=True,
        )
    print(
        f"over {args.runs} runs, one round: matmul {_spread(single['matmul'])} GFLOP/s, "
        f"copy {_spread(single['copy'])} GB/s"
    )
    print(
        f"over {args.runs} runs, best of {args.rounds}: matmul {_spread(best['matmul'])} "
        f"GFLOP/s, copy {_spread(best['copy'])} GB/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
