"""``Capabilities.padding_rows``: what a backend promises of graph-mode padding rows is
checked on every padded step, and nothing is asked of a backend that promises nothing."""

from __future__ import annotations

import dataclasses

import pytest

from harness.conformance.properties import check_matches_oracle
from harness.core.contract import PADDING_ROWS, Capabilities
from harness.core.errors import PropertyFailure
from harness.core.registry import BackendEntry, default_registry
from harness.numerics.scenario import Scenario
from suites.mutants.padding import (
    PaddingRowsLeftStale,
    PaddingRowsReadPageZero,
    PaddingRowsZeroOverZero,
)

PADDED = Scenario(
    context_lens=(5, 9), query_lens=(1, 9), pad_to=4, pad_query_len=2, shuffle_pages=True, seed=2
)
"""A padded step whose pool's first page holds no token (pages handed out shuffled)."""


def test_an_unknown_promise_is_refused_by_name():
    with pytest.raises(ValueError, match="padding_rows"):
        Capabilities(padding_rows="clean")
    assert PADDING_ROWS == ("unspecified", "finite", "zero")


@pytest.mark.parametrize(
    "cls", [PaddingRowsZeroOverZero, PaddingRowsLeftStale, PaddingRowsReadPageZero]
)
def test_non_finite_padding_rows_fail_a_finite_promise(cls):
    entry = BackendEntry(cls.__name__, cls, "test")
    with pytest.raises(PropertyFailure, match="padding rows"):
        check_matches_oracle(entry, PADDED)
    check_matches_oracle(entry, dataclasses.replace(PADDED, pad_to=None))  # real rows exact


def test_without_a_promise_padding_rows_are_not_read():
    class Unpromised(PaddingRowsZeroOverZero):
        @classmethod
        def capabilities(cls) -> Capabilities:
            return dataclasses.replace(super().capabilities(), padding_rows="unspecified")

    check_matches_oracle(BackendEntry("unpromised", Unpromised, "test"), PADDED)


@pytest.mark.parametrize("name", ["reference", "sdpa", "compiled", "flex"])
def test_the_built_ins_keep_their_zero_promise(name):
    entry = default_registry().entry(name)
    assert entry.capabilities.padding_rows == "zero"
    check_matches_oracle(entry, PADDED)
