"""Deprecated: ``harness.contract`` moved to ``harness.core.contract``; its public names are in
``harness``.

Kept so an adapter written against the old path still imports, with a
``DeprecationWarning`` that names the new one.
"""

from __future__ import annotations

import warnings

from harness.core import contract as _moved

globals().update({k: v for k, v in vars(_moved).items() if not k.startswith("__")})

warnings.warn(
    "harness.contract is deprecated: import these names from harness (the public names) "
    "or harness.core.contract",
    DeprecationWarning,
    stacklevel=2,
)
