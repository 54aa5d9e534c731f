"""Where each planted bug lives: the dimensions a failure triage should name for it.

``attn-harness conform`` groups failures by cause and names the dimension
that separates failing from held examples (``harness.conformance.triage``).
Each planted bug below is listed with the dimensions a person reading its
docstring would accept as "where the bug lives"; ``PROPERTY`` marks a bug
that no input dimension separates (a modified input, a skipped check, last-bit
noise), for which the right triage names the failing property instead.
``triage_names_its_dimension`` judges one run's triage against this table;
``tests/test_triage.py`` and ``python -m suites.mutants.kill_matrix`` report the
share of bugs it gets right.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

PROPERTY = "property"
"""No input dimension separates this bug: a group naming a failing property is right."""

MASK = frozenset({"batch", "query", "mask"})
DECODE_VARIANT = frozenset({"variant", "batch", "query"})
VALUES = frozenset({"values", "dtype", "scale", "magnitude"})

EXPECTED: dict[str, frozenset[str]] = {
    # DP partition and ownership
    "PartitionFloor": frozenset({"dp_size", "rank", "rank_index"}),
    "SkipsOwnershipCheck": frozenset({PROPERTY}),
    "ChecksOnlySlots": frozenset({PROPERTY}),
    "ChecksOnlyBlockTable": frozenset({PROPERTY}),
    "RejectsStaleEntries": frozenset({PROPERTY}),
    "RefusesDpGroups": frozenset({"dp_size", "rank", "rank_index"}),
    "IgnoresPageOffset": frozenset({"layout", "rank", "rank_index"}),
    # masking, heads, numerics
    "TopLeftCausal": MASK,
    "NoCausalMask": MASK,
    "GqaModulo": frozenset({"heads", "group"}),
    "UnstableSoftmax": frozenset({"logit_offset", "magnitude", "planted"}),
    "IgnoresScale": frozenset({"scale"}),
    "DropsLastToken": frozenset({PROPERTY}),
    "ReadsWholeLastPage": frozenset({"last_page", "page_size"}),
    "AssumesContiguousPages": frozenset({"sequence_pages", "page_order", "context"}),
    "WritesPaddingSlots": frozenset({"padding"}),
    "ZeroesPageTail": frozenset({"last_page", "page_size", PROPERTY}),
    "ClearsBlockTablePadding": frozenset({PROPERTY}),
    "IgnoresLayerIndex": frozenset({"layers"}),
    "ModifiesQueryInPlace": frozenset({PROPERTY}),
    "IgnoresStrides": frozenset({"views"}),
    "NonDeterministic": frozenset({PROPERTY}),
    "StalePlanCache": frozenset({PROPERTY}),
    # production-shape thresholds
    "SplitKvNoRescale": frozenset({"context"}),
    "SplitKvFloorPartitions": frozenset({"context"}),
    "SplitKvMaxPartitions": frozenset({"context"}),
    "QueryTileCausalOffset": frozenset({"query"}),
    "QueryTileCap128": frozenset({"query"}),
    "HardcodedBlock16": frozenset({"page_size"}),
    "HeadDimCap128": frozenset({"head_dim"}),
    "GqaPack8": frozenset({"heads", "group"}),
    "GridCap64": frozenset({"sequences"}),
    "SeqLenInt16": frozenset({"context"}),
    "PageIdInt16": frozenset({"pool_pages", "pool"}),
    "ElementOffsetInt32": frozenset({"pool"}),
    "DpRank3Bits": frozenset({"dp_size", "rank", "rank_index"}),
    # attention variants
    "WindowOffByOne": frozenset({"variant", "window"}),
    "NonPositiveWindowMeansNone": frozenset({PROPERTY}),
    "WindowOnlyInPrefill": DECODE_VARIANT | {"window"},
    "SoftCapBeforeScale": frozenset({"variant", "soft_cap"}),
    "IgnoresSinks": frozenset({"variant", "sinks"}),
    "AlibiSignFlipped": frozenset({"variant", "alibi"}),
    "Fp8ScaleInvertedOnRead": frozenset({"kv_cache"}),
    "Fp8ScaleInvertedOnWrite": frozenset({"kv_cache"}),
    "HndReadAsNhd": frozenset({"cache_layout"}),
    "LseInLog2": frozenset({PROPERTY}),
    "OutBufferIgnored": frozenset({PROPERTY}),
    # bugs from the field
    "SplitKvEmptySplitNaN": frozenset({"context", "variant", "window"}),
    # MLA kernels' (suites.mutants.latent)
    "LatentScaleOfWidth": frozenset({"scale"}),
    "LatentDimsHardcoded": frozenset({"latent", "head_dim"}),
    "LatentValuesWholeRow": frozenset({PROPERTY}),
    "LatentRopeWrittenPastRow": frozenset({PROPERTY}),
    "LatentSplitMergeValueStride": frozenset({"context"}),
    "MergeStartsEmptyNaN": frozenset({"context", "variant", "window"}),
    "SplitCountEmptyTail": frozenset({"context"}),
    "FiniteSentinelMax": frozenset({"logit_offset"}),  # finite -5e4 start: offsets below it
    "WindowMaskFinite": frozenset({"variant", "logit_offset", "magnitude", "planted", "window"}),
    "SoftCapAfterMaskInDecode": DECODE_VARIANT | {"soft_cap"},
    "SoftCapIgnored": frozenset({"variant", "soft_cap"}),
    "SinksIgnoredInPrefill": DECODE_VARIANT | {"sinks"},
    "AlibiDroppedInDecode": DECODE_VARIANT | {"alibi"},
    "WindowIgnoredOnCachedPrefix": frozenset({"variant", "batch", "query", "context", "window"}),
    "Fp8ScalesIgnoredInRaggedPrefill": frozenset({"kv_cache", "batch", "query"}),
    "Fp8ScalesFallBackToOne": frozenset({"kv_cache"}),
    "GqaGroupPaddedToPow2": frozenset({"heads", "group"}),
    "HeadDimTailUnmasked": frozenset({"head_dim"}),
    "OutputChunkAtColumnZero": frozenset({"head_dim", "heads", "group"}),
    "PageTokensPast128Dropped": frozenset({"page_size"}),
    "CombinedKvBlockStrideAssumed": frozenset({"cache"}),
    "NewKvStridesAssumed": frozenset({"views"}),
    "SpecVerifyNoCausal": MASK,
    "SpecVerifyPaddedQStride": frozenset({"batch", "query"}),
    "SpecVerifyRowsAsDecode": frozenset({"batch", "query"}),
    "ScratchWrapsPastTokenBudget": frozenset({"tokens"}),
    # real-model values
    "RawScoresInStorageDtype": VALUES,
    "AccumulatorInStorageDtype": VALUES,
    "ScoresInStorageDtype": VALUES | {"logit_offset"},
    "DefaultScalePastOneSplit": VALUES | {"context"},
    # state shared by instances
    "WindowPlannedOncePerStep": frozenset({PROPERTY}),
    "SoftCapPlannedOncePerStep": frozenset({PROPERTY}),
    "ScalePlannedOncePerStep": frozenset({PROPERTY}),
    "SinksPlannedByFirstLayer": frozenset({PROPERTY}),
    "KvScalesFromLastPlan": frozenset({PROPERTY}),
    # padding rows behind a promise
    "PaddingRowsZeroOverZero": frozenset({"padding"}),
    "PaddingRowsLeftStale": frozenset({"padding"}),
    "PaddingRowsReadPageZero": frozenset({"padding", "page_order"}),
    # dimensions together
    "SequencesPastGridLimitDropped": frozenset({"sequences", "tokens", PROPERTY}),
    "SplitWorkPastPlanDropped": frozenset({"sequences", "context", "tokens", PROPERTY}),
    "LseOfFirstSplitOnly": frozenset({"context", PROPERTY}),
    "LseRowsShiftedByPadding": frozenset({"padding", PROPERTY}),
    "WriteShiftsHeadsPastChunk": frozenset({"query", "heads", PROPERTY}),
}


CASE_DIMENSIONS: dict[str, frozenset[str]] = {
    "split-kv": frozenset({"context"}),
    "long-context": frozenset({"context"}),
    "query-tiles": frozenset({"query"}),
    "many-sequences": frozenset({"sequences"}),
    "head-geometry": frozenset({"heads", "head_dim", "group"}),
    "page-sizes": frozenset({"page_size"}),
    "dp-groups": frozenset({"dp_size", "rank", "rank_index", "pool_pages"}),
    "spec-decode": frozenset({"batch", "query"}),
    "token-budget": frozenset({"tokens"}),
    "float32": frozenset({"dtype"}),
    "float16": frozenset({"dtype"}),
    "bfloat16": frozenset({"dtype"}),
}
"""What a test case names, when the triage blames one (a production regime, a dtype)."""


TEST_DIMENSIONS: dict[str, frozenset[str]] = {
    "test_pool_past_32bit_offsets": frozenset({"pool", "pool_pages"}),
}
"""Tests that are about one dimension: a group that blames one of them alone names it."""


def named(group: Mapping[str, Any]) -> set[str]:
    """The dimensions one triage group (``harness.conformance.triage.group_json``) names;
    a blamed test case stands for the dimensions its regime varies, and a test that is
    about one dimension (the large pool's) for that dimension."""
    found = set(group["dimensions"]) - {"case"}
    for case in group["failing_labels"].get("case", ()):
        found |= CASE_DIMENSIONS.get(case, frozenset())
    if not found:
        found |= TEST_DIMENSIONS.get(group.get("property") or "", frozenset())
    return found or {PROPERTY}


def triage_names_its_dimension(mutant: str, groups: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a bug's triage points where the bug lives.

    Every group that names a dimension must name one the bug lives in (a wrong
    dimension anywhere sends a person the wrong way); a bug that no dimension
    separates is right when no group names one. Groups that name only a
    property sit beside a right dimension without harm: the evidence of one
    test was too thin to say more.
    """
    expected = EXPECTED[mutant]
    named_groups = [named(g) for g in groups]
    if not named_groups:
        return False
    dimensional = [found for found in named_groups if found != {PROPERTY}]
    if not dimensional:
        return PROPERTY in expected
    return all(found & expected for found in dimensional)


def triage_rate(triage: Mapping[str, Iterable[Mapping[str, Any]]]) -> tuple[int, int, list[str]]:
    """``(right, judged, wrong names)`` over the planted bugs in ``triage`` (spec -> groups)."""
    right, wrong = 0, []
    for spec, groups in triage.items():
        name = spec.rsplit(":", 1)[-1]
        if triage_names_its_dimension(name, list(groups)):
            right += 1
        else:
            wrong.append(name)
    return right, right + len(wrong), wrong
