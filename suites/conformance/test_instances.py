"""Process-level state: instances of one backend configured differently, alive together.

Engines keep one instance per layer (different windows, soft-caps, sinks,
scales, FP8 scales) and plan each step once for all of them; a cached plan,
wrapper or compiled specialization that ignores one configuration value is
wrong only for an instance that runs after another. Each example prepares
two or three instances on one metadata object, runs their layers
interleaved and checks each against the oracle
(``harness.conformance.instances``).
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from attn_harness_pytest import profile_for, replayable
from harness.conformance.instances import check_instances_interleaved
from suites.conformance.conftest import check, conformance_settings, draw_instances


def test_instances_interleaved_match_oracle(backend_entry) -> None:
    share = max(5, profile_for(backend_entry).settings.max_examples // 4)

    @settings(conformance_settings, max_examples=share)
    @given(data=st.data())
    def instances_interleaved_match_oracle(data: st.DataObject) -> None:
        check(check_instances_interleaved, backend_entry, draw_instances(data, backend_entry))

    replayable(instances_interleaved_match_oracle)()
