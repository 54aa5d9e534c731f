"""Shared pieces of the conformance tests: the chosen profile and device, drawing inside
a backend's claim, and skipping what a backend declares it cannot do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import reject
from hypothesis import strategies as st

from attn_harness_pytest import current_device, current_profile
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
    if config.getoption("conformance_device") == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError("--conformance-device cuda: no CUDA device is available")


PROFILE = current_profile()
"""The ``--conformance-profile``: its settings decorate every test, its budget sizes draws."""
DEVICE = current_device()
conformance_settings = PROFILE.settings


@pytest.fixture(autouse=True)
def _inside_claim(request: pytest.FixtureRequest) -> None:
    """Skip a backend whose claim leaves nothing to draw on this device."""
    callspec = getattr(request.node, "callspec", None)
    entry = callspec.params.get("backend_entry") if callspec is not None else None
    if entry is None:
        return
    caps = entry.capabilities
    if DEVICE not in caps.devices:
        pytest.skip(f"{entry.name} does not claim device {DEVICE!r} (claims {caps.devices})")
    if not caps.dtypes:
        pytest.skip(f"{entry.name} claims no dtype")


def draw_scenario(data: st.DataObject, entry: BackendEntry, min_dp_size: int = 1) -> Scenario:
    strategy = scenarios(
        entry.capabilities,
        dp_aware=entry.accepts_dp,
        budget=PROFILE.budget,
        min_dp_size=min_dp_size,
        device=DEVICE,
    )
    return data.draw(strategy, label="scenario")


def draw_ranks(data: st.DataObject, entry: BackendEntry) -> list[Scenario]:
    strategy = multi_rank_scenarios(
        entry.capabilities, dp_aware=entry.accepts_dp, budget=PROFILE.budget, device=DEVICE
    )
    return data.draw(strategy, label="ranks")


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
