"""Shared fixtures for the harness's own unit tests."""

import pathlib
import sys

# Let the tests run from a plain checkout (no install), as on the GPU machine.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
