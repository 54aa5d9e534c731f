"""Decode sweep: one new token per sequence over a growing context (memory-bound)."""

from __future__ import annotations

WORKLOADS = ("decode-sweep",)


def test_decode_sweep(bench_run):
    bench_run()
