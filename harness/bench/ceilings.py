"""The device's physical limits: measured by a probe, with a labelled datasheet fallback.

A roofline fraction is only as honest as its ceiling, so the ceilings are
measured on the machine, in the same run, at the same thread count: a large
copy (bytes read plus bytes written per second) and a large matmul per dtype
(``2 n^3`` FLOPs per call) through every GEMM torch offers there (on a CPU,
MKL's and oneDNN's: MKL runs AVX2 kernels on AMD CPUs, half their peak). Each
is the best of its samples and paths: a ceiling is what the device can do,
not what it usually does or what one library reaches. Vendor datasheet figures
(dense, no sparsity) are stored beside them, labelled as such, and used
only when the probe could not run.

A probe that runs while the machine is busy measures the neighbours, not
the device (the same CPU gave 107 GFLOP/s in one run and 36 in the next).
So a run probes more than once (``RunCeilings.with_round``: before the
cases, again at once when a case's rate exceeds a ceiling, and after the
cases), keeps the best figure of every round, and stores every round's
samples and the spread between rounds. ``spread_flags`` says when the
rounds disagree by more than ``SPREAD_FLAG``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.bench.timing import TimingConfig, device_type, last_level_cache_bytes, measure
from harness.core.dtypes import dtype_name

PROBE_TIMING = TimingConfig(
    warmup=1, min_samples=5, max_samples=10, budget_s=1.0, target_rel_ci=0.02, cold_cache=False
)
SPREAD_FLAG = 0.25
"""Rounds whose figures for one ceiling differ by more than this share of the best are flagged."""


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
class ProbeRound:
    """One run of the probe: when it ran and what it measured (its samples in ``details``)."""

    when: str  # "before", "after", or "recheck: CASE ID" (a case's rate exceeded a ceiling)
    at_s: float  # seconds after the run's first probe started
    ceilings: Ceilings

    def to_json(self) -> dict[str, Any]:
        c = self.ceilings
        return {
            "when": self.when,
            "at_s": round(self.at_s, 3),
            "memory_bandwidth": c.memory_bandwidth,
            "matmul_flops": dict(c.matmul_flops),
            "details": dict(c.details),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], device_name: str = "") -> ProbeRound:
        ceilings = Ceilings(
            "measured",
            device_name,
            data.get("memory_bandwidth"),
            dict(data.get("matmul_flops", {})),
            dict(data.get("details", {})),
        )
        return cls(str(data["when"]), float(data["at_s"]), ceilings)


def best_of(rounds: Sequence[ProbeRound]) -> Ceilings | None:
    """Each ceiling's best figure over ``rounds``: a ceiling is what the device can do.

    ``details`` keeps, per ceiling, the details of the round that gave the best figure
    (with that round's index as ``round``), and how many rounds there were.
    """
    if not rounds:
        return None
    first = rounds[0].ceilings
    details: dict[str, Any] = {k: v for k, v in first.details.items() if not isinstance(v, dict)}
    details["rounds"] = len(rounds)
    bandwidth: float | None = None
    flops: dict[str, float] = {}
    for index, r in enumerate(rounds):
        c = r.ceilings
        if c.memory_bandwidth and c.memory_bandwidth > (bandwidth or 0.0):
            bandwidth = c.memory_bandwidth
            details["copy"] = {**c.details.get("copy", {}), "round": index}
        for dtype, value in c.matmul_flops.items():
            if value > flops.get(dtype, 0.0):
                flops[dtype] = value
                key = f"matmul_{dtype}"
                details[key] = {**c.details.get(key, {}), "round": index}
    for r in rounds:  # a ceiling no round measured keeps the first error that said why
        for key, value in r.ceilings.details.items():
            if isinstance(value, dict) and "error" in value:
                details.setdefault(key, value)
    return Ceilings("measured", first.device_name, bandwidth, flops, details)


def ceiling_label(key: str) -> str:
    """``copy`` -> ``copy bandwidth``; ``matmul_float32`` -> ``float32 matmul``."""
    if key == "copy":
        return "copy bandwidth"
    return f"{key.removeprefix('matmul_')} matmul"


def spread(rounds: Sequence[ProbeRound]) -> dict[str, dict[str, Any]]:
    """Per ceiling (``copy``, ``matmul_DTYPE``): lowest and best figure, rounds, spread.

    ``spread`` is ``(best - lowest) / best``: 0 when every round agreed.
    """
    figures: dict[str, list[float]] = {}
    for r in rounds:
        if r.ceilings.memory_bandwidth:
            figures.setdefault("copy", []).append(r.ceilings.memory_bandwidth)
        for dtype, value in r.ceilings.matmul_flops.items():
            figures.setdefault(f"matmul_{dtype}", []).append(value)
    return {
        key: {
            "low": min(values),
            "best": max(values),
            "rounds": len(values),
            "spread": (max(values) - min(values)) / max(values),
        }
        for key, values in figures.items()
    }


def _figure(key: str, value: float) -> str:
    return f"{value / 1e9:.3g} GB/s" if key == "copy" else f"{value / 1e9:.3g} GFLOP/s"


def spread_flags(spreads: dict[str, dict[str, Any]], limit: float = SPREAD_FLAG) -> list[str]:
    """A flag per ceiling whose probe rounds differ by more than ``limit`` of the best."""
    flags = []
    for key, s in spreads.items():
        if s["rounds"] > 1 and s["spread"] > limit:
            flags.append(
                f"ceiling spread: {ceiling_label(key)} {_figure(key, s['low'])} to "
                f"{_figure(key, s['best'])} over {s['rounds']} probes ({s['spread']:.0%}); "
                "the machine was busy during some, the best is used"
            )
    return flags


@dataclass(frozen=True)
class RunCeilings:
    """What a run stores: the probe's figures (best of its rounds) and, for a known GPU,
    the datasheet's; every round with its samples."""

    measured: Ceilings | None
    datasheet: Ceilings | None
    probes: tuple[ProbeRound, ...] = ()

    @property
    def used(self) -> Ceilings | None:
        """The ceilings fractions are computed against: measured first."""
        return self.measured if self.measured is not None else self.datasheet

    def with_round(self, round_: ProbeRound) -> RunCeilings:
        """These ceilings with one more probe round: each measured figure the best so far."""
        probes = (*self.probes, round_)
        return RunCeilings(best_of(probes), self.datasheet, probes)

    def spread(self) -> dict[str, dict[str, Any]]:
        return spread(self.probes)

    def to_json(self) -> dict[str, Any]:
        used = self.used
        data: dict[str, Any] = {
            "used": None if used is None else used.source,
            "measured": None if self.measured is None else self.measured.to_json(),
            "datasheet": None if self.datasheet is None else self.datasheet.to_json(),
        }
        if self.probes:
            data["probes"] = [r.to_json() for r in self.probes]
            data["spread"] = self.spread()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunCeilings:
        def one(key: str) -> Ceilings | None:
            return None if data.get(key) is None else Ceilings.from_json(data[key])

        measured = one("measured")
        name = "" if measured is None else measured.device_name
        probes = tuple(ProbeRound.from_json(r, name) for r in data.get("probes", []))
        return cls(measured=measured, datasheet=one("datasheet"), probes=probes)


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
    details = {"bytes": 2 * source.nbytes, "best_ns": best, "samples_ns": list(timing.samples_ns)}
    return 2 * source.nbytes / (best * 1e-9), details


def _onednn_linear(a: torch.Tensor, b: torch.Tensor) -> Callable[[], torch.Tensor] | None:
    """``a @ b.T`` through oneDNN's own GEMM (``torch.utils.mkldnn``), where torch has it.

    On an AMD CPU ``torch.matmul`` in float32 goes to MKL, which takes its AVX2 kernels
    there: on an EPYC Zen 5 core it gave 108 GFLOP/s where oneDNN gave 240 (the core's
    2 x 512-bit FMA peak at ~3.8 GHz) and a paged-attention kernel 191. A ceiling from
    MKL alone is no upper bound.
    """
    if a.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    from torch.utils import mkldnn

    linear = torch.nn.Linear(b.shape[1], b.shape[0], bias=False)
    with torch.no_grad():
        linear.weight.copy_(b.float())
        module = mkldnn.to_mkldnn(linear, a.dtype)
        x = a.to_mkldnn()
        module(x)  # first call: oneDNN builds its primitive, not timed

    def call() -> torch.Tensor:
        with torch.no_grad():
            return module(x)

    return call


def _probe_matmul(
    device: str, dtype: torch.dtype, threads: int | None, sizes: tuple[int, int], slow_s: float
) -> tuple[float, dict[str, Any]]:
    """The best GEMM rate of ``n x n`` operands over every path torch offers here.

    ``n`` grows from ``sizes[0]`` until one call takes ``slow_s`` or ``n`` reaches
    ``sizes[1]``: growing keeps a slow dtype (fp16 on most CPUs runs at a few
    GFLOP/s) from turning the probe into minutes. The paths are ``torch.matmul`` and,
    on a CPU, oneDNN's GEMM (``_onednn_linear``); ``details`` keeps each one's best
    and names the path that gave the ceiling.
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
    paths: dict[str, Callable[[], object]] = {"torch.matmul": lambda: torch.matmul(a, b)}
    details: dict[str, Any] = {"n": n, "paths": {}}
    try:
        onednn = _onednn_linear(a, b)
    except (RuntimeError, TypeError) as exc:  # a dtype oneDNN lacks here; the last line says why
        details["paths"]["onednn"] = {"error": str(exc).strip().splitlines()[-1]}
    else:
        if onednn is not None:
            paths["onednn"] = onednn
    best_rate = 0.0
    for path, call in paths.items():
        timing = measure(call, device=device, config=PROBE_TIMING, threads=threads)
        best = min(timing.samples_ns)
        rate = 2 * n**3 / (best * 1e-9)
        details["paths"][path] = {"best_ns": best, "flops": rate}
        if rate > best_rate:
            best_rate = rate
            details.update(path=path, best_ns=best, samples_ns=list(timing.samples_ns))
    return best_rate, details


def probe(
    device: str = "cpu",
    *,
    threads: int | None = None,
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16),
    copy: bool = True,
) -> Ceilings:
    """Measure copy bandwidth (unless ``copy`` is false) and matmul rate per dtype on ``device``.

    Seconds on a quiet CPU. Every timed call's nanoseconds are kept in
    ``details`` (``copy``, ``matmul_DTYPE``: ``samples_ns``, ``best_ns``).
    """
    is_cuda = device_type(device) == "cuda"
    details: dict[str, Any] = {"threads": threads or torch.get_num_threads()}
    copy_bytes = 2**30 if is_cuda else max(8 * last_level_cache_bytes(device), 256 * 2**20)
    bandwidth: float | None = None
    if copy:
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
    """The ceilings a run starts from: one probe round (unless disabled) and the datasheet."""
    sheet = datasheet_for(device_name(device)) if device_type(device) == "cuda" else None
    ceilings = RunCeilings(measured=None, datasheet=sheet)
    if measure_probe:
        ceilings = ceilings.with_round(
            ProbeRound("before", 0.0, probe(device, threads=threads, dtypes=dtypes))
        )
    return ceilings
