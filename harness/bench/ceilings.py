"""The device's physical limits: measured by a probe, with a labelled datasheet fallback.

A roofline fraction is only as honest as its ceiling, so the ceilings are
measured on the machine, in the same run, at the same thread count: a large
copy (bytes read plus bytes written per second) and a large matmul per dtype
(``2 n^3`` FLOPs per call). Each is the best of its samples: a ceiling is
what the device can do, not what it usually does. Vendor datasheet figures
(dense, no sparsity) are stored beside them, labelled as such, and used
only when the probe could not run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.bench.timing import TimingConfig, device_type, last_level_cache_bytes, measure
from harness.core.dtypes import dtype_name

PROBE_TIMING = TimingConfig(
    warmup=1, min_samples=5, max_samples=10, budget_s=1.0, target_rel_ci=0.02, cold_cache=False
)


@dataclass(frozen=True)
class Ceilings:
    """Peak memory bandwidth (bytes/s) and matmul rate per dtype (FLOP/s) of one device."""

    source: str  # "measured" or "datasheet"
    device_name: str
    memory_bandwidth: float | None
    matmul_flops: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def flops_for(self, dtype: str) -> float | None:
        return self.matmul_flops.get(dtype)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "device_name": self.device_name,
            "memory_bandwidth": self.memory_bandwidth,
            "matmul_flops": dict(self.matmul_flops),
            "details": dict(self.details),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ceilings:
        return cls(
            source=data["source"],
            device_name=data["device_name"],
            memory_bandwidth=data["memory_bandwidth"],
            matmul_flops=dict(data["matmul_flops"]),
            details=dict(data.get("details", {})),
        )


@dataclass(frozen=True)
class RunCeilings:
    """What a run stores: the probe's figures and, for a known GPU, the datasheet's."""

    measured: Ceilings | None
    datasheet: Ceilings | None

    @property
    def used(self) -> Ceilings | None:
        """The ceilings fractions are computed against: measured first."""
        return self.measured if self.measured is not None else self.datasheet

    def to_json(self) -> dict[str, Any]:
        used = self.used
        return {
            "used": None if used is None else used.source,
            "measured": None if self.measured is None else self.measured.to_json(),
            "datasheet": None if self.datasheet is None else self.datasheet.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunCeilings:
        def one(key: str) -> Ceilings | None:
            return None if data.get(key) is None else Ceilings.from_json(data[key])

        return cls(measured=one("measured"), datasheet=one("datasheet"))


def _sheet(name: str, bandwidth: float, half: float, fp32: float, url: str) -> Ceilings:
    return Ceilings(
        source="datasheet",
        device_name=name,
        memory_bandwidth=bandwidth,
        matmul_flops={"bfloat16": half, "float16": half, "float32": fp32},
        details={
            "note": "vendor datasheet, dense (no sparsity); float32 without TF32",
            "reference": url,
        },
    )


_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet"
# (substring of torch.cuda.get_device_name, ceilings); the first match wins, so the
# more specific names come first.
DATASHEETS: tuple[tuple[str, Ceilings], ...] = (
    ("H200 NVL", _sheet("H200 NVL", 4.8e12, 835.5e12, 60.0e12, _H200)),
    ("H200", _sheet("H200 SXM", 4.8e12, 989.4e12, 66.9e12, _H200)),
    ("H100 NVL", _sheet("H100 NVL", 3.9e12, 835.5e12, 60.0e12, _H100)),
    ("H100 PCIe", _sheet("H100 PCIe", 2.0e12, 756.0e12, 51.2e12, _H100)),
    ("H100", _sheet("H100 SXM", 3.35e12, 989.4e12, 66.9e12, _H100)),
    ("A100-PCIE", _sheet("A100 PCIe 80GB", 1.935e12, 312.0e12, 19.5e12, _A100)),
    ("A100", _sheet("A100 SXM 80GB", 2.039e12, 312.0e12, 19.5e12, _A100)),
)


def datasheet_for(device_name: str) -> Ceilings | None:
    """Datasheet ceilings of a known GPU, by (a substring of) its name."""
    for key, sheet in DATASHEETS:
        if key.lower() in device_name.lower():
            return sheet
    return None


def device_name(device: str) -> str:
    if device_type(device) == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    from harness.bench.environment import cpu_model

    return cpu_model()


def _probe_copy(device: str, threads: int | None, nbytes: int) -> tuple[float, dict[str, Any]]:
    elements = nbytes // 4
    source = torch.rand(elements, device=torch.device(device))
    target = torch.empty_like(source)
    timing = measure(
        lambda: target.copy_(source), device=device, config=PROBE_TIMING, threads=threads
    )
    best = min(timing.samples_ns)
    return 2 * source.nbytes / (best * 1e-9), {"bytes": 2 * source.nbytes, "best_ns": best}


def _probe_matmul(
    device: str, dtype: torch.dtype, threads: int | None, sizes: tuple[int, int], slow_s: float
) -> tuple[float, dict[str, Any]]:
    """Grow ``n`` from ``sizes[0]`` until one call takes ``slow_s`` or ``n`` reaches ``sizes[1]``.

    Growing keeps a slow dtype (fp16 on most CPUs runs at a few GFLOP/s)
    from turning the probe into minutes.
    """
    dev = torch.device(device)
    n, largest = sizes
    while True:
        a = torch.rand(n, n, device=dev).to(dtype)
        b = torch.rand(n, n, device=dev).to(dtype)
        torch.matmul(a, b)  # first call: library initialisation, not timed
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        torch.matmul(a, b)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if time.perf_counter() - start >= slow_s or n * 2 > largest:
            break
        n *= 2
    timing = measure(
        lambda: torch.matmul(a, b), device=device, config=PROBE_TIMING, threads=threads
    )
    best = min(timing.samples_ns)
    return 2 * n**3 / (best * 1e-9), {"n": n, "best_ns": best}


def probe(
    device: str = "cpu",
    *,
    threads: int | None = None,
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16),
) -> Ceilings:
    """Measure copy bandwidth and matmul rate per dtype on ``device`` (seconds on a CPU)."""
    is_cuda = device_type(device) == "cuda"
    details: dict[str, Any] = {"threads": threads or torch.get_num_threads()}
    copy_bytes = 2**30 if is_cuda else max(8 * last_level_cache_bytes(device), 256 * 2**20)
    bandwidth: float | None
    try:
        bandwidth, details["copy"] = _probe_copy(device, threads, copy_bytes)
    except (RuntimeError, MemoryError) as exc:  # out of memory: keep the other figures
        bandwidth, details["copy"] = None, {"error": f"{type(exc).__name__}: {exc}"}
    sizes = (4096, 16384) if is_cuda else (256, 2048)
    slow_s = 0.02 if is_cuda else 0.05
    flops: dict[str, float] = {}
    for dtype in dtypes:
        name = dtype_name(dtype)
        try:
            flops[name], details[f"matmul_{name}"] = _probe_matmul(
                device, dtype, threads, sizes, slow_s
            )
        except (RuntimeError, MemoryError) as exc:  # e.g. a dtype the device lacks
            details[f"matmul_{name}"] = {"error": f"{type(exc).__name__}: {exc}"}
    if is_cuda:
        details["allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    return Ceilings("measured", device_name(device), bandwidth, flops, details)


def run_ceilings(
    device: str = "cpu",
    *,
    threads: int | None = None,
    dtypes: tuple[torch.dtype, ...] = (torch.float32,),
    measure_probe: bool = True,
) -> RunCeilings:
    """The ceilings a run stores: the probe (unless disabled) and the datasheet, if known."""
    measured = probe(device, threads=threads, dtypes=dtypes) if measure_probe else None
    sheet = datasheet_for(device_name(device)) if device_type(device) == "cuda" else None
    return RunCeilings(measured=measured, datasheet=sheet)
