"""Built-in attention backends, registered by name through ``BUILTIN_BACKENDS``.

``sglang-triton``, ``vllm-triton``, ``vllm-triton-mla``, ``vllm-cpu`` and ``vllm-cpu-mla``
are engines' kernels behind adapters: each claims a device only where its engine is
installed.

The registry loads them as the ``attn_harness.backends`` entry points that
``pyproject.toml`` declares (the library never imports this package); this
mapping names the same classes for code that imports them, and importing
this package touches no registry.
"""

from __future__ import annotations

from reference_backends.compiled import CompiledBackend, CompiledMlaBackend
from reference_backends.flex import FlexBackend
from reference_backends.reference import ReferenceBackend, ReferenceMlaBackend
from reference_backends.sdpa import SdpaBackend
from reference_backends.sglang_triton import SglangTritonBackend
from reference_backends.triton_backend import TritonBackend
from reference_backends.vllm_cpu import VllmCpuBackend
from reference_backends.vllm_cpu_mla import VllmCpuMlaBackend
from reference_backends.vllm_triton import VllmTritonBackend
from reference_backends.vllm_triton_mla import VllmTritonMlaBackend

BUILTIN_BACKENDS: dict[str, type] = {
    "compiled": CompiledBackend,
    "compiled-mla": CompiledMlaBackend,
    "flex": FlexBackend,
    "reference": ReferenceBackend,
    "reference-mla": ReferenceMlaBackend,
    "sdpa": SdpaBackend,
    "sglang-triton": SglangTritonBackend,
    "triton": TritonBackend,
    "vllm-cpu": VllmCpuBackend,
    "vllm-cpu-mla": VllmCpuMlaBackend,
    "vllm-triton": VllmTritonBackend,
    "vllm-triton-mla": VllmTritonMlaBackend,
}

__all__ = [
    "BUILTIN_BACKENDS",
    "CompiledBackend",
    "CompiledMlaBackend",
    "FlexBackend",
    "ReferenceBackend",
    "ReferenceMlaBackend",
    "SdpaBackend",
    "SglangTritonBackend",
    "TritonBackend",
    "VllmCpuBackend",
    "VllmCpuMlaBackend",
    "VllmTritonBackend",
    "VllmTritonMlaBackend",
]
