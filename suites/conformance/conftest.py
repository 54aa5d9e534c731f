"""Shared pieces of the conformance tests: drawing inside a backend's claim, skipping refusals."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import reject
from hypothesis import strategies as st

from attn_harness_pytest import current_profile
from harness.errors import Unsupported
from harness.registry import BackendEntry
from harness.scenario import Scenario
from harness.strategies import multi_rank_scenarios, scenarios


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("attn_harness_pytest"):
        raise pytest.UsageError(
            "the conformance suite needs the attn-harness pytest plugin: install the package "
            "(it registers itself) or add -p attn_harness_pytest"
        )


PROFILE = current_profile()
"""The profile chosen with ``--conformance-profile``; its settings decorate every test."""
conformance_settings = PROFILE.settings


def draw_scenario(
    data: st.DataObject, entry: BackendEntry, profile: Any, min_dp_size: int = 1
) -> Scenario:
    return data.draw(
        scenarios(
            entry.capabilities,
            dp_aware=entry.accepts_dp,
            budget=profile.budget,
            min_dp_size=min_dp_size,
        ),
        label="scenario",
    )


def draw_ranks(data: st.DataObject, entry: BackendEntry, profile: Any) -> list[Scenario]:
    return data.draw(
        multi_rank_scenarios(entry.capabilities, dp_aware=entry.accepts_dp, budget=profile.budget),
        label="ranks",
    )


def require_dp(entry: BackendEntry) -> None:
    caps = entry.capabilities
    if not entry.accepts_dp or (caps.max_dp_size is not None and caps.max_dp_size < 2):
        pytest.skip(f"{entry.name} serves one rank only: no page is foreign to it")


def check(prop: Callable[..., None], *args: Any) -> None:
    """Run a property; a backend's ``Unsupported`` discards the draw instead of failing."""
    try:
        prop(*args)
    except Unsupported:
        reject()
