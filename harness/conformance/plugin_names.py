"""What the pytest plugin and the conformance modules both name, importing nothing heavy.

The plugin's entry point (``attn_harness_pytest``) sits above this package
and imports from it; keeping these here lets the runner, the profiles and
the report use them without importing the plugin back (no cycle).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PROFILE_NAMES = ("ci", "thorough", "kill")
"""The conformance profiles (``harness.conformance.profiles`` defines each)."""


def cache_root() -> Path:
    """Outside any repository: ``$ATTN_HARNESS_CACHE`` or ``~/.cache/attn-harness``."""
    return Path(os.environ.get("ATTN_HARNESS_CACHE") or Path.home() / ".cache" / "attn-harness")


def backend_entry_of(item: Any) -> Any:
    """The backend a conformance test runs on (its ``backend_entry`` parameter), else ``None``."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("backend_entry") if callspec is not None else None
