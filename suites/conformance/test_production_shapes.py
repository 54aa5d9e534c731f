"""Production shapes, one test per regime: where real kernels' tiling and split bugs live.

Each regime aims its draws at one family of thresholds (split-KV chunks,
query tiles, page sizes, head geometries, launch grids, DP groups, long
contexts), always inside the backend's claim; see
``harness.conformance.production_shapes``. The profile sets how many examples each gets.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.conformance.production_shapes import REGIMES
from harness.conformance.properties import check_matches_oracle, check_only_mapped_slots_change
from suites.conformance.conftest import check, current_profile, draw_production

_PROFILE = current_profile()
production_settings = settings(_PROFILE.settings, max_examples=_PROFILE.production_examples)


@pytest.mark.parametrize("regime", REGIMES)
@production_settings
@given(data=st.data())
def test_production_shapes_match_oracle(backend_entry, regime, data) -> None:
    check(check_matches_oracle, backend_entry, draw_production(data, backend_entry, regime))


@production_settings
@given(data=st.data())
def test_production_shapes_write_only_mapped_slots(backend_entry, data) -> None:
    regime = data.draw(st.sampled_from(REGIMES), label="regime")
    check(
        check_only_mapped_slots_change, backend_entry, draw_production(data, backend_entry, regime)
    )
