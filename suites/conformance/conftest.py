"""Shared pieces of the conformance tests: the chosen profile and device, drawing inside
a backend's claim, and skipping what a backend declares it cannot do."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import strategies as st

from attn_harness_pytest import (
    backend_entry_of,
    cost_ledger,
    current_device,
    current_item,
    current_profile,
    keep_hypothesis_files_out_of_the_working_directory,
    profile_for,
    record_examples,
    record_failed_example,
    session,
)
from harness.conformance.claim_coverage import claim_summary
from harness.conformance.cost_budget import scenarios_work
from harness.conformance.instances import instance_groups
from harness.conformance.properties import PropertyFailure
from harness.conformance.run_coverage import junit_properties
from harness.conformance.step_strategies import (
    far_below_scenarios,
    multi_rank_scenarios,
    production_scenarios,
    scenarios,
)
from harness.core.deadlines import CaseTimeout, deadline
from harness.core.errors import Unsupported
from harness.core.registry import BackendEntry
from harness.core.threads import small_step_threads
from harness.core.triton_mode import interpret_triton_here
from harness.numerics.scenario import Scenario


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


keep_hypothesis_files_out_of_the_working_directory()
if current_device() == "cpu":  # Triton kernels run on CPU tensors only in its interpreter:
    interpret_triton_here()  # choose it before any backend module (which may import triton)


def _one_cpu_thread() -> None:
    """Run torch on one thread for the CPU cases (``small_step_threads``: why, and when not)."""
    threads = small_step_threads()
    if current_device() == "cpu" and threads is not None:
        torch.set_num_threads(threads)


_one_cpu_thread()
conformance_settings = current_profile().settings
"""The run's profile's hypothesis settings, for the tests' decorators.

Read when pytest imports the suite's modules, which it does inside the run,
after the plugin has read the command line; everything else here asks the
plugin when a test runs (``current_device()``, ``current_profile()``).
"""


@pytest.fixture(scope="session", autouse=True)
def _coverage_in_the_junit_report(
    request: pytest.FixtureRequest, record_testsuite_property: Callable[[str, object], None]
) -> Iterator[None]:
    """After the last test, the coverage tally as the JUnit report's test-suite properties
    (a no-op without ``--junitxml``)."""
    yield
    for name, value in junit_properties(session(request.config)):
        record_testsuite_property(name, value)


@pytest.fixture(autouse=True)
def _inside_claim(request: pytest.FixtureRequest) -> None:
    """Skip a backend whose claim leaves nothing to draw on this device."""
    entry = backend_entry_of(request.node)
    if entry is None:
        return
    caps = entry.capabilities
    device = current_device()
    if device not in caps.devices:
        pytest.skip(f"{entry.name} does not claim device {device!r} (claims {caps.devices})")
    if not caps.dtypes_on(device):
        pytest.skip(f"{entry.name} claims no dtype on {device!r}")
    if caps.page_sizes == () or caps.head_dims == ():  # an empty tuple claims none, unlike None
        pytest.skip(f"{entry.name} claims no page size or no head dim")


def draw_scenario(
    data: st.DataObject, entry: BackendEntry, min_dp_size: int = 1, dtype: Any = None
) -> Scenario:
    """One rank's step inside ``entry``'s claim (narrowed to ``dtype`` when given)."""
    caps = entry.capabilities if dtype is None else replace(entry.capabilities, dtypes=(dtype,))
    strategy = scenarios(
        caps,
        dp_aware=entry.accepts_dp,
        budget=profile_for(entry).budget,
        min_dp_size=min_dp_size,
        device=current_device(),
    )
    return data.draw(strategy, label="scenario")


def _draw_claimed(data: st.DataObject, entry: BackendEntry, make: Any, label: str) -> Any:
    """One draw of ``make(caps, ...)``, the strategy of steps inside ``entry``'s claim."""
    strategy = make(
        entry.capabilities,
        dp_aware=entry.accepts_dp,
        budget=profile_for(entry).budget,
        device=current_device(),
    )
    return data.draw(strategy, label=label)


def draw_far_below(data: st.DataObject, entry: BackendEntry) -> Scenario:
    """One rank's step whose rows' logits all lie far below zero (``far_below_scenarios``)."""
    return _draw_claimed(data, entry, far_below_scenarios, "far-below scenario")


def draw_production(data: st.DataObject, entry: BackendEntry, regime: str) -> Scenario:
    strategy = production_scenarios(
        entry.capabilities,
        regime,
        dp_aware=entry.accepts_dp,
        budget=profile_for(entry).budget,
        device=current_device(),
    )
    return data.draw(strategy, label=f"{regime} scenario")


def draw_ranks(data: st.DataObject, entry: BackendEntry) -> list[Scenario]:
    return _draw_claimed(data, entry, multi_rank_scenarios, "ranks")


def draw_instances(data: st.DataObject, entry: BackendEntry) -> list[Scenario]:
    """Two or three configurations of one step, for instances alive together (``instances``)."""
    return _draw_claimed(data, entry, instance_groups, "instances")


def require_dp(entry: BackendEntry) -> None:
    caps = entry.capabilities
    if not entry.accepts_dp or (caps.max_dp_size is not None and caps.max_dp_size < 2):
        pytest.skip(f"{entry.name} serves one rank only: no page is foreign to it")


class ExampleTimeout(BaseException):
    """An example overran the profile's time limit: a ``BaseException``, so hypothesis
    reports it at once instead of re-running a hang while it shrinks."""


def _scenarios(args: tuple[Any, ...]) -> list[Scenario]:
    found = [a for a in args if isinstance(a, Scenario)]
    return found + [s for a in args if isinstance(a, list) for s in a if isinstance(s, Scenario)]


def _shapes(args: tuple[Any, ...]) -> str:
    return "".join(f"\n  scenario: {s.describe()}" for s in _scenarios(args)[:4])


def refused_inside_claim(entry: BackendEntry, scenarios: list[Scenario], exc: Unsupported) -> str:
    """The report of an ``Unsupported`` for a draw the backend's capabilities claim."""
    return (
        f"backend {entry.name!r} raised Unsupported for a step inside its declared "
        f"capabilities: {exc}\n  claimed vs drawn: {claim_summary(entry.capabilities, scenarios)}"
        "\n  A backend that cannot do something declares it in capabilities(); the suite "
        "then never draws it." + "".join(f"\n  scenario: {s.describe()}" for s in scenarios[:4])
    )


def check(prop: Callable[..., None], entry: BackendEntry, *args: Any) -> None:
    """Run a property within the profile's time limit and count what it checked.

    Every draw lies inside the backend's claim, so an ``Unsupported`` from
    the backend is a failure that names the claim it breaks; a crash (out of
    memory included) or an overrun fails with the drawn shape named. A
    failure is re-raised as text, detached from the frames that raised it:
    hypothesis keeps every distinct failure while it shrinks, and their
    frames hold the step's caches (hundreds of MB on a production shape).

    A backend that runs interpreted is sized by cost instead: an example whose
    predicted cost does not fit what is left of the test's budget, or that
    overruns its deadline, is recorded as not checked and returns, since the
    profile chose a shape the run cannot afford (``cost_budget``).
    """
    ledger = cost_ledger(entry)
    if ledger is not None:
        _check_within_budget(ledger, prop, entry, *args)
        return
    _check(prop, entry, current_profile().example_time_limit_s, *args)


def _check_within_budget(
    ledger: Any, prop: Callable[..., None], entry: BackendEntry, *args: Any
) -> None:
    scenarios = _scenarios((entry, *args))
    costs = ledger.for_test(entry.name, current_item())
    work = scenarios_work(scenarios, entry.capabilities.query_tile)
    shown = "; ".join(s.describe() for s in scenarios[:2])
    if not costs.admit(work, shown):
        return
    limit = min(current_profile().example_time_limit_s, costs.deadline_s())
    start = time.perf_counter()
    try:
        _check(prop, entry, limit, *args, overrun_fails=False)
    except ExampleTimeout:
        costs.overran(work, time.perf_counter() - start, shown)
        return
    except BaseException:
        costs.failed()  # shrinking and the replay run every example, as the first run did
        costs.spend(time.perf_counter() - start)  # shrinking is paid from the same budget
        raise
    costs.charge(work, time.perf_counter() - start)


def _check(
    prop: Callable[..., None],
    entry: BackendEntry,
    limit: float,
    *args: Any,
    overrun_fails: bool = True,
) -> None:
    """Run ``prop`` once under ``limit``; an overrun is the triage's evidence of a
    failure only where it fails the test (``overrun_fails``)."""
    failure: BaseException | None = None
    args = (entry, *args)
    try:
        with deadline(limit):
            prop(*args)
    except Unsupported as exc:
        failure = PropertyFailure(refused_inside_claim(entry, _scenarios(args), exc))
    except CaseTimeout:
        message = f"{prop.__name__} took longer than the {limit:g} s per-example limit"
        failure = ExampleTimeout(message + _shapes(args))
    except AssertionError as exc:
        failure = (
            type(exc)(*exc.args)
            if isinstance(exc, PropertyFailure)
            else AssertionError(str(exc) + _shapes(args))
        )
    except Exception as exc:
        where = "".join(traceback.format_exception(exc, limit=-4)).rstrip()
        failure = PropertyFailure(
            f"{prop.__name__} crashed: {type(exc).__name__}: {exc}{_shapes(args)}\n{where}"
        )
    if failure is not None:
        if overrun_fails or not isinstance(failure, ExampleTimeout):
            record_failed_example(entry.name, _scenarios(args))
        raise failure
    record_examples(entry.name, _scenarios(args))  # an example that held
