"""Write a whole file or nothing: a temporary file in the target's folder, renamed over it.

A reader (a CI step, another process, the next command) sees the old file or
the new one, never part of one, and a failure at any point removes the
temporary file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` atomically; ``mode`` because mkstemp makes files private."""
    target = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target
