"""Test suites shipped with the wheel, runnable with ``pytest --pyargs suites...``.

``suites.conformance`` (property-based checks of any backend) and
``suites.benchmarks`` (pytest-benchmark) live here; the harness's own unit
tests are under ``tests/``.
"""
