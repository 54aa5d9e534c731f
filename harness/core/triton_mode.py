"""Whether Triton interprets kernels in this process, and choosing that for CPU-only runs.

Triton decides at its first import (its standard library is decorated then)
and at each ``@triton.jit`` whether kernels are compiled for a GPU or run by
its interpreter on the host, from ``TRITON_INTERPRET``. A process that runs
Triton kernels on CPU tensors must therefore choose before anything imports
triton, and torch itself may (``torch.compile`` does). CPU-only entry points
(the conformance suite on the CPU, ``attn-harness check``) call
``interpret_triton_here`` first; it also makes the interpreter's bf16 right.
"""

from __future__ import annotations

import os
import sys

_TRUE = ("1", "true", "yes", "on")


def triton_interprets() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for the interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


def interpret_triton_here() -> bool:
    """Ask for Triton's interpreter in this process unless triton is already imported.

    An explicit ``TRITON_INTERPRET`` is left as it is. Where Triton will
    interpret, its bf16 arithmetic is made that of compiled Triton
    (``triton_bf16``), so a kernel checked in bf16 on the CPU is judged on
    its own numerics. Returns whether Triton will interpret.
    """
    if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    if not triton_interprets():
        return False
    from harness.core.triton_bf16 import use_compiled_bf16

    use_compiled_bf16()
    return True
