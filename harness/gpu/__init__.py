"""The GPU machine's one prepared script and its graph-mode check.

``python -m harness.gpu OUT_DIR`` runs conformance and the benchmarks on a
CUDA device and writes everything under ``OUT_DIR``.
"""
