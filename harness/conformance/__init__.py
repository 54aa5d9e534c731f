"""The property-based conformance suite's machinery.

Hypothesis strategies and production shapes, the properties, the stateful
machine, profiles, claim coverage, the fixed ``check`` matrix, and the runner
behind ``attn-harness conform`` with its report. The test files themselves
live in ``suites/conformance``; the pytest plugin's entry point is the
top-level ``attn_harness_pytest`` module. Imports ``core`` and ``numerics``.
"""
