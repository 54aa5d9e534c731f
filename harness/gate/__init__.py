"""The CI gate: conformance failures, failing cases and performance regressions against a baseline.

``judge`` compares candidate runs with baseline runs case by case (each
case's forward time over its in-run peer's, judged on a bootstrap interval
recomputed from the raw samples); ``make_baseline`` / ``load_baseline`` keep
pooled runs per device class. ``attn-harness gate`` and ``attn-harness
baseline`` are the command-line faces of these.
"""

from harness.gate.baseline import (
    Baseline,
    BaselineError,
    load_baseline,
    make_baseline,
    save_baseline,
)
from harness.gate.compare import DEFAULT_THRESHOLD, Change, RunSamples, compare_case
from harness.gate.device_class import device_class
from harness.gate.verdicts import CaseVerdict, GateReport, judge

__all__ = [
    "DEFAULT_THRESHOLD",
    "Baseline",
    "BaselineError",
    "CaseVerdict",
    "Change",
    "GateReport",
    "RunSamples",
    "compare_case",
    "device_class",
    "judge",
    "load_baseline",
    "make_baseline",
    "save_baseline",
]
