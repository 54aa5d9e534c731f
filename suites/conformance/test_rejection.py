"""Property 4: what the contract demands an outside backend reject, with ``ValueError``.

Foreign pages and slots in ``prepare`` (a whole foreign step, one foreign
in-use block-table entry, one foreign slot), caches that do not hold the rank's
pages or disagree with its heads in ``bind_kv_caches``, bad constructor
values; and stale ids past a row's in-use entries are not rejected. (The
harness's own metadata validator is tested field by field in
the harness's unit tests.)
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.conformance.rejection_properties import (
    BAD_CONSTRUCTOR_VALUES,
    check_bind_rejects_unbound_range,
    check_constructor_rejects,
    check_rejects_foreign_block_table_entry,
    check_rejects_foreign_pages,
    check_rejects_foreign_slot,
    check_stale_block_table_entries_ignored,
)
from harness.core.errors import Unsupported
from suites.conformance.conftest import check, conformance_settings, draw_scenario, require_dp


@conformance_settings
@given(data=st.data())
def test_foreign_pages_rejected(backend_entry, data) -> None:
    require_dp(backend_entry)
    check(
        check_rejects_foreign_pages,
        backend_entry,
        draw_scenario(data, backend_entry, min_dp_size=2),
    )


@conformance_settings
@given(data=st.data())
def test_foreign_block_table_entry_rejected(backend_entry, data) -> None:
    require_dp(backend_entry)
    check(
        check_rejects_foreign_block_table_entry,
        backend_entry,
        draw_scenario(data, backend_entry, min_dp_size=2),
    )


@conformance_settings
@given(data=st.data())
def test_stale_block_table_entries_ignored(backend_entry, data) -> None:
    check(
        check_stale_block_table_entries_ignored,
        backend_entry,
        draw_scenario(data, backend_entry),
    )


@conformance_settings
@given(data=st.data())
def test_foreign_slot_rejected(backend_entry, data) -> None:
    require_dp(backend_entry)
    check(
        check_rejects_foreign_slot,
        backend_entry,
        draw_scenario(data, backend_entry, min_dp_size=2),
    )


@conformance_settings
@given(data=st.data())
def test_bind_rejects_caches_without_the_ranks_pages(backend_entry, data) -> None:
    require_dp(backend_entry)
    check(
        check_bind_rejects_unbound_range,
        backend_entry,
        draw_scenario(data, backend_entry, min_dp_size=2),
    )


@pytest.mark.parametrize(
    ("field", "changes"),
    BAD_CONSTRUCTOR_VALUES,
    ids=[",".join(f"{k}={v}" for k, v in changes.items()) for _, changes in BAD_CONSTRUCTOR_VALUES],
)
def test_constructor_rejects_bad_values(backend_entry, field, changes) -> None:
    try:
        check_constructor_rejects(backend_entry, field, changes)
    except Unsupported as exc:
        pytest.skip(str(exc))
