"""What one conformance run was asked for: the plugin's command-line options, checked.

The plugin (``attn_harness_pytest``) reads them from pytest's command line
(``ConformanceOptions.from_namespace``); a bad value raises ``ValueError``,
which the plugin turns into a pytest usage error.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from harness.conformance.plugin_names import PROFILE_NAMES
from harness.core.shards import Shard


@dataclass(frozen=True)
class ConformanceOptions:
    """What one run was asked for: the plugin's command-line options, checked."""

    profile: str = "ci"
    device: str = "cpu"
    time_limit: float | None = None  # --example-time-limit, seconds
    examples: int | None = None  # --examples: per property test, instead of the profile's
    interpreted_budget: float | None = None  # --interpreted-budget: seconds for the run
    max_shrinks: int | None = None  # --max-shrinks: shrinking asked for, even under kill
    specs: tuple[str, ...] = ()  # --backend (empty: every registered backend on the device)
    replay: str | None = None  # --replay TEST[@VERSION:BLOB]
    cli: bool = False  # run by `attn-harness conform`: replay commands name that command
    shard: Shard | None = None  # --shard K/N: this run's share of the tests

    def __post_init__(self) -> None:
        if self.profile not in PROFILE_NAMES:
            raise ValueError(f"unknown profile {self.profile!r}; choose from {PROFILE_NAMES}")
        if self.examples is not None and self.examples < 1:
            raise ValueError(f"--examples must be >= 1, got {self.examples}")
        if self.interpreted_budget is not None and not self.interpreted_budget > 0:
            raise ValueError(f"--interpreted-budget must be > 0, got {self.interpreted_budget:g}")

    @classmethod
    def from_namespace(cls, options: Any) -> ConformanceOptions:
        """From pytest's parsed options (``config.option`` or the early namespace)."""
        return cls(
            profile=options.conformance_profile,
            device=options.conformance_device,
            time_limit=options.example_time_limit,
            examples=options.examples,
            interpreted_budget=getattr(options, "interpreted_budget", None),
            max_shrinks=getattr(options, "max_shrinks", None),
            specs=tuple(getattr(options, "backend", None) or ()),
            replay=getattr(options, "replay", None),
            cli=bool(getattr(options, "conformance_cli", False)),
            shard=_shard(getattr(options, "shard", None)),
        )


def _shard(text: str | None) -> Shard | None:
    """``--shard K/N`` (``1/1`` is the whole run, as no shard)."""
    if not text:
        return None
    return Shard.parse(text)


def parse_replay(value: str | None) -> tuple[str, str | None, bytes | None] | None:
    """``--replay``: ``(test, hypothesis version, blob)``, or the test's name alone."""
    if not value:
        return None
    if "@" not in value:
        return value, None, None
    from harness.conformance.report import parse_replay as parse_token

    return parse_token(value)


def add_options(group: Any) -> None:
    """The plugin's command-line options, on pytest's option ``group``."""
    group.addoption(
        "--backend",
        action="append",
        default=[],
        metavar="SPEC",
        help="backend to check: a registered name, package.module:Class or "
        "path/to/file.py:Class (repeatable; default: every registered backend)",
    )
    group.addoption(
        "--conformance-profile",
        choices=PROFILE_NAMES,
        default="ci",
        help="ci: derandomized and bounded (default); thorough: random, more and larger "
        "examples; kill: fewer examples, no shrinking (mutation testing)",
    )
    group.addoption(
        "--conformance-device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="device the conformance cases run on (default: cpu)",
    )
    group.addoption(
        "--example-time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="fail an example (naming its shape) that runs longer than this "
        "(default: the profile's, 300 s)",
    )
    group.addoption(
        "--interpreted-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds of examples an interpreted backend's run may spend, parted among its "
        "tests; an example whose predicted cost does not fit is reported as not checked "
        "(default: the profile's, 200 s for ci, 2000 s for thorough)",
    )
    group.addoption(
        "--examples",
        type=int,
        default=None,
        metavar="N",
        help="examples per property test (default: the profile's, 100 for ci); fewer for a "
        "slow backend, more for a deeper run; below the profile's count, coverage is "
        "reported but not required",
    )
    group.addoption(
        "--shrink-time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop shrinking a failure after this long and report the smallest example found "
        "so far (default: hypothesis's, 300 s); lower it for a slow backend",
    )
    group.addoption(
        "--max-shrinks",
        type=int,
        default=None,
        metavar="N",
        help="stop shrinking a failure after N smaller failing examples (default: "
        "hypothesis's, 500): a budget that does not depend on the machine's speed, so a run "
        "that keeps the time limit out of reach shrinks alike on a busy and a quiet machine; "
        "under the kill profile, which does not shrink, it turns shrinking on",
    )
    group.addoption(
        "--replay",
        default=None,
        metavar="TEST@VERSION:BLOB",
        help="rerun exactly one failing example, as a failure report prints it (or TEST "
        "alone: rerun that one test); every other test is deselected",
    )
    group.addoption(
        "--shard",
        default=None,
        metavar="K/N",
        help="run shard K of N: a fixed, balanced share of the tests, the same on every "
        "machine; the shards' --junitxml files merge (attn-harness merge) into the verdict "
        "and coverage of the whole run, where the coverage promises are judged",
    )
    group.addoption(
        "--conformance-output",
        choices=("pytest", "compact"),
        default="pytest",
        help="pytest: pytest's report, then the verdict table (default); compact: only a "
        "header, a live line on a terminal, the verdict table and one entry per failure",
    )
    group.addoption(
        "--progress-every",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="with the compact output and no terminal: print a progress line (tests done, "
        "an estimate of the rest) this often (default: 30 s)",
    )
    group.addoption(
        "--conformance-cli",
        action="store_true",
        help=argparse.SUPPRESS,  # set by `attn-harness conform`: replays name that command
    )
    group.addoption(
        "--coverage-json",
        default=None,
        metavar="PATH",
        help="write the coverage tally here as JSON (default: next to --junitxml, "
        "as NAME.coverage.json)",
    )
