"""Shared fixtures for the harness's own unit tests."""

import pathlib
import sys

# Let the tests run from a plain checkout (no install), as on the GPU machine.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from harness.core.triton_mode import interpret_triton_here

# The unit tests run on the CPU: Triton kernels (the triton backend) run in its
# interpreter, which must be chosen before anything imports triton.
interpret_triton_here()
