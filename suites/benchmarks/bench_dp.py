"""DP scaling: the most loaded rank's share of a fixed global decode batch, dp_size 1..8."""

from __future__ import annotations

WORKLOADS = ("dp-scaling",)


def test_dp_scaling(bench_run):
    bench_run()
