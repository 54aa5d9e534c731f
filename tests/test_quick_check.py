"""What ``attn-harness check`` covers for a claim (``conformance.check_matrix``), not run."""

from __future__ import annotations

import torch

from harness.conformance.check_matrix import (
    BATCHES,
    DEFAULT_HEAD_DIMS,
    DEFAULT_PAGE_SIZES,
    quick_coverage,
    quick_scenarios,
    run_quick_check,
    triage_lines,
)
from harness.core.contract import Capabilities
from harness.core.errors import Unsupported
from harness.core.registry import BackendEntry
from reference_backends.reference import ReferenceBackend


def test_every_claimed_page_size_and_head_dim_once_without_the_product() -> None:
    caps = Capabilities(
        dtypes=(torch.float32,), page_sizes=(16, 1, 16), head_dims=(64, 128, 256), max_dp_size=2
    )
    coverage = quick_coverage(caps)
    assert coverage.geometries == [(16, 64), (1, 64), (16, 128), (16, 256)]
    scenarios = [s for _, s in quick_scenarios(caps)]
    assert len(scenarios) == 4 * len(BATCHES) * 3  # ranks 0/1, 0/2, 1/2
    assert {(s.page_size, s.head_dim) for s in scenarios} == set(coverage.geometries)
    assert coverage.describe() == (
        "page sizes 16,1 at head dim 64; head dims 64,128,256 at page size 16; "
        "float32; dp_size 1..2, both layouts"
    )


def test_any_page_size_and_head_dim_get_the_default_sets() -> None:
    coverage = quick_coverage(Capabilities())
    assert (coverage.page_sizes, coverage.head_dims) == (DEFAULT_PAGE_SIZES, DEFAULT_HEAD_DIMS)
    assert len(coverage.page_sizes) > 1
    assert len(coverage.head_dims) > 1
    assert any(dim % 2 for dim in coverage.head_dims)  # an odd head dim, past any vector width


def test_a_claim_with_no_page_size_checks_nothing() -> None:
    caps = Capabilities(page_sizes=())
    assert list(quick_scenarios(caps)) == []
    assert quick_coverage(caps).describe().startswith("nothing")


class _RefusesBf16(ReferenceBackend):
    """Claims every dtype, then refuses bf16 with ``Unsupported``."""

    def prepare(self, metadata, graph_mode=False):
        if self._require_bound().dtype == torch.bfloat16:
            raise Unsupported("bf16 not implemented")
        super().prepare(metadata, graph_mode=graph_mode)


def test_unsupported_inside_the_claim_fails_the_case() -> None:
    entry = BackendEntry(name="refuses-bf16", cls=_RefusesBf16, origin="test")
    results = run_quick_check(entry)
    refused = [r for r in results if "bfloat16" in r.case]
    assert refused
    assert all(r.status == "FAILED" for r in refused)
    assert "raised Unsupported inside its declared capabilities: bf16" in refused[0].detail
    assert all(r.status == "PASSED" for r in results if "bfloat16" not in r.case)


def test_nan_from_unused_cache_memory_is_explained() -> None:
    from suites.mutants.backends import ReadsWholeLastPage

    entry = BackendEntry(name="reads-whole-page", cls=ReadsWholeLastPage, origin="test")
    failed = [r for r in run_quick_check(entry) if r.status == "FAILED"]
    nan = [r for r in failed if "non-finite" in r.detail]
    assert nan, [r.detail for r in failed[:3]]
    assert "holds NaN by design" in nan[0].detail


def _narrowed(cls: type) -> BackendEntry:
    """``cls`` claiming one dtype, page size and head dim: the matrix's 24 cases, fast."""

    class Narrowed(cls):  # type: ignore[misc, valid-type]
        @classmethod
        def capabilities(cls) -> Capabilities:
            return Capabilities(dtypes=(torch.float32,), page_sizes=(3,), head_dims=(16,))

    return BackendEntry(name=cls.__name__, cls=Narrowed, origin="test")


def test_the_triage_names_the_batch_kind_of_a_mask_bug() -> None:
    from suites.mutants.backends import TopLeftCausal

    results = run_quick_check(_narrowed(TopLeftCausal))
    (line,) = triage_lines(results)
    assert line.startswith("TopLeftCausal: 18 failures, all with batch kind ")
    assert "batch kind decode, extend or mixed (" in line  # the matrix's batch names
    assert "every example with batch kind prefill held (6)" in line


def test_the_triage_names_the_pool_layout_of_a_page_offset_bug() -> None:
    from suites.mutants.backends import IgnoresPageOffset

    (line,) = triage_lines(run_quick_check(_narrowed(IgnoresPageOffset)))
    assert "all with pool layout per_rank" in line
    assert "every example with pool layout shared held" in line


def test_a_bug_in_every_case_is_said_to_be_everywhere() -> None:
    from suites.mutants.backends import GqaModulo

    (line,) = triage_lines(run_quick_check(_narrowed(GqaModulo)))
    assert line == "GqaModulo: 24 failures in the quick check alone: every example of it " + (
        "failed, whatever its shape"
    )
    assert triage_lines(run_quick_check(_narrowed(ReferenceBackend))) == []
