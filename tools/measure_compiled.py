"""Measure the ``compiled`` backend: build cost, and forward against SDPA and copy bandwidth.

One process, one thread count, for everything: the kernel's build time cold
(into an empty directory) and cached (found and loaded), then ``forward``
(after ``prepare``, validation off) of ``compiled`` and ``sdpa`` beside torch
SDPA over the same tokens held contiguously (the benchmark runner's
no-paging peer), and a large tensor copy, the machine's copy bandwidth.
The timed calls are interleaved round by round, so drift on a shared
machine hits every contender alike; each reports its median. Outputs are
checked against the peer first: a fast wrong answer is not a result.

    python tools/measure_compiled.py [--threads 2] [--seqs 32] [--context 2048] [--reps 15]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.bench.peer import ContiguousPeer
from harness.numerics.scenario import Scenario, make_step_inputs
from reference_backends import compiled
from reference_backends.sdpa import SdpaBackend

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def build_times() -> tuple[float, float]:
    """Seconds to build the kernel into an empty directory, and to find and load it after."""
    saved = os.environ.get(compiled.CACHE_ENV)
    with tempfile.TemporaryDirectory() as scratch:
        os.environ[compiled.CACHE_ENV] = scratch
        try:
            start = time.perf_counter()
            compiled.load_library(force_build=True)
            cold = time.perf_counter() - start
            start = time.perf_counter()
            compiled.load_library(force_build=False, reload=True)
            cached = time.perf_counter() - start
        finally:
            if saved is None:
                del os.environ[compiled.CACHE_ENV]
            else:
                os.environ[compiled.CACHE_ENV] = saved
    compiled.load_library(reload=True)  # back to the library in the real cache
    return cold, cached


def interleaved_medians(stmts: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median seconds of each statement, timed once per round in rotating order."""
    samples: dict[str, list[float]] = {name: [] for name in stmts}
    names = list(stmts)
    for name in names:  # warm up: buffers, page faults, OpenMP threads
        stmts[name]()
    for round_ in range(reps):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start = time.perf_counter_ns()
            stmts[name]()
            samples[name].append((time.perf_counter_ns() - start) * 1e-9)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--query-len", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--copy-mib", type=int, default=512, help="copy probe size (source)")
    parser.add_argument("--no-build", action="store_true", help="skip timing the build")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]

    if not args.no_build:
        cold, cached = build_times()
        print(f"build: cold {cold:.2f} s, cached (find + load) {cached * 1e3:.1f} ms")

    pages_per_seq = -(-args.context // args.page_size)
    s = Scenario(
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        page_size=args.page_size,
        total_pages=args.seqs * pages_per_seq + 8,
        num_layers=1,
        context_lens=(args.context,) * args.seqs,
        query_lens=(args.query_len,) * args.seqs,
        dtype=dtype,
    )
    inputs = make_step_inputs(s)
    q, k_new, v_new = inputs.forward_args(0)
    peer = ContiguousPeer(inputs)
    expected = peer.assemble(peer()).float()
    stmts: dict[str, Callable[[], object]] = {"contiguous sdpa": peer}
    prepare_ms: dict[str, float] = {}
    backends: tuple[tuple[str, type[compiled.CompiledBackend | SdpaBackend]], ...] = (
        ("compiled", compiled.CompiledBackend),
        ("sdpa", SdpaBackend),
    )
    for name, cls in backends:
        backend = cls(
            num_heads=s.num_heads,
            num_kv_heads=s.num_kv_heads,
            head_dim=s.head_dim,
            scale=s.softmax_scale,
            validate=False,
        )
        backend.bind_kv_caches(inputs.caches)
        start = time.perf_counter()
        backend.prepare(inputs.step.metadata)
        prepare_ms[name] = (time.perf_counter() - start) * 1e3
        out = backend.forward(q, k_new, v_new, 0)
        tolerance = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out.float(), expected, rtol=tolerance, atol=tolerance)
        stmts[name] = functools.partial(backend.forward, q, k_new, v_new, 0)

    elements = args.copy_mib * 2**20 // 4
    source = torch.rand(elements)
    target = torch.empty_like(source)
    stmts["copy"] = lambda: target.copy_(source)

    medians = interleaved_medians(stmts, args.reps)
    copy_bw = 2 * source.numel() * 4 / medians.pop("copy")
    size = torch.finfo(dtype).bits // 8
    tokens = args.seqs * args.context
    kv_bytes = 2 * tokens * s.num_kv_heads * s.head_dim * size
    q_tokens = args.seqs * args.query_len
    io_bytes = kv_bytes + q_tokens * size * s.head_dim * (2 * s.num_heads + 2 * s.num_kv_heads)
    print(
        f"decode {args.seqs} x {args.context} (q={args.query_len}), H={s.num_heads} "
        f"KV={s.num_kv_heads} D={s.head_dim} {args.dtype} page={s.page_size}, "
        f"threads={args.threads}, torch {torch.__version__}, reps={args.reps}"
    )
    print(f"copy bandwidth (read + write, {args.copy_mib} MiB): {copy_bw / 1e9:.1f} GB/s")
    base = medians["contiguous sdpa"]
    for name, seconds in medians.items():
        bw = io_bytes / seconds
        extra = f"  prepare {prepare_ms[name]:.2f} ms" if name in prepare_ms else ""
        print(
            f"{name:16} median {seconds * 1e3:8.2f} ms  ratio {seconds / base:5.2f}x  "
            f"{bw / 1e9:6.1f} GB/s = {bw / copy_bw:5.1%} of copy{extra}"
        )


if __name__ == "__main__":
    main()
