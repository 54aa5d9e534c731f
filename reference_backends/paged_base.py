"""Where ``PagedBackendBase`` used to live; import it from ``harness.backend_kit``."""

from __future__ import annotations

from harness.core.paged_base import PagedBackendBase, PreparedStep

__all__ = ["PagedBackendBase", "PreparedStep"]
