"""What "correct" means: the float64 oracle, the error bound, cache read-back.

One attention step as plain data (``scenario``), turned into tensors and
checked against the oracle; the canary that watches cache memory; the
discrimination tables that show the bound fails wrong kernels and passes
correct ones. Imports ``harness.core`` only.
"""
