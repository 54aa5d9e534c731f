"""argparse value types shared by every command line, and the parser that answers in one line.

The ``attn-harness`` commands and the module entry points below the CLI layer
(the report's browser check, the GPU script, the dist worker) check their
values with these, so the same mistake gets the same one-line message and
exit status 2 everywhere, before any work starts. Standard library only
(``--help`` must not load torch): only ``device`` imports torch, and only to
ask whether a CUDA device is there when ``cuda`` is asked for. A
``MachineChecked`` type splits its check in two: the parser checks the form,
a check after parsing asks the machine (``harness.cli.usage.check_machine``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from harness.core.atomic_file import unwritable_reason
from harness.core.exit_codes import EXIT_USAGE
from harness.core.shards import Shard


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


def cpu_list(text: str) -> tuple[int, ...]:
    """CPU numbers as Linux writes them (``1``, ``0-3``, ``0,2-3``); ``none``: the empty tuple."""
    if text.strip().lower() == "none":
        return ()
    cpus: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise argparse.ArgumentTypeError(
                f"expected CPU numbers such as 1, 0-3 or 0,2-3 (or none), got {text!r}"
            )
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise argparse.ArgumentTypeError(f"CPU range {part.strip()!r} runs backwards")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


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


class MachineChecked:
    """A type whose form the parser checks and whose fit to this machine is checked after.

    ``type(text)`` checks the form (a device's name, a non-empty path), so a
    command line from the docs parses anywhere. ``check(value)`` asks the
    machine (is there a CUDA device, does the file exist, can the folder be
    written); ``harness.cli.usage.check_machine`` runs it for every such
    option of the parsed command, before the command does anything.
    """

    def __init__(self, name: str, form: Callable[[str], str], check: Callable[[str], None]) -> None:
        self.__name__ = name  # argparse names the type in its messages
        self._form, self._check = form, check

    def __call__(self, text: str) -> str:
        return self._form(text)

    def check(self, value: str) -> None:
        """``ArgumentTypeError`` when ``value`` does not fit this machine."""
        self._check(value)


def _device_form(text: str) -> str:
    kind, colon, index = text.partition(":")
    if colon and kind == "cuda" and index.isdigit():
        return text
    if colon:
        raise argparse.ArgumentTypeError(f"unknown device {text!r} (choose from cpu, cuda, cuda:N)")
    return one_of("device", DEVICES)(text)


def _device_present(value: str) -> None:
    if not value.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(
            f"{value}: no CUDA device is available (torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda or 'no'})"
        )
    _, _, index = value.partition(":")
    if index and int(index) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(
            f"{value}: torch sees {torch.cuda.device_count()} CUDA device(s)"
        )


def _cpu_or_cuda(text: str) -> str:
    return one_of("device", DEVICES)(text)


device = MachineChecked("device", _cpu_or_cuda, _device_present)
"""``cpu``, or ``cuda`` where torch sees a CUDA device: refused up front, not by every worker."""

torch_device = MachineChecked("device", _device_form, _device_present)
"""``device``, or ``cuda:N`` naming a CUDA device torch sees (one process per rank)."""


def _named(noun: str) -> Callable[[str], str]:
    def form(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"expected a {noun} name, got ''")
        return text

    return form


def _readable(text: str) -> None:
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    if not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
        raise argparse.ArgumentTypeError(f"{text} cannot be read")


def _readable_file(text: str) -> None:
    _readable(text)
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")


def _writable_folder(text: str) -> None:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    if (problem := unwritable_reason(path / ".probe")) is not None:
        raise argparse.ArgumentTypeError(f"{text}: {problem}")


def _file_writable(text: str) -> None:
    if (problem := unwritable_reason(text)) is not None:
        raise argparse.ArgumentTypeError(f"{text}: {problem}")


input_path = MachineChecked("path", _named("file or folder"), _readable)
"""A file or folder that exists and can be read: an input named on the command line."""

input_file = MachineChecked("file", _named("file"), _readable_file)
"""A file that exists and can be read (not a folder)."""

output_file = MachineChecked("file", _named("file"), _file_writable)
"""A file that can be written: not a folder; its folder exists and can be written, or can
be made (``harness.core.atomic_file.unwritable_reason``). Nothing is created by the check;
the command writes the file (atomically, making missing folders) once it has it."""

output_dir = MachineChecked("folder", _named("folder"), _writable_folder)
"""A folder that exists and can be written, or can be made: the nearest folder above it
that exists can be written (missing parents are made too). Nothing is created by the check."""


def name_pair(text: str) -> tuple[str, str]:
    """``LEFT=RIGHT`` with both sides non-empty: a renaming such as ``--match NEW=OLD``."""
    left, sep, right = text.partition("=")
    if not sep or not left or not right:
        raise argparse.ArgumentTypeError(f"expected NAME=NAME, got {text!r}")
    return left, right


def shard(text: str) -> Shard:
    """``K/N``: shard K (from 1) of N: the share of a sweep one machine runs."""
    try:
        return Shard.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
