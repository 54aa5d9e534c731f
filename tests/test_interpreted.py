"""A backend that runs interpreted on a device: a lighter conformance share, no timing."""

from __future__ import annotations

import pytest
from hypothesis import Phase

import attn_harness_pytest as plugin
from harness.bench.case_check import unsupported_reason
from harness.bench.workloads import get_workload
from harness.conformance.options import ConformanceOptions
from harness.conformance.profiles import INTERPRETED_BUDGET, get_profile
from harness.conformance.session import ConformanceSession
from harness.core.registry import BackendEntry
from reference_backends import SdpaBackend, TritonBackend


@pytest.mark.parametrize("name", ["ci", "thorough", "kill"])
def test_the_interpreted_profile_is_a_share_of_the_same_profile(name):
    profile = get_profile(name)
    lighter = profile.interpreted()
    assert lighter.name == f"{name} (interpreted)"
    assert lighter.settings.max_examples == -(-profile.settings.max_examples // 8)
    assert 1 <= lighter.production_examples < profile.production_examples
    assert 1 <= lighter.stateful_examples < profile.stateful_examples
    assert lighter.budget.max_context == INTERPRETED_BUDGET.max_context
    assert lighter.budget.max_dp_size == profile.budget.max_dp_size
    assert not lighter.enforces_coverage
    assert lighter.settings.derandomize == profile.settings.derandomize
    # the same phases less explain (each of its reruns costs seconds interpreted)
    assert Phase.explain not in lighter.settings.phases
    assert set(lighter.settings.phases) == set(profile.settings.phases) - {Phase.explain}


def test_profile_for_sizes_only_the_backend_interpreted_on_the_device():
    triton = BackendEntry("triton", TritonBackend, "built-in")
    sdpa = BackendEntry("sdpa", SdpaBackend, "built-in")
    on_cpu = ConformanceSession(ConformanceOptions(profile="ci", device="cpu"))
    assert on_cpu.profile_for(triton).settings.max_examples == 13
    assert on_cpu.profile_for(sdpa).settings.max_examples == 100
    on_cuda = ConformanceSession(ConformanceOptions(profile="ci", device="cuda"))
    assert on_cuda.profile_for(triton).settings.max_examples == 100


def test_the_plugin_functions_read_the_active_session():
    """What the suite calls reads the session of the run in progress, and only that."""
    triton = BackendEntry("triton", TritonBackend, "built-in")
    outer = ConformanceSession(ConformanceOptions(profile="ci", device="cpu"))
    inner = ConformanceSession(ConformanceOptions(profile="thorough", device="cuda", examples=7))
    with plugin.active(outer):
        assert plugin.current_device() == "cpu"
        assert plugin.profile_for(triton).settings.max_examples == 13
        with plugin.active(inner):
            assert plugin.current_device() == "cuda"
            assert plugin.current_profile().name == "thorough"
            assert plugin.current_profile().settings.max_examples == 7
        assert plugin.current_profile().name == "ci"  # the outer run's, restored


def test_bench_does_not_time_a_backend_where_it_runs_interpreted():
    spec = get_workload("decode-sweep").cpu[0]
    triton = BackendEntry("triton", TritonBackend, "built-in")
    assert "runs interpreted on cpu" in (unsupported_reason(triton, spec, "cpu") or "")
    sdpa = BackendEntry("sdpa", SdpaBackend, "built-in")
    assert unsupported_reason(sdpa, spec, "cpu") is None
