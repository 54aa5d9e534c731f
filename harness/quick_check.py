"""A small fixed matrix of steps checked against the oracle: the quick start's main job.

Decode, prefill, extend and mixed batches, on every rank of dp_size 1, 2 and
3, in both pool layouts, for each dtype the backend claims. The property-based
conformance suites go much further; this answers "is it basically right?"
in seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from harness.contract import Capabilities
from harness.errors import Unsupported
from harness.kv_pages import PoolLayout
from harness.registry import BackendEntry
from harness.scenario import Scenario, backend_for, check_outputs, run_scenario

BATCHES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "decode": ((7, 12, 1, 20), (1, 1, 1, 1)),
    "prefill": ((5, 12, 3), (5, 12, 3)),
    "extend": ((9, 16, 11), (4, 5, 11)),
    "mixed": ((1, 13, 8, 21, 6), (1, 13, 3, 1, 6)),
}


@dataclass(frozen=True)
class CaseResult:
    backend: str
    case: str
    status: str  # PASSED, FAILED, UNSUPPORTED, ERROR
    detail: str


def quick_scenarios(caps: Capabilities) -> Iterator[tuple[str, Scenario]]:
    """Named scenarios inside ``caps``; a page size of 3 keeps page boundaries awkward."""
    page_size = 3 if caps.page_sizes is None else caps.page_sizes[0]
    head_dim = 16 if caps.head_dims is None else caps.head_dims[0]
    max_dp = 3 if caps.max_dp_size is None else min(3, caps.max_dp_size)
    base = Scenario(
        num_heads=8,
        num_kv_heads=2,
        head_dim=head_dim,
        page_size=page_size,
        total_pages=61,
        num_layers=2,
    )
    for dtype in caps.dtypes:
        for batch, (contexts, queries) in BATCHES.items():
            for dp_size in range(1, max_dp + 1):
                for dp_rank in range(dp_size):
                    layout = PoolLayout.PER_RANK if dp_rank % 2 else PoolLayout.SHARED
                    name = (
                        f"{batch} dp={dp_rank}/{dp_size} {layout.value} "
                        f"{str(dtype).removeprefix('torch.')}"
                    )
                    yield (
                        name,
                        replace(
                            base,
                            context_lens=contexts,
                            query_lens=queries,
                            dtype=dtype,
                            dp_size=dp_size,
                            dp_rank=dp_rank,
                            layout=layout,
                            seed=dp_size * 10 + dp_rank,
                        ),
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
            inputs, outputs = run_scenario(lambda s: backend_for(entry, s), scenario)
            checks = check_outputs(inputs, outputs)
        except Unsupported as exc:
            results.append(CaseResult(entry.name, case, "UNSUPPORTED", str(exc)))
            continue
        except Exception as exc:  # reported per case, with its type, never swallowed silently
            results.append(CaseResult(entry.name, case, "ERROR", f"{type(exc).__name__}: {exc}"))
            continue
        worst = max(checks, key=lambda c: c.worst_ratio)
        status = "PASSED" if all(c.passed for c in checks) else "FAILED"
        results.append(CaseResult(entry.name, case, status, worst.describe()))
    return results


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
