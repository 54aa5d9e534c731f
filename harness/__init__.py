"""attn-harness: conformance and benchmarks for DP-partitioned paged attention backends.

The names below are the public API; everything else is
reachable through its module.
"""

from __future__ import annotations

from harness.contract import AttentionBackend, AttentionMetadata, Capabilities, LayerCache
from harness.errors import (
    BackendLoadError,
    CacheBindingError,
    ForeignPageError,
    MetadataError,
    OutOfPages,
    Unsupported,
)
from harness.kv_pages import PagePool, PoolLayout, dp_page_range, make_layer_caches
from harness.registry import (
    DPBackendConfig,
    create_attention_backend,
    get_backend,
    list_backends,
    load_backend_spec,
    register_backend,
)
from harness.validate import (
    check_rank_ownership,
    validate_backend_args,
    validate_layer_caches,
    validate_metadata,
)

__version__ = "0.1.0"

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
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
