"""A small fixed matrix of steps checked against the oracle: the quick start's main job.

Decode, prefill, extend and mixed batches, on every rank of dp_size 1, 2 and
3, in both pool layouts, for each dtype the backend claims, at every page size
and every head dim it claims (each page size at the first head dim, each head
dim at the first page size: every value, not their product). Each case first
checks that ``prepare``/``forward`` left their inputs alone, then compares the
outputs with the float64 oracle. The property-based conformance suites go much
further; this answers "is it basically right?" in seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from harness.conformance.properties import bits
from harness.conformance.strategies import claimed_head_dims, claimed_page_sizes
from harness.core.contract import Capabilities
from harness.core.dtypes import dtype_name
from harness.core.errors import Unsupported, raised_at
from harness.core.kv_pages import PoolLayout, pages_needed
from harness.core.registry import BackendEntry
from harness.numerics.latent import as_latent, latent_pairs
from harness.numerics.scenario import (
    Scenario,
    backend_for,
    check_outputs,
    engine_conventions,
    make_step_inputs,
)

BATCHES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "decode": ((7, 12, 1, 20), (1, 1, 1, 1)),
    "prefill": ((5, 12, 3), (5, 12, 3)),
    "extend": ((9, 16, 11), (4, 5, 11)),
    "mixed": ((1, 13, 8, 21, 6), (1, 13, 3, 1, 6)),
}

DEFAULT_PAGE_SIZES = (3, 16)
"""For a claim of any page size: one that splits sequences awkwardly, and a production size."""
DEFAULT_HEAD_DIMS = (16, 13)
"""For a claim of any head dim: a usual one, and an odd one that no vector width divides."""
MIN_TOTAL_PAGES = 61
"""A prime, so DP ranks get unequal shares; raised for page sizes too small to fit the batches."""
METADATA_TENSORS = ("query_start_loc", "seq_lens", "block_table", "slot_mapping")


@dataclass(frozen=True)
class CaseResult:
    backend: str
    case: str
    status: str  # PASSED, FAILED, UNSUPPORTED, ERROR
    detail: str
    scenario: Scenario | None = None  # the case's step (for the triage), when it has one


@dataclass(frozen=True)
class Coverage:
    """What a quick check runs for one claim; ``describe`` says so in the CLI output."""

    page_sizes: tuple[int, ...]
    head_dims: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...]
    max_dp: int
    interpreted: bool = False  # the backend runs interpreted on the CPU: a lighter matrix
    kv_lora_ranks: tuple[int, ...] = ()  # MLA: each head dim's (latent width's) value width

    @property
    def num_layers(self) -> int:
        return 1 if self.interpreted else 2

    @property
    def geometries(self) -> list[tuple[int, int]]:
        """``(page_size, head_dim)`` pairs: every value once, without the full product.

        Page size and head dim bugs rarely need each other to show, and the
        product of a long claim would make the check slow.
        """
        if not self.page_sizes or not self.head_dims:
            return []
        page, dim = self.page_sizes[0], self.head_dims[0]
        return [(p, dim) for p in self.page_sizes] + [(page, d) for d in self.head_dims[1:]]

    def describe(self) -> str:
        if not self.geometries:
            return "nothing: the claim has no page size or no head dim"
        page, dim = self.page_sizes[0], self.head_dims[0]
        return (
            f"page sizes {_join(self.page_sizes)} at head dim {dim}; "
            f"head dims {_join(self.head_dims)} at page size {page}; "
            f"{_join(dtype_name(d) for d in self.dtypes)}; "
            f"dp_size 1..{self.max_dp}, both layouts"
            + (f"; {self.num_layers} layer (interpreted on the CPU)" if self.interpreted else "")
        )


def _join(values: Iterable[object]) -> str:
    return ",".join(str(v) for v in values)


def quick_coverage(caps: Capabilities) -> Coverage:
    """Every claimed page size and head dim; small defaults where the claim is "any".

    A backend that runs interpreted on the CPU (an interpreter costs
    milliseconds per kernel program) gets dp_size up to 2 and one layer.
    """
    page_sizes = claimed_page_sizes(caps, DEFAULT_PAGE_SIZES)
    head_dims = claimed_head_dims(caps, DEFAULT_HEAD_DIMS)
    ranks: tuple[int, ...] = ()
    if caps.kind == "mla":  # latent widths: a small one and an odd one, or the claim's
        pairs = latent_pairs(caps)[:2]
        head_dims, ranks = tuple(r + rope for r, rope in pairs), tuple(r for r, _ in pairs)
    interpreted = "cpu" in caps.interpreted_devices
    most_dp = 2 if interpreted else 3
    return Coverage(
        page_sizes=tuple(dict.fromkeys(page_sizes)),
        head_dims=tuple(dict.fromkeys(head_dims)),
        dtypes=caps.dtypes_on("cpu"),
        max_dp=most_dp if caps.max_dp_size is None else min(most_dp, caps.max_dp_size),
        interpreted=interpreted,
        kv_lora_ranks=ranks,
    )


def _total_pages(page_size: int, max_dp: int) -> int:
    """Enough pages for the largest batch on every rank, even at page size 1."""
    most = max(sum(pages_needed(c, page_size) for c in ctx) for ctx, _ in BATCHES.values())
    return max(MIN_TOTAL_PAGES, max_dp * most + 1)


def quick_scenarios(caps: Capabilities) -> Iterator[tuple[str, Scenario]]:
    """Named scenarios inside ``caps``, over every geometry of ``quick_coverage(caps)``."""
    coverage = quick_coverage(caps)
    latent = dict(zip(coverage.head_dims, coverage.kv_lora_ranks, strict=False))
    for dtype in coverage.dtypes:
        for page_size, head_dim in coverage.geometries:
            base = Scenario(
                num_heads=8,
                num_kv_heads=2,
                head_dim=head_dim,
                page_size=page_size,
                total_pages=_total_pages(page_size, coverage.max_dp),
                num_layers=coverage.num_layers,
                dtype=dtype,
                cache_layout=caps.cache_layouts[0],
                **engine_conventions(caps),
            )
            if head_dim in latent:
                base = as_latent(base, latent[head_dim], head_dim - latent[head_dim])
            for batch, (contexts, queries) in BATCHES.items():
                for dp_size in range(1, coverage.max_dp + 1):
                    for dp_rank in range(dp_size):
                        layout = PoolLayout.PER_RANK if dp_rank % 2 else PoolLayout.SHARED
                        name = (
                            f"{batch} dp={dp_rank}/{dp_size} {layout.value} "
                            f"{dtype_name(dtype)} page={page_size} D={head_dim}"
                        )
                        yield (
                            name,
                            replace(
                                base,
                                context_lens=contexts,
                                query_lens=queries,
                                dp_size=dp_size,
                                dp_rank=dp_rank,
                                layout=layout,
                                seed=dp_size * 10 + dp_rank,
                            ),
                        )


def _modified(tensors: dict[str, torch.Tensor], before: dict[str, torch.Tensor]) -> str | None:
    """Names of the tensors whose bits changed, as a phrase, or ``None``."""
    names = [name for name, t in tensors.items() if not torch.equal(bits(t), before[name])]
    if not names:
        return None
    return f"{' and '.join(names)} input" + ("s" if len(names) > 1 else "")


def _run_case(entry: BackendEntry, scenario: Scenario) -> tuple[str, str]:
    """``(status, detail)`` of one case.

    Inputs are compared bit for bit after ``prepare`` and after each
    ``forward``, before any output is: the oracle reads the same query
    tensor, so a clobbered input would otherwise show up as a wrong answer.
    """
    inputs = make_step_inputs(scenario)
    metadata = inputs.step.metadata
    watched = {f"metadata.{name}": getattr(metadata, name) for name in METADATA_TENSORS}
    before = {name: bits(t) for name, t in watched.items()}
    backend = backend_for(entry, scenario)
    backend.bind_kv_caches(inputs.caches)
    backend.prepare(metadata, graph_mode=scenario.graph_mode)
    if changed := _modified(watched, before):
        return "FAILED", f"prepare modified its {changed}"
    outputs = []
    for layer in range(scenario.num_layers):
        args = dict(zip(("query", "key", "value"), inputs.forward_args(layer), strict=True))
        args_before = {name: bits(t) for name, t in args.items()}
        outputs.append(backend.forward(*args.values(), layer))
        if changed := _modified(args | watched, args_before | before):
            return "FAILED", f"forward (layer {layer}) modified its {changed}"
    checks = check_outputs(inputs, outputs)
    worst = max(checks, key=lambda c: c.worst_ratio)
    return ("PASSED" if all(c.passed for c in checks) else "FAILED"), worst.describe()


HARNESS_DIR = str(Path(__file__).resolve().parents[1])


def _outside_libraries(filename: str) -> bool:
    """A file of the backend's own code: not the harness's, not an installed package's."""
    path = str(Path(filename).resolve())
    return not (
        path.startswith(HARNESS_DIR)
        or "site-packages" in path
        or "dist-packages" in path
        or filename.startswith("<")
    )


def run_quick_check(entry: BackendEntry) -> list[CaseResult]:
    """Run every quick scenario on ``entry``; no exception escapes, each case gets a status."""
    try:
        caps = entry.capabilities
    except TypeError as exc:
        return [CaseResult(entry.name, "capabilities()", "ERROR", str(exc))]
    results = []
    for case, scenario in quick_scenarios(caps):
        if scenario.dp_size > 1 and not entry.accepts_dp:
            results.append(CaseResult(entry.name, case, "UNSUPPORTED", "not DP-aware"))
            continue
        try:
            status, detail = _run_case(entry, scenario)
        except Unsupported as exc:  # every case lies inside the claim: a refusal breaks it
            detail = f"raised Unsupported inside its declared capabilities: {exc}"
            results.append(CaseResult(entry.name, case, "FAILED", detail, scenario))
            continue
        except Exception as exc:  # reported per case, with its type, never swallowed silently
            error = f"{type(exc).__name__}: {exc}{raised_at(exc, _outside_libraries)}"
            results.append(CaseResult(entry.name, case, "ERROR", error, scenario))
            continue
        results.append(CaseResult(entry.name, case, status, detail, scenario))
    return results


def triage_lines(results: list[CaseResult]) -> list[str]:
    """What separates one backend's failed cases from its passed ones, in one line.

    The matrix varies batch kind, DP rank, layout, dtype, page size and head
    dim one at a time, so a bug that lives in one of them fails exactly the
    cases with its value ("all with batch kind prefill or extend; every
    example with batch kind decode held"). Nothing when every case passed.
    """
    from harness.conformance.triage import Group, TriageLog, cause_line, explain

    bad = [r for r in results if r.status in ("FAILED", "ERROR") and r.scenario is not None]
    if not bad:
        return []
    log = TriageLog()
    for result in results:
        if result.scenario is None:
            continue
        named = {"batch": result.case.split()[0]}  # the matrix's batch, not a row-kind mix
        if result.status == "PASSED":
            log.held(result.backend, "check", [result.scenario], named)
        elif result.status in ("FAILED", "ERROR"):
            log.failed(result.backend, "check", [result.scenario], named)
    evidence = log.tests(bad[0].backend)["check"]
    cause = explain(evidence.failed, evidence.held)
    group = Group(bad, cause, property_only=None if cause else "the quick check")
    group.every_example_failed = cause is None and not evidence.held
    return [f"{bad[0].backend}: {cause_line(group)}"]
