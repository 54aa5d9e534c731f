"""Many consecutive steps on one backend per rank: admit, prefill, extend, decode, fork, free.

Outputs are checked against the oracle and the cache against a canary after
every step; each run's steps and the rules it reached are counted in the
coverage table.
"""

from hypothesis import settings

from attn_harness_pytest import (
    cost_ledger,
    current_item,
    profile_for,
    record_examples,
    record_run,
    replayable,
)
from harness.conformance.stateful import conformance_machine, run_machine
from suites.conformance.conftest import current_device


def test_stateful_steps(backend_entry) -> None:
    profile = profile_for(backend_entry)
    ledger = cost_ledger(backend_entry)  # interpreted: steps cut by their predicted cost
    machine = conformance_machine(
        backend_entry,
        profile.budget,
        current_device(),
        on_step=lambda scenario: record_examples(backend_entry.name, [scenario], example=False),
        on_run=lambda run: record_run(backend_entry.name, run),
        costs=None if ledger is None else ledger.for_test(backend_entry.name, current_item()),
        max_steps=profile.stateful_examples * profile.stateful_steps,
    )
    run_machine(
        replayable(machine),
        settings(
            profile.settings,
            max_examples=profile.stateful_examples,
            stateful_step_count=profile.stateful_steps,
        ),
    )
