"""Consecutive steps on one backend: sequences grow, and every step is checked.

Engines call a backend step after step on the same cache: prompts prefilled
in chunks, then decoded; prefixes shared; sequences freed and their pages
reused. ``RankSteps`` drives one rank's backend that way and keeps each
sequence's full K/V history, so that after every layer's ``forward`` it can
check the output against the float64 oracle over that history, and the cache
against a canary: only the step's slots changed, in that layer, anywhere in
the bound pool (other ranks' pages included, in the shared layout).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from harness.core.batches import BatchBuilder, Step
from harness.core.contract import LayerCache
from harness.core.errors import PropertyFailure
from harness.numerics.cache_readback import stored_sequences, write_problem
from harness.numerics.canary import PoolWatch, changed_slots, snapshot
from harness.numerics.oracle import SequenceKV, references
from harness.numerics.scenario import Scenario, fit_fp8
from harness.numerics.tolerance import compare
from harness.numerics.value_regimes import RegimeChannels

KVHistory = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: all K and V so far


@dataclass
class RankSteps:
    """One rank's bound backend, its sequences and their history, stepped and checked."""

    backend: Any
    builder: BatchBuilder
    caches: list[LayerCache]
    geometry: Scenario  # heads, head dim, page size, dtype, scale, mask, layers, device
    gen: torch.Generator
    name: str = "rank 0"
    history: dict[int, KVHistory] = field(default_factory=dict)
    pending: dict[int, int] = field(default_factory=dict)  # prompt tokens not yet prefilled
    steps: int = 0
    watch: PoolWatch | None = None  # one for every rank on a pool; None: copy it per forward

    def __post_init__(self) -> None:
        g = self.geometry
        self.regime = RegimeChannels(g.values, g.head_dim, g.seed)  # one model, one channel set

    def admit(self, prompt: int) -> int:
        seq_id = self.builder.admit()
        self.history[seq_id] = []
        self.pending[seq_id] = prompt
        return seq_id

    def fork(self, parent: int, prefix_len: int, prompt: int) -> int:
        """A child sharing ``parent``'s whole pages up to ``prefix_len`` tokens."""
        child = self.builder.fork(parent, prefix_len)
        shared = self.builder.sequences[child].cached_len
        self.history[child] = [(k[:shared], v[:shared]) for k, v in self.history[parent]]
        self.pending[child] = prompt
        return child

    def release(self, seq_id: int) -> None:
        self.builder.release(seq_id)
        del self.history[seq_id], self.pending[seq_id]

    def cached_len(self, seq_id: int) -> int:
        return self.builder.sequences[seq_id].cached_len

    def step(self, requests: list[tuple[int, int]], pad_to: int | None = None) -> Step:
        """Grow each ``(seq_id, query_len)`` and check every layer.

        ``OutOfPages`` is raised before the backend sees anything.
        """
        g = self.geometry
        built = self.builder.step(requests, causal=g.causal, pad_to=pad_to, device=g.device)
        for seq_id, query in requests:
            self.pending[seq_id] = max(0, self.pending[seq_id] - query)
        self.backend.prepare(built.metadata, graph_mode=pad_to is not None)
        if self.watch is not None:
            self.watch.changes()  # what ``prepare`` wrote is not a forward's doing
        slots = built.metadata.slot_mapping.tolist()
        for layer in range(g.num_layers):
            self._forward_layer(built, slots, layer)
        if self.watch is not None:  # each forward looked at its own layer: now all of them
            for index, stray in enumerate(self.watch.changes()):
                if stray:
                    raise PropertyFailure(
                        f"{self.name}, step {self.steps + 1}: layer {index} slots "
                        f"{sorted(stray)[:8]} changed after that layer's forward (a later "
                        "forward wrote outside its own layer)"
                    )
        self.steps += 1
        return built

    def _changes(
        self, layer: int, before: list[tuple[torch.Tensor, torch.Tensor]] | None
    ) -> list[set[int]]:
        """Per layer, the slots the forward of ``layer`` changed.

        With a watch, only ``layer`` is compared now and the others once the
        step's forwards are done (``step``): a write into another layer shows
        there, at a cost of two passes over the pool a layer instead of one
        per layer.
        """
        if self.watch is not None:
            return self.watch.changes([layer])
        assert before is not None
        return changed_slots(self.caches, before)

    def _random(
        self,
        shape: tuple[int, ...],
        magnitude: float = 1.0,
        fp8_scale: float | None = None,
        *,
        values: bool = False,
    ) -> torch.Tensor:
        """Normal draws at ``magnitude`` in the geometry's value regime (``values``: as V)."""
        g = self.geometry
        data = torch.randn(shape, generator=self.gen) * magnitude
        shaped = self.regime.values if values else self.regime.queries_and_keys
        data = shaped(data).to(device=g.device, dtype=g.dtype)
        return data if fp8_scale is None else fit_fp8(data, fp8_scale, g.variant)

    def _forward_layer(self, built: Step, slots: list[int], layer: int) -> None:
        g = self.geometry
        new_k, new_v = [], []
        seqs: list[SequenceKV | None] = []
        for row in built.rows:
            shape = (row.query_len, g.num_kv_heads, g.head_dim)
            k = self._random(shape, g.magnitude, g.variant.k_scale)
            v = self._random(shape, fp8_scale=g.variant.v_scale, values=True)
            if g.kv_lora_rank is not None:  # MLA: the value is the latent row's prefix
                v = k[..., : g.kv_lora_rank]
            new_k.append(k)
            new_v.append(v)
            if row.seq_id is None:  # graph-mode padding: written nowhere, never checked
                seqs.append(None)
                continue
            hist = self.history[row.seq_id]
            if len(hist) <= layer:
                hist.append((k[:0], v[:0]))
            hist[layer] = (torch.cat([hist[layer][0], k]), torch.cat([hist[layer][1], v]))
            seqs.append(SequenceKV(*hist[layer]))
        query = self._random((len(slots), g.num_heads, g.head_dim), g.magnitude)
        before = snapshot(self.caches) if self.watch is None else None
        keys = torch.cat(new_k)
        values = keys[..., : g.kv_lora_rank] if g.kv_lora_rank is not None else torch.cat(new_v)
        out = self.backend.forward(query, keys, values, layer)
        where = f"{self.name}, step {self.steps + 1}, forward(layer {layer})"
        mapped = {s for s in slots if s != -1}
        for index, changed in enumerate(self._changes(layer, before)):
            expect = mapped if index == layer else set()
            if changed != expect:
                raise PropertyFailure(
                    f"{where} changed layer {index} slots {sorted(changed - expect)[:8]}, "
                    f"missed {sorted(expect - changed)[:8]}"
                )
        if g.variant.quantized or g.owned_format is not None:  # read back what it stored
            slots_tensor = torch.tensor(slots)
            problem = write_problem(
                self.caches[layer], slots_tensor, torch.cat(new_k), torch.cat(new_v), g.variant
            )
            if problem is not None:
                raise PropertyFailure(f"{where}: {problem}")
        if g.variant.quantized:  # the oracle reads what the backend stored, once checked
            seqs = stored_sequences(self.caches[layer], built.rows, seqs, g.variant)
        exact, naive = references(
            query,
            seqs,
            [row.query_len for row in built.rows],
            scale=g.softmax_scale,
            causal=g.causal,
            variant=g.variant,
            value_dim=g.value_dim,
        )
        result = compare(out, exact, naive, g.dtype)
        if not result.passed:
            raise PropertyFailure(f"{where}: output vs oracle: {result.describe()}")
