"""Many consecutive steps on one backend per rank: admit, prefill, extend, decode, fork, free.

Outputs are checked against the oracle and the cache against a canary after every step.
"""

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from harness.stateful import conformance_machine
from suites.conformance.conftest import DEVICE, PROFILE


def test_stateful_steps(backend_entry) -> None:
    machine = conformance_machine(backend_entry, PROFILE.budget, DEVICE)
    run_state_machine_as_test(
        machine,
        settings=settings(PROFILE.settings, stateful_step_count=PROFILE.stateful_steps),
    )
