"""Planted faults, for testing the harness's own failure handling: ``KIND@RANK:STEP``.

``STEP`` counts from 1, as the progress lines and error messages do.

``raise``, ``hang`` and ``kill`` strike inside the step's ``forward`` phase;
``count-length``, ``negative-count`` and ``overclaim`` corrupt the rank's DP
metadata in that step's token-count exchange.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

from harness.dist.coordination import CountReport

KINDS = ("raise", "hang", "kill", "count-length", "negative-count", "overclaim")
_PATTERN = re.compile(r"^(?P<kind>[a-z-]+)@(?P<rank>\d+):(?P<step>\d+)$")


class PlantedFault(RuntimeError):
    """The error a ``raise`` fault throws."""


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int

    @classmethod
    def parse(cls, text: str) -> Fault:
        match = _PATTERN.match(text.strip())
        if not match or match["kind"] not in KINDS:
            raise ValueError(
                f"fault {text!r} is not KIND@RANK:STEP with KIND one of {', '.join(KINDS)}"
            )
        return cls(match["kind"], int(match["rank"]), int(match["step"]))

    def __str__(self) -> str:
        return f"{self.kind}@{self.rank}:{self.step}"


def _matching(faults: Sequence[Fault], rank: int, step: int, kinds: tuple[str, ...]) -> list[Fault]:
    return [f for f in faults if f.rank == rank and f.step == step and f.kind in kinds]


def strike(faults: Sequence[Fault], rank: int, step: int) -> None:
    """Fire this rank's ``raise``, ``hang`` or ``kill`` fault planted at ``step``."""
    for fault in _matching(faults, rank, step, ("raise", "hang", "kill")):
        if fault.kind == "raise":
            raise PlantedFault(f"planted fault {fault}")
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # hang: never return, never raise
            time.sleep(3600)


def corrupt(faults: Sequence[Fault], report: CountReport, step: int) -> CountReport:
    """The rank's count report with any metadata fault planted at ``step`` applied."""
    kinds = ("count-length", "negative-count", "overclaim")
    for fault in _matching(faults, report.rank, step, kinds):
        counts = list(report.counts)
        if fault.kind == "count-length":
            counts.append(0)
        elif fault.kind == "negative-count":
            counts[report.rank] = -1
        else:
            counts[report.rank] = report.actual + 1
        report = CountReport(report.rank, tuple(counts), report.actual)
    return report
