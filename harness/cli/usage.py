"""What the command line says, checked before any work: the checks argparse types cannot make.

A backend spec is checked by importing it, a workload name against the
workloads (which load torch), an output file by creating and removing a
probe file beside it: too heavy, or with effects, for a parser type. Every
command calls these before it writes anything, and ``harness.cli.main``
prints a ``UsageError`` as one line, ``attn-harness CMD: error: ...``, with
exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from harness.core.arg_types import MachineChecked

if TYPE_CHECKING:
    from harness.bench.workloads import Workload
    from harness.core.registry import BackendEntry


class UsageError(Exception):
    """A bad command line, found before anything runs: its message names the option and value."""


def command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The subcommand ``command``'s own parser (whose actions ``check_machine`` reads)."""
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found: argparse.ArgumentParser = sub.choices[command]
    return found


def check_machine(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every ``MachineChecked`` value of the parsed command against this machine, defaults too.

    A missing input file, an output folder that cannot be made, ``--device
    cuda`` without a GPU: the message argparse would give, before any work.
    """
    for action in parser._actions:
        if not isinstance(action.type, MachineChecked):
            continue
        given = getattr(args, action.dest, None)
        for value in given if isinstance(given, list) else [given]:
            if value is None:
                continue
            try:
                action.type.check(value)
            except argparse.ArgumentTypeError as exc:
                name = "/".join(action.option_strings) or action.metavar or action.dest
                raise UsageError(f"argument {name}: {exc}") from None


def resolve_backends(
    specs: Sequence[str], option: str = "--backend", *, device: str | None = None
) -> list[BackendEntry]:
    """The entries for ``specs`` (every registered one when none); a module's prints go to stderr.

    Loading a spec imports its module, whose prints must not break a table or
    JSON on stdout. With ``device``, a backend named that cannot run there (its
    engine not installed, or no claim of the device) is a usage error saying
    why, before any case runs: every case would fail or be skipped otherwise.
    """
    from harness.core.errors import BackendLoadError
    from harness.core.registry import default_registry

    registry = default_registry()
    entries = []
    with contextlib.redirect_stdout(sys.stderr):
        for spec in specs:
            try:
                entries.append(registry.resolve(spec))
            except KeyError as exc:
                raise UsageError(f"{option} {spec}: {exc.args[0]}") from None
            except BackendLoadError as exc:
                raise UsageError(f"{option} {spec}: {exc}") from None
            why = entries[-1].unavailable_on(device) if device is not None else None
            if why:
                raise UsageError(f"{option} {spec}: unavailable here: {why}")
        return entries if specs else registry.entries()


def workloads(names: Sequence[str], option: str = "--workload") -> list[Workload]:
    """The workloads named (the default set when none); an unknown name lists the known ones."""
    from harness.bench.workloads import DEFAULT_WORKLOADS, get_workload

    found = []
    for name in names or DEFAULT_WORKLOADS:
        try:
            found.append(get_workload(name))
        except KeyError as exc:
            raise UsageError(f"{option} {name}: {exc.args[0]}") from None
    return found


def writable(path: object, option: str) -> None:
    """``path`` can be written as the results store writes (a probe file, removed at once)."""
    from harness.core.atomic_file import unwritable_reason

    if path is not None and (problem := unwritable_reason(str(path))) is not None:
        raise UsageError(f"{option} {path}: {problem}")
