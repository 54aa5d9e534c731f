"""Deprecated: ``PagedBackendBase`` and ``PreparedStep`` are in ``harness.backend_kit``.

Kept so a backend written against this old path still imports, with a
``DeprecationWarning`` that names the new one.
"""

from __future__ import annotations

import warnings

from harness.core.paged_base import PagedBackendBase, PreparedStep

__all__ = ["PagedBackendBase", "PreparedStep"]

warnings.warn(
    "reference_backends.paged_base is deprecated: import PagedBackendBase and PreparedStep "
    "from harness.backend_kit",
    DeprecationWarning,
    stacklevel=2,
)
