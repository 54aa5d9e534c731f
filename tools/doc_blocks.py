"""The fenced code blocks of a Markdown doc, and the files its Python blocks define.

A doc's Python block whose first line is a comment naming a file
(``# my_backend.py``) is that file's whole text. tests/test_docs.py writes such
files and runs the doc's other blocks beside them; tools/guide_figures.py
writes them to measure the figures docs/write-a-backend.md quotes. Both read
the doc here, so they cannot disagree about what the file holds.
"""

from __future__ import annotations

import re
from pathlib import Path

FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
FILE_COMMENT = re.compile(r"# ([\w.-]+\.py)")


def code_blocks(path: Path, language: str) -> list[str]:
    """The bodies of ``path``'s code blocks fenced as ``language``, in order."""
    return [body for lang, body in FENCE.findall(path.read_text()) if lang == language]


def named_file(block: str) -> str | None:
    """The file name a block's first line names (``# my_backend.py``), else ``None``."""
    lines = block.splitlines()
    named = FILE_COMMENT.fullmatch(lines[0]) if lines else None
    return named.group(1) if named else None


def doc_files(path: Path) -> dict[str, str]:
    """Each file the doc's Python blocks define: its name and its text, in the doc's order."""
    return {
        name: block
        for block in code_blocks(path, "python")
        if (name := named_file(block)) is not None
    }
