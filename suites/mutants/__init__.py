"""Planted-bug catalogue: broken backends the conformance suite must catch.

Each class in ``suites.mutants.backends`` carries one bug of a kind real
attention kernels have shipped; those of ``suites.mutants.thresholds`` are
exact below a production shape and wrong only past it. They are not registered as built-ins; the
kill matrix (``python -m suites.mutants.kill_matrix``) runs the conformance
suite against each and reports which properties caught it.
"""
