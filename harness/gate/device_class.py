"""The device class of a run: which runs' timings may be compared at all.

Ratios to the in-run peer cancel a machine's drift, not a different
machine: a kernel's speed relative to SDPA depends on the CPU's vector units
or the GPU's generation. So a baseline is kept per device class, and the
gate refuses one from another class unless forced.

The class is the device kind, the device's model name and, on the CPU, the
number of CPUs the run could use (the peer and the backends use them
differently), e.g. ``cpu-amd-epyc-2cpu`` or ``cuda-nvidia-h200``.
"""

from __future__ import annotations

import re
from typing import Any


def slug(text: str) -> str:
    """Lower-case letters, digits and single dashes: safe as a folder name."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def device_class(environment: dict[str, Any]) -> str:
    """The class of the device a run's environment describes."""
    device = str(environment.get("device") or "unknown")
    kind = slug(device.split(":")[0])
    if kind == "cpu":
        model = slug(str(environment.get("cpu_model") or environment.get("device_name") or ""))
        cpus = environment.get("cpus_allowed") or environment.get("cpu_count")
        return f"cpu-{model}-{cpus}cpu" if cpus else f"cpu-{model}"
    return f"{kind}-{slug(str(environment.get('device_name') or ''))}"
