"""A hypothesis state machine that drives one backend per rank through many steps.

Sequences are admitted to ranks, prefilled in chunks, extended, decoded,
forked to share prefix pages, and released (their pages re-used by later
sequences). After every step, each layer's output is checked against the
float64 oracle over the full token history, and the cache against a canary:
only that step's slots changed, in that layer, anywhere in the bound pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from harness.batches import BatchBuilder
from harness.contract import LayerCache
from harness.errors import OutOfPages
from harness.kv_pages import PagePool, PoolLayout
from harness.oracle import SequenceKV, naive_attention, oracle_attention
from harness.properties import PropertyFailure, bits, changed_slots
from harness.registry import BackendEntry
from harness.scenario import Scenario, backend_for, scenario_caches
from harness.strategies import Budget, geometries
from harness.tolerance import compare


@dataclass
class Rank:
    backend: Any
    builder: BatchBuilder
    caches: list[LayerCache]
    pending: dict[int, int] = field(default_factory=dict)  # prompt tokens not yet prefilled
    history: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)


def conformance_machine(
    entry: BackendEntry, budget: Budget, device: str = "cpu"
) -> type[RuleBasedStateMachine]:
    """A state machine class bound to ``entry``, drawing inside its capabilities."""
    caps = entry.capabilities
    max_dp = min(budget.max_dp_size, caps.max_dp_size or budget.max_dp_size)
    max_dp = max_dp if entry.accepts_dp else 1

    class BackendSteps(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.ranks: list[Rank] = []
            self.steps = 0

        @initialize(
            geometry=geometries(caps, budget, device),
            dp_size=st.integers(1, max_dp),
            layout=st.sampled_from(list(PoolLayout)),
            per_rank=st.integers(4, 16),
            extra=st.integers(0, 7),
            shuffle=st.booleans(),
        )
        def setup(
            self,
            geometry: Scenario,
            dp_size: int,
            layout: PoolLayout,
            per_rank: int,
            extra: int,
            shuffle: bool,
        ) -> None:
            self.geometry = g = geometry
            total = per_rank * dp_size + extra % dp_size
            self.pool = PagePool(total, dp_size, shuffle_seed=0 if shuffle else None)
            group = replace(g, total_pages=total, dp_size=dp_size, layout=layout)
            shared = scenario_caches(group) if layout is PoolLayout.SHARED else None
            self.gen = torch.Generator().manual_seed(total)
            for rank in range(dp_size):
                member = replace(group, dp_rank=rank)
                caches = shared or scenario_caches(member)
                backend = backend_for(entry, member)
                backend.bind_kv_caches(caches)
                self.ranks.append(Rank(backend, BatchBuilder(self.pool, rank, g.page_size), caches))
            note(
                f"geometry: {g.describe()}; pool {total} pages, dp_size {dp_size}, "
                f"{layout.value}{', shuffled' if shuffle else ''}"
            )

        def _random(self, shape: tuple[int, ...], magnitude: float = 1.0) -> torch.Tensor:
            data = torch.randn(shape, generator=self.gen) * magnitude
            return data.to(device=self.geometry.device, dtype=self.geometry.dtype)

        def _has_sequences(self) -> bool:
            return any(r.builder.sequences for r in self.ranks)

        @rule(data=st.data())
        def admit(self, data: st.DataObject) -> None:
            rank = self.ranks[data.draw(st.integers(0, len(self.ranks) - 1), label="rank")]
            seq_id = rank.builder.admit()
            rank.pending[seq_id] = data.draw(st.integers(1, budget.max_context), label="prompt")
            rank.history[seq_id] = []
            self._step(rank, data, include=seq_id)  # its first prefill chunk, with others

        @precondition(_has_sequences)
        @rule(data=st.data())
        def fork(self, data: st.DataObject) -> None:
            rank = data.draw(st.sampled_from([r for r in self.ranks if r.builder.sequences]))
            parent = data.draw(st.sampled_from(sorted(rank.builder.sequences)), label="parent")
            cached = rank.builder.sequences[parent].cached_len
            if cached < self.geometry.page_size:
                return
            child = rank.builder.fork(parent, data.draw(st.integers(0, cached), label="prefix"))
            shared = rank.builder.sequences[child].cached_len
            rank.history[child] = [(k[:shared], v[:shared]) for k, v in rank.history[parent]]
            rank.pending[child] = data.draw(st.integers(1, 8), label="child prompt")

        @precondition(_has_sequences)
        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            rank = data.draw(st.sampled_from([r for r in self.ranks if r.builder.sequences]))
            seq_id = data.draw(st.sampled_from(sorted(rank.builder.sequences)), label="release")
            rank.builder.release(seq_id)
            del rank.pending[seq_id], rank.history[seq_id]

        @precondition(_has_sequences)
        @rule(data=st.data())
        def step(self, data: st.DataObject) -> None:
            rank = data.draw(st.sampled_from([r for r in self.ranks if r.builder.sequences]))
            self._step(rank, data)

        def _step(self, rank: Rank, data: st.DataObject, include: int | None = None) -> None:
            others = sorted(s for s in rank.builder.sequences if s != include)
            pick = st.lists(st.sampled_from(others), unique=True) if others else st.just([])
            ids = data.draw(pick, label="batch")
            if include is not None:
                ids = [include, *ids]
            if not ids:
                return
            requests = []
            for seq_id in ids:
                pending = rank.pending[seq_id]
                # prefill in chunks while a prompt is pending, then decode one token
                query = data.draw(st.integers(1, pending), label="chunk") if pending else 1
                if rank.builder.sequences[seq_id].cached_len + query <= budget.max_context:
                    requests.append((seq_id, query))
            if not requests:
                return
            pad_to = None
            if caps.graph_mode and data.draw(st.booleans(), label="graph"):
                pad_to = len(requests) + data.draw(st.integers(0, 2))
            causal = self.geometry.causal
            try:
                built = rank.builder.step(
                    requests, causal=causal, pad_to=pad_to, device=self.geometry.device
                )
            except OutOfPages:
                event("step skipped: rank out of pages")
                return
            for seq_id, query in requests:
                rank.pending[seq_id] = max(0, rank.pending[seq_id] - query)
            rank.backend.prepare(built.metadata, graph_mode=pad_to is not None)
            self._run_layers(rank, built.rows, built.metadata.slot_mapping.tolist())
            self.steps += 1

        def _run_layers(self, rank: Rank, rows: Any, slots: list[int]) -> None:
            g = self.geometry
            mapped = {s for s in slots if s != -1}
            num_tokens = len(slots)
            for layer in range(g.num_layers):
                new_k, new_v = [], []
                seqs: list[SequenceKV | None] = []
                for row in rows:
                    k = self._random((row.query_len, g.num_kv_heads, g.head_dim), g.magnitude)
                    v = self._random((row.query_len, g.num_kv_heads, g.head_dim))
                    new_k.append(k)
                    new_v.append(v)
                    if row.seq_id is None:
                        seqs.append(None)
                        continue
                    hist = rank.history[row.seq_id]
                    if len(hist) <= layer:
                        hist.append((k[:0], v[:0]))
                    hist[layer] = (torch.cat([hist[layer][0], k]), torch.cat([hist[layer][1], v]))
                    seqs.append(SequenceKV(*hist[layer]))
                query = self._random((num_tokens, g.num_heads, g.head_dim), g.magnitude)
                before = [(bits(c.key), bits(c.value)) for c in rank.caches]
                out = rank.backend.forward(query, torch.cat(new_k), torch.cat(new_v), layer)
                self._check_canary(rank, before, layer, mapped)
                query_lens = [row.query_len for row in rows]
                args = (query, seqs, query_lens)
                exact = oracle_attention(*args, scale=g.softmax_scale, causal=g.causal)
                naive = naive_attention(*args, scale=g.softmax_scale, causal=g.causal)
                result = compare(out, exact, naive, g.dtype)
                if not result.passed:
                    raise PropertyFailure(
                        f"stateful step {self.steps}, layer {layer}: output vs "
                        f"oracle: {result.describe()}"
                    )

        def _check_canary(
            self,
            rank: Rank,
            before: list[tuple[torch.Tensor, torch.Tensor]],
            layer: int,
            mapped: set[int],
        ) -> None:
            for index, changed in enumerate(changed_slots(rank.caches, before)):
                expect = mapped if index == layer else set()
                if changed != expect:
                    raise PropertyFailure(
                        f"stateful step {self.steps}: forward(layer {layer}) changed layer "
                        f"{index} slots {sorted(changed - expect)[:8]}, missed "
                        f"{sorted(expect - changed)[:8]}"
                    )

    BackendSteps.__name__ = f"BackendSteps[{entry.name}]"
    return BackendSteps
