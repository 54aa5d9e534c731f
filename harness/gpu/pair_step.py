"""The GPU script's paired step: a backend against another revision of itself, on the GPU.

With ``--pair-rev REV`` (a git revision of the checkout), ``harness.gpu.check``
runs one ``attn-harness ab`` per backend after the benchmarks: the backend at
this checkout against the same backend at ``REV``, on ``PAIR_WORKLOAD`` at
the GPU size, in alternating rounds, under the step's own limit (its
``--time-budget`` ends the rounds ``PAIR_LAST_ROUND_S`` before it). Its
document (``pair-NAME.json``) and JUnit file land in the run's folder, and
the summary says each case's verdict.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

PAIR_WORKLOAD = "decode-sweep"  # the GPU's memory-bound cases: what a kernel change moves most
PAIR_LAST_ROUND_S = 40.0  # the two workers' start and the oracle checks come first
PAIR_LIMIT_S = 120.0  # each backend's step, added to the run's total when asked for


def pair_command(
    out: Path, backend: str, label: str, revision: str, limit: float, device: str
) -> list[str]:
    """The ``attn-harness ab`` command of one backend's paired step."""
    return [
        sys.executable,
        "-m",
        "harness",
        "ab",
        "--base",
        backend,
        "--base-rev",
        revision,
        "--device",
        device,
        "--workload",
        PAIR_WORKLOAD,
        "--time-budget",
        f"{max(limit - PAIR_LAST_ROUND_S, 1.0):.0f}",
        "--no-progress",
        "--out",
        str(out / f"pair-{label}.json"),
        "--junitxml",
        str(out / f"pair-{label}.xml"),
    ]


def pair_lines(path: Path) -> list[str]:
    """The summary's lines for one paired step, read back from its document."""
    if not path.exists():
        return [f"  no {path.name}; see {path.with_suffix('.log').name}"]
    try:
        record = json.loads(path.read_text())
        cases = record["cases"]
    except (ValueError, KeyError, TypeError) as exc:
        return [f"  {path.name} unreadable: {exc}"]
    verdicts = Counter(case["verdict"] for case in cases)
    counts = ", ".join(f"{n} {verdict}" for verdict, n in sorted(verdicts.items()))
    lines = [f"  {counts} over {len(cases)} cases, {record.get('wall_s', 0):.0f} s"]
    for case in cases:
        if case["verdict"] in ("FAIL", "IMPROVED"):
            lines.append(f"    {case['verdict']} {case['key']}: {case.get('detail', '')}")
    return lines
