"""Property 2: outputs match the oracle on every rank; ranks run together equal each alone.

The main oracle property runs once per claimed dtype, each with an equal
share of the profile's examples, so that fp32, fp16 and bf16 are each
checked as often (hypothesis alone draws one of them in a few percent).
A quarter as many again go to rows whose logits all lie far below zero,
under a sliding window where one is claimed: there a finite mask value or
running-max sentinel outweighs every visible key (vLLM's ``-10000`` window
mask), which plain draws reach only when a window and such an offset meet.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_harness_pytest import profile_for, replayable
from harness.conformance.properties import (
    check_every_rank_matches_oracle,
    check_matches_oracle,
    check_ranks_together_equal_alone,
)
from suites.conformance.conftest import (
    check,
    conformance_settings,
    current_device,
    draw_far_below,
    draw_ranks,
    draw_scenario,
)

DTYPES = ("float32", "float16", "bfloat16")


@pytest.mark.parametrize("dtype", DTYPES)
def test_outputs_match_oracle(backend_entry, dtype) -> None:
    claimed = backend_entry.capabilities.dtypes_on(current_device())
    if getattr(torch, dtype) not in claimed:
        pytest.skip(f"{backend_entry.name} does not claim {dtype} on {current_device()}")
    share = math.ceil(profile_for(backend_entry).settings.max_examples / len(claimed))

    @settings(conformance_settings, max_examples=share)
    @given(data=st.data())
    def outputs_match_oracle(data: st.DataObject) -> None:
        scenario = draw_scenario(data, backend_entry, dtype=getattr(torch, dtype))
        check(check_matches_oracle, backend_entry, scenario)

    replayable(outputs_match_oracle)()


def test_rows_far_below_zero_match_oracle(backend_entry) -> None:
    share = max(5, profile_for(backend_entry).settings.max_examples // 4)

    @settings(conformance_settings, max_examples=share)
    @given(data=st.data())
    def rows_far_below_zero_match_oracle(data: st.DataObject) -> None:
        check(check_matches_oracle, backend_entry, draw_far_below(data, backend_entry))

    replayable(rows_far_below_zero_match_oracle)()


@conformance_settings
@given(data=st.data())
def test_every_rank_matches_oracle(backend_entry, data) -> None:
    check(
        check_every_rank_matches_oracle,
        backend_entry,
        draw_ranks(data, backend_entry),
    )


@conformance_settings
@given(data=st.data())
def test_ranks_together_equal_each_alone(backend_entry, data) -> None:
    check(
        check_ranks_together_equal_alone,
        backend_entry,
        draw_ranks(data, backend_entry),
    )
