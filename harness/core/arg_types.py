"""argparse value types shared by every command line, and the parser that answers in one line.

The ``attn-harness`` commands and the module entry points below the CLI layer
(the report's browser check, the GPU script, the dist worker) check their
values with these, so the same mistake gets the same one-line message and
exit status 2 everywhere, before any work starts. Standard library only
(``--help`` must not load torch): only ``device`` imports torch, and only to
ask whether a CUDA device is there when ``cuda`` is asked for.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from harness.core.exit_codes import EXIT_USAGE


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose error is one line on stderr (``PROG: error: ...``), exit 2.

    argparse prints the usage text before the error; a command line with one
    bad value then fills a CI log with a screen of usage. The subcommand
    parsers inherit the class, so ``PROG`` names the command
    (``attn-harness bench: error: argument --threads: must be >= 1, got 0``).
    """

    def error(self, message: str) -> NoReturn:
        hint = f" (see '{self.prog} --help')" if "required" in message else ""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}{hint}\n")


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        return kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None


def at_least(low: int) -> Callable[[str], int]:
    """An integer ``>= low`` (``at_least(0)`` for counts that may be zero)."""

    def parse(text: str) -> int:
        value = int(_number(text, int))
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"  # argparse names the type in its messages
    return parse


positive_int = at_least(1)
"""An integer ``>= 1``: a count of steps, ranks, sequences, repeats."""


def integer(text: str) -> int:
    """Any integer (a seed), with the same message as the others for one that is not."""
    return int(_number(text, int))


def positive_float(text: str) -> float:
    """A number ``> 0`` (NaN refused): a duration in seconds, a size factor."""
    value = _number(text, float)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def fraction(text: str) -> float:
    """A relative change such as 0.05 for 5%: ``> 0`` and below 10 (1000%)."""
    value = _number(text, float)
    if not 0.0 < value < 10.0:
        raise argparse.ArgumentTypeError(f"must be a fraction > 0 such as 0.05, got {text}")
    return value


def one_of(noun: str, choices: Sequence[str]) -> Callable[[str], str]:
    """One of ``choices``; anything else is ``unknown NOUN 'x' (choose from a, b, c)``.

    A type rather than argparse's ``choices``: the message says what kind of
    name was wrong, and the help keeps the option's own metavar.
    """
    allowed = tuple(choices)

    def parse(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(
                f"unknown {noun} {text!r} (choose from {', '.join(allowed)})"
            )
        return text

    parse.__name__ = noun
    return parse


DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "float16", "bfloat16")
"""The device and dtype names a command line takes (``harness.core.dtypes`` maps the dtypes)."""

dtype = one_of("dtype", DTYPES)


def device(text: str) -> str:
    """``cpu``, or ``cuda`` where torch sees a CUDA device: refused here, not by every worker."""
    name = one_of("device", DEVICES)(text)
    if name == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(
                f"cuda: no CUDA device is available (torch {torch.__version__}, "
                f"built with CUDA {torch.version.cuda or 'no'})"
            )
    return name


def torch_device(text: str) -> str:
    """``device``, or ``cuda:N`` naming a CUDA device torch sees (one process per rank)."""
    kind, colon, index = text.partition(":")
    if not colon:
        return device(text)
    if kind != "cuda" or not index.isdigit():
        raise argparse.ArgumentTypeError(f"unknown device {text!r} (choose from cpu, cuda, cuda:N)")
    device(kind)
    import torch

    if int(index) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(
            f"{text}: torch sees {torch.cuda.device_count()} CUDA device(s)"
        )
    return text


def input_path(text: str) -> str:
    """A file or folder that exists and can be read: an input named on the command line."""
    path = Path(text)
    if not text or not path.exists():
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    if not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
        raise argparse.ArgumentTypeError(f"{text} cannot be read")
    return text


def input_file(text: str) -> str:
    """A file that exists and can be read (not a folder)."""
    if Path(input_path(text)).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    return text


def _writable_folder(folder: Path, prefix: str) -> None:
    if not folder.is_dir():
        what = "is not a directory" if folder.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"{prefix}: folder {folder} {what}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{prefix}: cannot write in folder {folder}")


def output_file(text: str) -> str:
    """A file that can be written: not a folder, in a folder that exists and can be written.

    Nothing is created here; the command writes the file (atomically) once it has it.
    """
    path = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("expected a file name, got ''")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory")
    _writable_folder(path.parent if str(path.parent) else Path("."), text)
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text} is not writable")
    return text


def output_dir(text: str) -> str:
    """A folder that exists and can be written, or one that can be made (in such a folder).

    Its missing parents may be made too, so the check walks up to the
    nearest folder that exists; nothing is created here.
    """
    path = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("expected a folder name, got ''")
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    existing = path
    while not existing.exists():
        existing = existing.parent
    _writable_folder(existing, f"cannot create {text}" if existing != path else text)
    return text


def creatable_file(text: str) -> str:
    """``output_file``, but its folder (and missing parents) may be made when it is written."""
    path = Path(text)
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file name")
    output_dir(str(path.parent))
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text} is not writable")
    return text


def name_pair(text: str) -> tuple[str, str]:
    """``LEFT=RIGHT`` with both sides non-empty: a renaming such as ``--match NEW=OLD``."""
    left, sep, right = text.partition("=")
    if not sep or not left or not right:
        raise argparse.ArgumentTypeError(f"expected NAME=NAME, got {text!r}")
    return left, right
