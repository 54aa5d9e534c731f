"""attn-harness: conformance and benchmarks for DP-partitioned paged attention backends.

The names below are the public API; everything else is
reachable through its module. They load on first use (PEP 562), so
importing ``harness`` (as the ``attn-harness`` command does before parsing
its arguments) does not import torch.

User documentation: ``docs/`` in the repository (``docs/README.md`` is the
index); a backend author starts at ``docs/write-a-backend.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.core.contract import AttentionBackend, AttentionMetadata, Capabilities, LayerCache
    from harness.core.errors import (
        BackendLoadError,
        CacheBindingError,
        ForeignPageError,
        MetadataError,
        OutOfPages,
        Unsupported,
    )
    from harness.core.kv_pages import PagePool, PoolLayout, dp_page_range, make_layer_caches
    from harness.core.registry import (
        DPBackendConfig,
        create_attention_backend,
        get_backend,
        list_backends,
        load_backend_spec,
        register_backend,
    )
    from harness.core.validate import (
        check_rank_ownership,
        validate_backend_args,
        validate_layer_caches,
        validate_metadata,
    )
    from harness.core.variants import AttentionVariant

_PUBLIC = {
    "AttentionBackend": "harness.core.contract",
    "AttentionMetadata": "harness.core.contract",
    "Capabilities": "harness.core.contract",
    "LayerCache": "harness.core.contract",
    "BackendLoadError": "harness.core.errors",
    "CacheBindingError": "harness.core.errors",
    "ForeignPageError": "harness.core.errors",
    "MetadataError": "harness.core.errors",
    "OutOfPages": "harness.core.errors",
    "Unsupported": "harness.core.errors",
    "PagePool": "harness.core.kv_pages",
    "PoolLayout": "harness.core.kv_pages",
    "dp_page_range": "harness.core.kv_pages",
    "make_layer_caches": "harness.core.kv_pages",
    "DPBackendConfig": "harness.core.registry",
    "create_attention_backend": "harness.core.registry",
    "get_backend": "harness.core.registry",
    "list_backends": "harness.core.registry",
    "load_backend_spec": "harness.core.registry",
    "register_backend": "harness.core.registry",
    "check_rank_ownership": "harness.core.validate",
    "validate_backend_args": "harness.core.validate",
    "validate_layer_caches": "harness.core.validate",
    "validate_metadata": "harness.core.validate",
    "AttentionVariant": "harness.core.variants",
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


__version__ = "0.1.0"

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "AttentionVariant",
    "BackendLoadError",
    "CacheBindingError",
    "Capabilities",
    "DPBackendConfig",
    "ForeignPageError",
    "LayerCache",
    "MetadataError",
    "OutOfPages",
    "PagePool",
    "PoolLayout",
    "Unsupported",
    "check_rank_ownership",
    "create_attention_backend",
    "dp_page_range",
    "get_backend",
    "list_backends",
    "load_backend_spec",
    "make_layer_caches",
    "register_backend",
    "validate_backend_args",
    "validate_layer_caches",
    "validate_metadata",
]
