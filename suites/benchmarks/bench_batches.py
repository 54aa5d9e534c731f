"""Chunked prefill and mixed batches: the ragged shapes a scheduler builds."""

from __future__ import annotations

WORKLOADS = ("extend", "mixed")


def test_extend_and_mixed(bench_run):
    bench_run()
