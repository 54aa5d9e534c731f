"""Attention variants' optional outputs and keywords, for a backend that claims them.

The variants themselves (sliding window, soft-cap, sinks, ALiBi, FP8 caches,
the HND layout) need no test of their own: every property draws them inside
the backend's claim, so each one is checked against the oracle, the canary,
the layouts and the stateful runs. Here: ``forward_with_lse`` against the
oracle's log-sum-exp, ``forward(..., out=)`` returning its own buffer (a
strided one too) and writing nothing else, and bad variant keywords refused
with a ``ValueError`` that names them.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.conformance.properties import check_lse_matches_oracle, check_out_buffer_is_the_result
from harness.conformance.rejection_properties import (
    BAD_VARIANT_VALUES,
    check_variant_constructor_rejects,
    variant_keyword_claimed,
)
from suites.conformance.conftest import check, conformance_settings, draw_scenario


def _require(entry, flag: str) -> None:
    if not getattr(entry.capabilities, flag):
        pytest.skip(f"{entry.name} does not claim {flag}")


@conformance_settings
@given(data=st.data())
def test_lse_matches_oracle(backend_entry, data) -> None:
    _require(backend_entry, "lse")
    check(check_lse_matches_oracle, backend_entry, draw_scenario(data, backend_entry))


@conformance_settings
@given(data=st.data(), strided=st.booleans())
def test_out_buffer_is_the_result(backend_entry, data, strided) -> None:
    _require(backend_entry, "out_buffer")
    check(
        check_out_buffer_is_the_result, backend_entry, draw_scenario(data, backend_entry), strided
    )


@pytest.mark.parametrize(
    ("keyword", "changes"), BAD_VARIANT_VALUES, ids=[f"{k}={c}" for k, c in BAD_VARIANT_VALUES]
)
def test_variant_keywords_rejected(backend_entry, keyword, changes) -> None:
    if not variant_keyword_claimed(backend_entry.capabilities, keyword):
        pytest.skip(f"{backend_entry.name} does not take {keyword}")
    check(check_variant_constructor_rejects, backend_entry, keyword, changes)
