"""One attention step end to end: build a batch, run a backend, check it against the oracle.

A ``Scenario`` is plain data (sizes, lengths, seed); ``make_step_inputs``
turns it into deterministic tensors and metadata, ``run_scenario`` feeds a
backend and returns per-layer comparisons. Sequences whose context exceeds
their query get the earlier tokens written straight into the cache first,
as an engine's earlier steps would have.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.batches import BatchBuilder, Step
from harness.contract import AttentionBackend, LayerCache
from harness.kv_pages import PagePool, PoolLayout, make_layer_caches, token_slots, write_tokens
from harness.oracle import SequenceKV, naive_attention, oracle_attention
from harness.tolerance import Comparison, compare


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A single step for one DP rank; ``context_lens[i]`` includes ``query_lens[i]``."""

    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    page_size: int = 4
    total_pages: int = 64
    num_layers: int = 2
    context_lens: tuple[int, ...] = (5, 9)
    query_lens: tuple[int, ...] = (1, 9)
    dtype: torch.dtype = torch.float32
    scale: float | None = None  # None: 1 / sqrt(head_dim)
    causal: bool = True
    dp_size: int = 1
    dp_rank: int = 0
    layout: PoolLayout = PoolLayout.SHARED
    pad_to: int | None = None  # graph-mode padding rows up to this batch size
    shuffle_pages: bool = False
    magnitude: float = 1.0  # scales q and k: large values give large logits
    seed: int = 0
    device: str = "cpu"

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def graph_mode(self) -> bool:
        return self.pad_to is not None


@dataclass
class StepInputs:
    """Everything a backend receives for one step, plus the full K/V the oracle needs."""

    scenario: Scenario
    step: Step
    caches: list[LayerCache]
    queries: list[torch.Tensor]  # per layer [T, H, D]
    keys: list[torch.Tensor]  # per layer [T, KV, D], the new tokens
    values: list[torch.Tensor]
    sequences: list[list[SequenceKV | None]] = field(default_factory=list)  # per layer, per row


def _random(
    gen: torch.Generator, shape: tuple[int, ...], scenario: Scenario, magnitude: float = 1.0
) -> torch.Tensor:
    data = torch.randn(shape, generator=gen, dtype=torch.float32) * magnitude
    return data.to(device=scenario.device, dtype=scenario.dtype)


def make_step_inputs(scenario: Scenario) -> StepInputs:
    """Deterministic caches, inputs and metadata for ``scenario`` (never zeros)."""
    s = scenario
    if len(s.context_lens) != len(s.query_lens):
        raise ValueError("context_lens and query_lens differ in length")
    pool = PagePool(s.total_pages, s.dp_size, shuffle_seed=s.seed if s.shuffle_pages else None)
    builder = BatchBuilder(pool, s.dp_rank, s.page_size)
    ids = [builder.admit() for _ in s.context_lens]
    history = [
        (i, ctx - q) for i, ctx, q in zip(ids, s.context_lens, s.query_lens, strict=True) if ctx > q
    ]
    if history:
        builder.step(history)
    step = builder.step(
        list(zip(ids, s.query_lens, strict=True)), causal=s.causal, pad_to=s.pad_to, device=s.device
    )
    caches = make_layer_caches(
        num_layers=s.num_layers,
        total_pages=s.total_pages,
        page_size=s.page_size,
        num_kv_heads=s.num_kv_heads,
        head_dim=s.head_dim,
        dtype=s.dtype,
        device=s.device,
        layout=s.layout,
        dp_size=s.dp_size,
        dp_rank=s.dp_rank,
    )
    gen = torch.Generator().manual_seed(s.seed)
    inputs = StepInputs(s, step, caches, [], [], [])
    for cache in caches:
        rows: list[SequenceKV | None] = []
        new_k, new_v = [], []
        for row in step.rows:
            k = _random(
                gen, (max(row.seq_len, row.query_len), s.num_kv_heads, s.head_dim), s, s.magnitude
            )
            v = _random(gen, tuple(k.shape), s)
            if row.seq_id is None:  # padding: inputs that must not be written
                rows.append(None)
                new_k.append(k[: row.query_len])
                new_v.append(v[: row.query_len])
                continue
            cached = row.seq_len - row.query_len
            if cached:
                slots = torch.tensor(token_slots(row.pages, range(cached), s.page_size))
                write_tokens(cache, slots, k[:cached], v[:cached])
            rows.append(SequenceKV(k, v))
            new_k.append(k[cached:])
            new_v.append(v[cached:])
        inputs.sequences.append(rows)
        inputs.keys.append(torch.cat(new_k))
        inputs.values.append(torch.cat(new_v))
        inputs.queries.append(
            _random(gen, (step.num_tokens, s.num_heads, s.head_dim), s, s.magnitude)
        )
    return inputs


def check_outputs(inputs: StepInputs, outputs: list[torch.Tensor]) -> list[Comparison]:
    """Compare each layer's output with the float64 oracle."""
    s = inputs.scenario
    query_lens = [row.query_len for row in inputs.step.rows]
    checks = []
    for layer, output in enumerate(outputs):
        args = (inputs.queries[layer], inputs.sequences[layer], query_lens)
        exact = oracle_attention(*args, scale=s.softmax_scale, causal=s.causal)
        naive = naive_attention(*args, scale=s.softmax_scale, causal=s.causal)
        checks.append(compare(output, exact, naive, s.dtype))
    return checks


BackendFactory = Callable[[Scenario], AttentionBackend]


def run_scenario(
    factory: BackendFactory, scenario: Scenario
) -> tuple[StepInputs, list[torch.Tensor]]:
    """Bind, prepare and run every layer of ``scenario`` on a fresh backend."""
    inputs = make_step_inputs(scenario)
    backend = factory(scenario)
    backend.bind_kv_caches(inputs.caches)
    backend.prepare(inputs.step.metadata, graph_mode=scenario.graph_mode)
    outputs = [
        backend.forward(inputs.queries[layer], inputs.keys[layer], inputs.values[layer], layer)
        for layer in range(scenario.num_layers)
    ]
    return inputs, outputs
