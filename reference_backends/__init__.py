"""Built-in attention backends, registered by name through ``BUILTIN_BACKENDS``.

The registry reads this mapping on first use; importing this package does
not touch any registry.
"""

from __future__ import annotations

from reference_backends.compiled import CompiledBackend
from reference_backends.flex import FlexBackend
from reference_backends.reference import ReferenceBackend
from reference_backends.sdpa import SdpaBackend
from reference_backends.triton_backend import TritonBackend

BUILTIN_BACKENDS: dict[str, type] = {
    "compiled": CompiledBackend,
    "flex": FlexBackend,
    "reference": ReferenceBackend,
    "sdpa": SdpaBackend,
    "triton": TritonBackend,
}

__all__ = [
    "BUILTIN_BACKENDS",
    "CompiledBackend",
    "FlexBackend",
    "ReferenceBackend",
    "SdpaBackend",
    "TritonBackend",
]
