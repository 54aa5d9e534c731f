"""Prefill sweep: whole causal prompts of growing length (compute-bound)."""

from __future__ import annotations

WORKLOADS = ("prefill-sweep",)


def test_prefill_sweep(bench_run):
    bench_run()
