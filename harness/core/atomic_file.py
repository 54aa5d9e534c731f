"""Write a whole file or nothing: a temporary file in the target's folder, renamed over it.

A reader (a CI step, another process, the next command, a rank polling a heartbeat)
sees the old file or the new one, never part of one, and a failure at any point
removes the temporary file. The one place the project writes a file it shares, and
the one check of whether it can (``unwritable_reason``), made before a long run starts.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _ordinary_mode(target: Path) -> int:
    """The target's mode when it exists, else what ``open()`` would give (0666 less umask).

    Needed because mkstemp makes the temporary file private (0600).
    """
    if target.exists():
        return target.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomically(
    path: str | os.PathLike[str],
    data: bytes | str,
    mode: int | None = None,
    *,
    durable: bool = False,
) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` atomically; return the path.

    ``mode``: the file's permissions (default: the old file's, or an ordinary
    new file's). ``durable``: fsync before the rename, for results that must
    survive a crash of the machine, not just of the process. The parent folder
    is created when missing.
    """
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(payload)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(temporary, _ordinary_mode(target) if mode is None else mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def write_json_atomically(
    path: str | os.PathLike[str], data: Any, *, indent: int | None = 1, allow_nan: bool = True
) -> Path:
    """``data`` as JSON (one trailing newline), written with :func:`write_atomically`.

    Serialisation happens before anything touches the disk, so data that cannot
    be written as JSON leaves the old file as it was.
    """
    text = json.dumps(data, indent=indent, allow_nan=allow_nan) + "\n"
    return write_atomically(path, text)


def unwritable_reason(path: str | os.PathLike[str]) -> str | None:
    """Why ``write_atomically(path)`` would fail, or ``None``; creates nothing that stays.

    A missing folder is no problem (the write makes it), so the nearest folder
    above that exists must take a new entry: a temporary file is made there and
    removed at once, which is what shows a read-only mount or a permission.
    """
    target = Path(path)
    if target.is_dir():
        return f"{target} is a directory"
    existing = target.parent if str(target.parent) else Path(".")
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=f".{target.name}.", suffix=".probe"):
            pass
    except OSError as exc:
        return f"cannot write in {existing}: {exc.strerror or exc}"
    if target.exists() and not os.access(target, os.W_OK):
        return f"{target} is not writable"
    return None
