"""Several instances alive in one process: the draws share one step's metadata and differ in
configuration, correct backends pass, and a plan shared across instances fails."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from harness.conformance.instances import check_instances_interleaved, instance_groups
from harness.core.contract import Capabilities
from harness.core.errors import PropertyFailure
from harness.core.registry import BackendEntry, default_registry
from harness.core.variants import AttentionVariant
from harness.numerics.scenario import Scenario, make_step_inputs
from suites.mutants.state import (
    KvScalesFromLastPlan,
    ScalePlannedOncePerStep,
    SinksPlannedByFirstLayer,
    SoftCapPlannedOncePerStep,
    WindowPlannedOncePerStep,
)

REFERENCE = default_registry().entry("reference")


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(instance_groups(REFERENCE.capabilities))
def test_instances_share_the_step_and_differ_in_configuration(group):
    assert 2 <= len(group) <= 3
    first = make_step_inputs(group[0]).step.metadata
    for other in group[1:]:
        mine = make_step_inputs(other).step.metadata
        assert torch.equal(mine.block_table, first.block_table)
        assert torch.equal(mine.slot_mapping, first.slot_mapping)
        assert other.softmax_scale != group[0].softmax_scale


BASE = Scenario(
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    page_size=4,
    total_pages=40,
    num_layers=2,
    context_lens=(30, 9),
    query_lens=(1, 9),
    seed=3,
)
FP8 = AttentionVariant(kv_cache_dtype="fp8_e4m3", k_scale=0.5, v_scale=0.5)
GROUPS = {
    WindowPlannedOncePerStep: (AttentionVariant(sliding_window=4), AttentionVariant()),
    SoftCapPlannedOncePerStep: (AttentionVariant(logits_soft_cap=1.0), AttentionVariant()),
    ScalePlannedOncePerStep: (AttentionVariant(), AttentionVariant()),
    SinksPlannedByFirstLayer: (AttentionVariant(sinks=(3.0, 3.0, 3.0, 3.0)), AttentionVariant()),
    KvScalesFromLastPlan: (FP8, replace(FP8, k_scale=2.0, v_scale=0.125)),
}


def group_of(variants: tuple[AttentionVariant, ...]) -> list[Scenario]:
    return [
        replace(BASE, variant=variant, scale=0.25 * (index + 1))
        for index, variant in enumerate(variants)
    ]


@pytest.mark.parametrize("cls", GROUPS, ids=lambda c: c.__name__)
def test_a_plan_shared_by_instances_fails_and_each_alone_passes(cls):
    entry = BackendEntry(cls.__name__, cls, "test")
    group = group_of(GROUPS[cls])
    with pytest.raises(PropertyFailure, match=r"instance \d of 2"):
        check_instances_interleaved(entry, group)
    for scenario in group:
        check_instances_interleaved(entry, [scenario])


@pytest.mark.parametrize("name", ["reference", "sdpa", "compiled"])
def test_correct_backends_keep_each_instance_its_own(name):
    entry = default_registry().entry(name)
    for variants in GROUPS.values():
        if entry.capabilities.unsupported_reason(
            soft_cap=any(v.logits_soft_cap for v in variants),
            sinks=any(v.sinks for v in variants),
            sliding_window=any(v.sliding_window for v in variants),
            kv_cache_dtype=max(v.kv_cache_dtype for v in variants),
        ):
            continue
        check_instances_interleaved(entry, group_of(variants))


def test_a_group_for_a_narrow_claim_stays_inside_it():
    caps = Capabilities(dtypes=(torch.float16,), page_sizes=(16,), head_dims=(64,))

    @settings(
        max_examples=20,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(instance_groups(caps))
    def inside(group):
        for s in group:
            assert (s.dtype, s.page_size, s.head_dim) == (torch.float16, 16, 64)
            assert s.variant.is_plain

    inside()
