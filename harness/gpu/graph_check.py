"""Graph-mode readiness: a ``forward`` with no host sync, and a captured forward that replays right.

    PYTHONPATH=. python -m harness.gpu.graph_check --backend NAME [--backend ...] [--json PATH]

An engine captures each layer's ``forward`` in a CUDA graph after
``prepare(..., graph_mode=True)`` and replays it with new contents in the
same buffers. The conformance suites check the outputs of graph-mode
padding, not the capture itself, so a backend that calls ``.item()`` in
``forward``, or whose captured kernels read a stale buffer, passes them and
fails in the engine. For each backend and each production-ish step of
``SHAPES`` (``harness.gpu.graph_steps``: bf16, 32/8 heads, head dim 128, page
16, padded rows at the end) this module:

1. runs an eager ``forward`` (the first call may compile or autotune) and
   holds its output to the float64 oracle, and its cache to the slots of
   ``slot_mapping`` (every new token written, nothing else);
2. runs ``forward`` again under ``torch.cuda.set_sync_debug_mode("error")``:
   a host synchronisation is a failure naming the backend;
3. captures ``forward`` in a ``torch.cuda.CUDAGraph`` (warmed up on a side
   stream, as torch's CUDA-graph docs describe) while its buffers hold
   another step's values (same metadata), then loads this step's values
   and cache into the same buffers, poisons the captured output with NaN
   and replays: the replay must pass the oracle, and the cache after it
   must equal eager's bit for bit. Whether the replay is bit-identical to
   eager is reported, not required.

Padded rows' outputs are never checked. Each backend is built with
``validate=False`` where its constructor takes it, as engines time it.
``--device cpu`` runs step 1 and, in place of step 3, a second instance's
eager ``forward`` on the other values, then on this step's (no sync check,
no capture): the same comparisons, for machines without a GPU.

Exit 0: every backend checked passed (those outside their claim or not
registered are skipped); 1: a failure, or nothing could be checked; 2: bad
usage, or no CUDA device for ``--device cuda``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.core.atomic_file import write_json_atomically
from harness.core.contract import capabilities_of
from harness.core.dtypes import dtype_name
from harness.core.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from harness.core.registry import BackendEntry, default_registry
from harness.gpu.graph_steps import SHAPES, GraphShape, GraphStep
from harness.numerics.canary import bits, snapshot
from harness.numerics.tolerance import Comparison

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
WARMUP_CALLS = 2  # on the side stream before capture


@dataclass
class ShapeResult:
    """The outcome of one backend on one shape; ``problems`` empty means it passed."""

    shape: str
    status: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    eager: dict[str, Any] | None = None  # oracle comparison of the eager output
    replay: dict[str, Any] | None = None  # ... of the replayed (or second eager) output
    replay_max_abs_diff: float | None = None  # vs eager, real rows
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "status": self.status,
            "problems": self.problems,
            "notes": self.notes,
            "eager": self.eager,
            "replay": self.replay,
            "replay_max_abs_diff": self.replay_max_abs_diff,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class BackendResult:
    name: str
    status: str
    reason: str
    shapes: list[ShapeResult] = field(default_factory=list)

    def line(self) -> str:
        return f"{self.status} {self.name}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "status": self.status,
            "reason": self.reason,
            "shapes": [s.to_json() for s in self.shapes],
        }


def _oracle_json(comparison: Comparison) -> dict[str, Any]:
    return {
        "passed": comparison.passed,
        "worst_ratio": comparison.worst_ratio,
        "checked_tokens": comparison.checked_tokens,
        "nonfinite": comparison.nonfinite,
        "detail": comparison.describe(),
    }


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


@contextlib.contextmanager
def sync_debug_errors() -> Iterator[None]:
    """``torch.cuda.set_sync_debug_mode("error")`` for the block, then back to what it was."""
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


def _capture(backend: Any, args: tuple[torch.Tensor, ...], device: str) -> tuple[Any, Any]:
    """Warm up on a side stream, then capture one ``forward``: ``(graph, static output)``."""
    dev = torch.device(device)
    previous = torch.cuda.current_stream(dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(previous)
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            backend.forward(*args, 0)
    previous.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            output = backend.forward(*args, 0)
    finally:  # a failed capture may leave its stream current
        torch.cuda.set_stream(previous)
    torch.cuda.synchronize(dev)
    return graph, output


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(torch.device(device))


def check_shape(entry: BackendEntry, step: GraphStep) -> ShapeResult:
    """Steps 1-3 of the module docstring for one backend on one prepared shape."""
    result = ShapeResult(step.shape.name, PASS)
    started = time.monotonic()
    try:
        _check_shape(entry, step, result)
    except Exception as exc:  # the backend raised: that ends this shape, not the run
        result.problems.append(_describe(exc))
    finally:
        step.restore()
    if result.problems:
        result.status = FAIL
    result.seconds = time.monotonic() - started
    return result


def _check_shape(entry: BackendEntry, step: GraphStep, result: ShapeResult) -> None:
    is_cuda = torch.device(step.device).type == "cuda"
    args = step.forward_args()
    step.restore()
    try:
        eager_backend = step.prepared(entry)
    except Exception as exc:
        result.problems.append(f"constructing or preparing (graph_mode=True): {_describe(exc)}")
        return
    try:
        eager = eager_backend.forward(*args, 0)
        _synchronize(step.device)
    except Exception as exc:
        result.problems.append(f"eager forward: {_describe(exc)}")
        return
    problem, comparison = step.check_output(eager)
    if problem is not None:
        result.problems.append(f"eager forward {problem}")
    if comparison is None:  # not a tensor of the right shape: nothing to compare a replay with
        return
    result.eager = _oracle_json(comparison)
    assert isinstance(eager, torch.Tensor)
    eager = eager.clone()
    wrote = step.write_problem()
    if wrote is not None:
        result.problems.append(f"eager forward: {wrote}")
    eager_cache = snapshot(step.inputs.caches)

    if is_cuda:  # (a) host synchronisation in a warmed-up forward
        step.restore()
        try:
            with sync_debug_errors():
                eager_backend.forward(*args, 0)
            _synchronize(step.device)
        except RuntimeError as exc:
            text = str(exc)
            if "synchroniz" in text.lower():
                result.problems.append(
                    f"host synchronisation in forward ({entry.name}), forbidden in graph mode: "
                    f"{_describe(exc)}"
                )
            else:
                result.problems.append(f"forward under sync debug mode: {_describe(exc)}")
    del eager_backend

    step.load("other")  # the warm-up and the capture see other values in the same buffers
    try:  # (b) capture and replay; on the CPU a second instance's eager forward stands in
        backend = step.prepared(entry)
        if is_cuda:
            graph, static = _capture(backend, args, step.device)
            step.restore()  # this step's values; the warm-up calls' writes undone
            if isinstance(static, torch.Tensor):
                static.fill_(math.nan)  # what the replay does not write stays NaN
            graph.replay()
            _synchronize(step.device)
            replayed = static
        else:
            backend.forward(*args, 0)
            step.restore()
            replayed = backend.forward(*args, 0)
            result.notes.append(
                "cpu: no capture; a second instance's eager forward (after one on other "
                "values) stands in"
            )
    except Exception as exc:
        what = "capture/replay" if is_cuda else "second eager forward"
        result.problems.append(f"{what}: {_describe(exc)}")
        return
    problem, comparison = step.check_output(replayed)
    if comparison is not None:
        result.replay = _oracle_json(comparison)
    if problem is not None:
        result.problems.append(f"replay {problem}")
    else:
        assert isinstance(replayed, torch.Tensor)
        rows = step.real_rows().to(replayed.device)
        diff = (replayed[rows].float() - eager[rows].float()).abs().max()
        result.replay_max_abs_diff = float(diff)
        if not torch.equal(bits(replayed[rows]), bits(eager[rows])):
            result.notes.append(f"replay not bit-identical to eager (max |diff| {float(diff):.3g})")
    after = snapshot(step.inputs.caches)
    same = all(
        torch.equal(k, k0) and torch.equal(v, v0)
        for (k, v), (k0, v0) in zip(after, eager_cache, strict=True)
    )
    if not same:
        wrote = step.write_problem()
        result.problems.append(
            "cache after replay differs from eager's" + (f": {wrote}" if wrote else "")
        )


def _summary(results: list[ShapeResult]) -> str:
    if any(r.problems for r in results):
        return "; ".join(f"{r.shape}: {' | '.join(r.problems)}" for r in results if r.problems)
    worst = max(
        (r.replay["worst_ratio"] for r in results if r.replay is not None),
        default=float("nan"),
    )
    identical = all(not any("bit-identical" in n for n in r.notes) for r in results)
    cpu = any(n.startswith("cpu:") for r in results for n in r.notes)
    parts = [f"{len(results)} shapes"]
    if cpu:
        parts.append("eager twice on cpu (no sync check, no capture)")
    else:
        parts.append("no host sync in forward")
        parts.append("replay bit-identical to eager" if identical else "replay within bound")
    parts.append(f"oracle worst {worst:.2f}x of bound")
    parts.append("cache as eager's")
    return ", ".join(parts)


def check_backend(entry: BackendEntry, steps: Sequence[GraphStep]) -> BackendResult:
    """Every shape for one backend; skipped where the step lies outside its claim."""
    step0 = steps[0]
    try:
        reason = capabilities_of(entry.cls).unsupported_reason(
            dtype=step0.scenario.dtype,
            device=torch.device(step0.device).type,
            page_size=step0.scenario.page_size,
            head_dim=step0.scenario.head_dim,
            seq_len=max(max(s.shape.context_lens) for s in steps),
            graph_mode=True,
        )
    except TypeError as exc:  # a malformed capabilities() claim
        return BackendResult(entry.name, FAIL, f"capabilities(): {_describe(exc)}")
    if reason is not None:
        return BackendResult(entry.name, SKIP, f"outside its claim: {reason}")
    shapes = [check_shape(entry, step) for step in steps]
    status = FAIL if any(s.status == FAIL for s in shapes) else PASS
    return BackendResult(entry.name, status, _summary(shapes), shapes)


def _context_alive(device: str) -> str | None:
    """``None`` if the device still runs work; else why not (a sticky CUDA error)."""
    if torch.device(device).type != "cuda":
        return None
    try:
        probe = torch.ones(1, device=device)
        probe.add_(1)
        torch.cuda.synchronize(torch.device(device))
    except Exception as exc:
        return _describe(exc)
    return None


def resolve(names: Sequence[str]) -> tuple[list[BackendEntry], list[BackendResult]]:
    """Registered names or specs -> entries; one that is unknown or fails to load is skipped."""
    registry = default_registry()
    entries: list[BackendEntry] = []
    skipped: list[BackendResult] = []
    for name in names or registry.names():
        try:
            with contextlib.redirect_stdout(sys.stderr):
                entries.append(registry.resolve(name))
        except KeyError as exc:
            skipped.append(BackendResult(name, SKIP, f"not registered: {exc.args[0]}"))
        except Exception as exc:  # BackendLoadError, or an import that breaks
            skipped.append(BackendResult(name, SKIP, f"cannot be loaded: {_describe(exc)}"))
    return entries, skipped


def run(
    entries: Sequence[BackendEntry],
    *,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    shapes: Sequence[GraphShape] = SHAPES,
    echo: bool = True,
    done: Callable[[list[BackendResult]], None] | None = None,
) -> list[BackendResult]:
    """Check every backend on every shape, printing one line per backend as it finishes.

    ``done(results so far)`` runs after each backend, so a summary written
    there survives a run stopped before the end.
    """
    steps = [GraphStep(shape, device, dtype) for shape in shapes]
    results: list[BackendResult] = []
    lost: str | None = None
    for entry in entries:
        if lost is not None:
            result = BackendResult(entry.name, SKIP, f"not checked: {lost}")
        else:
            result = check_backend(entry, steps)
            if result.status == FAIL:
                broken = _context_alive(device)
                if broken is not None:
                    lost = f"the CUDA context failed after {entry.name}'s run ({broken})"
        results.append(result)
        if echo:
            print(result.line(), flush=True)
        if done is not None:
            done(results)
    return results


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically, so a run cut short leaves the old file or none, never half of one."""
    write_json_atomically(path, data, indent=2)


def summary_json(
    results: Sequence[BackendResult],
    *,
    device: str,
    dtype: torch.dtype,
    exit_code: int,
    shapes: Sequence[GraphShape] = SHAPES,
) -> dict[str, Any]:
    return {
        "tool": "harness.gpu.graph_check",
        "device": device,
        "device_name": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": dtype_name(dtype),
        "shapes": [
            {
                "name": s.name,
                "context_lens": list(s.context_lens),
                "query_lens": list(s.query_lens),
                "pad_rows": s.pad_rows,
                "pad_query_len": s.pad_query_len,
                "heads": [s.num_heads, s.num_kv_heads],
                "head_dim": s.head_dim,
                "page_size": s.page_size,
            }
            for s in shapes
        ],
        "exit_code": exit_code,
        "backends": [r.to_json() for r in results],
    }


def exit_code(results: Sequence[BackendResult]) -> int:
    """0 when every backend checked passed and at least one was; else 1."""
    if any(r.status == FAIL for r in results) or not any(r.status == PASS for r in results):
        return EXIT_FAILED
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness.gpu.graph_check",
        description="Check that backends' forward is free of host synchronisation and "
        "replays right from a CUDA graph, on production-ish graph-mode steps.",
    )
    parser.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="SPEC",
        help="registered name or spec (repeatable; default: every registered backend)",
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda (default); cpu: eager-vs-oracle and cache checks only, no capture",
    )
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write a JSON summary here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "graph_check: error: no CUDA device is available (torch "
            f"{torch.__version__}, built with CUDA {torch.version.cuda or 'no'}); "
            "CUDA-graph capture needs one (--device cpu runs the eager checks only)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.device == "cpu":  # Triton kernels on CPU tensors need its interpreter, chosen now
        from harness.core.triton_mode import interpret_triton_here

        interpret_triton_here()
    dtype = DTYPES[args.dtype]
    path = None if args.json is None else args.json.resolve()
    entries, skipped = resolve(args.backend)
    for result in skipped:
        print(result.line(), flush=True)

    def save(checked: list[BackendResult]) -> None:
        if path is not None:
            everything = skipped + checked
            code = exit_code(everything)
            write_json(
                path, summary_json(everything, device=args.device, dtype=dtype, exit_code=code)
            )

    save([])
    results = skipped + run(entries, device=args.device, dtype=dtype, done=save)
    if not any(r.status in (PASS, FAIL) for r in results):
        print("graph_check: nothing could be checked", flush=True)
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
