"""Rank 0's checks of a step: every rank's gathered outputs against the float64 oracle,
and against the same requests run through one process's shared pool.

Rank 0 rebuilds each rank's step from the seed (``RankSchedule``), so it holds
every sequence's K/V history without any being sent. The shared-pool path
binds one pool holding all ranks' pages (``page_offset = 0``) to one backend
instance per rank, as a single process simulates DP, and feeds it the same
metadata: the two layouts must agree within the dtype's bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.core.contract import LayerCache
from harness.core.kv_pages import PoolLayout
from harness.dist.coordination import pad_step
from harness.dist.schedule import DistSetup, RankSchedule, RankStep, rank_caches
from harness.numerics.canary import changed_slots, snapshot
from harness.numerics.oracle import references
from harness.numerics.tolerance import compare, error_bound


def run_layers(
    backend: Any, caches: list[LayerCache], rank_step: RankStep, graph_mode: bool, where: str
) -> tuple[list[torch.Tensor], str | None]:
    """Prepare and run every layer; the canary: only the step's real slots, in that layer."""
    assert rank_step.step is not None
    built = rank_step.step
    backend.prepare(built.metadata, graph_mode=graph_mode)
    slots = {s for s in built.metadata.slot_mapping.tolist() if s != -1}
    outputs = []
    for layer, (q, k, v) in enumerate(
        zip(rank_step.queries, rank_step.keys, rank_step.values, strict=True)
    ):
        before = snapshot(caches)
        outputs.append(backend.forward(q, k, v, layer))
        for index, changed in enumerate(changed_slots(caches, before)):
            expect = slots if index == layer else set()
            if changed != expect:
                return outputs, (
                    f"{where}, forward(layer {layer}) changed layer {index} slots "
                    f"{sorted(changed - expect)[:8]}, missed {sorted(expect - changed)[:8]}"
                )
    return outputs, None


@dataclass
class RankVerdict:
    """One rank's step, as rank 0 judged it."""

    rank: int
    tokens: int
    oracle_ratio: float | None  # worst error / bound over the layers (None: nothing ran)
    shared_ratio: float | None  # worst |per-rank pool - shared pool| / bound
    problem: str | None = None


class GroupChecker:
    """Rank 0's mirror of the whole group: schedules, a shared pool, its backends."""

    def __init__(self, setup: DistSetup, make_backend: Any, *, can_pad: bool) -> None:
        self.setup = setup
        self.can_pad = can_pad
        self.schedules = [RankSchedule(setup, r, keep_history=True) for r in range(setup.dp_size)]
        self.shared = rank_caches(setup, 0, PoolLayout.SHARED)
        self.backends = [make_backend(r) for r in range(setup.dp_size)]
        for backend in self.backends:
            backend.bind_kv_caches(self.shared)

    def check(
        self, step: int, counts: list[int], gathered: list[tuple[list[torch.Tensor], str | None]]
    ) -> list[RankVerdict]:
        verdicts = []
        for rank, (outputs, problem) in enumerate(gathered):
            verdicts.append(self._check_rank(step, rank, counts, outputs, problem))
        return verdicts

    def _check_rank(
        self,
        step: int,  # 0-based; messages count steps from 1
        rank: int,
        counts: list[int],
        outputs: list[torch.Tensor],
        problem: str | None,
    ) -> RankVerdict:
        s = self.setup
        schedule = self.schedules[rank]
        planned = schedule.plan(step)
        if planned != counts[rank]:  # the replay is the harness's own: a mismatch is its bug
            raise RuntimeError(
                f"rank 0's replay of rank {rank} planned {planned} tokens at step {step}, "
                f"the rank reported {counts[rank]}"
            )
        padded = pad_step(counts, rank, graph=s.graph, can_pad=self.can_pad)
        rank_step = schedule.build(step, padded.padding)
        verdict = RankVerdict(rank, planned, None, None, problem)
        if rank_step.step is None:
            return verdict
        shown = step + 1
        where = f"rank {rank} step {shown} (shared pool)"
        shared_out, shared_problem = run_layers(
            self.backends[rank], self.shared, rank_step, padded.graph_mode, where
        )
        if len(outputs) != s.num_layers:
            verdict.problem = verdict.problem or (
                f"rank {rank} step {shown}: {len(outputs)} layer outputs gathered, "
                f"expected {s.num_layers}"
            )
            return verdict
        ratios, agreement = [], []
        for layer, (out, twin) in enumerate(zip(outputs, shared_out, strict=True)):
            query_lens = rank_step.query_lens
            args = (rank_step.queries[layer], rank_step.sequences[layer], query_lens)
            exact, naive = references(*args, scale=s.scale, causal=True, value_dim=s.value_dim)
            full = _unpadded(out, exact.output.shape, rank_step.real_tokens)
            if full is None:
                verdict.problem = verdict.problem or (
                    f"rank {rank} step {shown} layer {layer}: gathered output of shape "
                    f"{tuple(out.shape)}, expected {rank_step.real_tokens} real token rows "
                    f"of {tuple(exact.output.shape[1:])}"
                )
                return verdict
            if rank_step.real_tokens == 0:  # a dummy batch: no output to check, only writes
                continue
            result = compare(full, exact, naive, s.torch_dtype)
            ratios.append(result.worst_ratio)
            if not result.passed and verdict.problem is None:
                verdict.problem = (
                    f"rank {rank} step {shown} layer {layer} (per-rank pool) vs the float64 "
                    f"oracle: {result.describe()}"
                )
            bound = error_bound(exact, _error(naive, exact.output), s.torch_dtype)[exact.checked]
            gap = _error(full, twin.detach().cpu().double())[exact.checked]
            worst = float((gap / bound).max()) if gap.numel() else 0.0
            agreement.append(worst)
            if not worst <= 1.0 and verdict.problem is None:
                verdict.problem = (
                    f"rank {rank} step {shown} layer {layer}: the per-rank pool and the "
                    f"single-process shared pool disagree by {worst:.2f}x the dtype's bound"
                )
        if shared_problem and verdict.problem is None:
            verdict.problem = shared_problem
        verdict.oracle_ratio = max(ratios, default=None)
        verdict.shared_ratio = max(agreement, default=None)
        return verdict


def _error(output: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    return (output.detach().to("cpu", torch.float64) - exact).norm(dim=-1)


def _unpadded(real: torch.Tensor, shape: torch.Size, real_tokens: int) -> torch.Tensor | None:
    """The gathered real rows back at full step length (padding rows, never checked, as 0)."""
    if real.dim() != 3 or real.shape[0] != real_tokens or tuple(real.shape[1:]) != tuple(shape[1:]):
        return None
    full = torch.zeros(shape, dtype=real.dtype)
    full[:real_tokens] = real.cpu()
    return full
