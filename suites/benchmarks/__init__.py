"""pytest-benchmark suites: every selected backend x every case of a workload.

Run from a checkout (``bench_*.py`` files are collected by this package's
``conftest.py``)::

    pytest suites/benchmarks --benchmark-json=reports/bench.json \
        [--bench-backend NAME_OR_SPEC ...] [--bench-workload NAME ...] \
        [--bench-device cpu|cuda] [--bench-size cpu|gpu] [--bench-rounds N]
    python -m harness.results.pytest_benchmark reports/bench.json reports/bench-results.json

Each test checks its case against the float64 oracle before timing it; the
metrics (tokens/s, GB/s, TFLOP/s, roofline fractions, ratio to the
contiguous SDPA peer) go into ``extra_info``, with the full results-schema
record, so ``harness.results.pytest_benchmark`` converts the JSON losslessly.
"""
