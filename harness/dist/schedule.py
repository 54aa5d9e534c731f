"""Each rank's requests and tensors, drawn from a seed, replayable anywhere.

A rank's engine loop is a pure function of ``(seed, rank)``: which
sequences arrive, how their prompts are chunked, when they finish, and every
query, key and value. So rank 0 can rebuild any rank's steps to check that
rank's gathered outputs against the float64 oracle, and run the same
requests through one process's shared pool, without shipping K/V history
between processes.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

import torch

from harness.core.batches import BatchBuilder, Step
from harness.core.contract import LayerCache
from harness.core.kv_pages import (
    PagePool,
    PoolLayout,
    make_layer_caches,
    pages_needed,
    zero_padding_pages,
)
from harness.numerics.oracle import SequenceKV

SEED_MODULUS = 2**63 - 1
"""torch generators take seeds below 2**63; any ``--seed`` maps into that range."""
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True, kw_only=True)
class DistSetup:
    """The geometry and the request mix of a DP run; the same on every rank."""

    dp_size: int
    steps: int = 8
    seed: int = 0
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 32
    page_size: int = 16
    num_layers: int = 2
    dtype: str = "float32"
    device: str = "cpu"
    graph: bool = False
    max_running: int = 3  # sequences a rank holds at once
    max_prompt: int = 48
    chunk: int = 16  # prefill chunk: longer prompts are prefilled over several steps
    max_decode: int = 12  # tokens a sequence decodes before it finishes
    padding_convention: str = "empty"  # the backend's (``Capabilities.padding_convention``)
    kv_lora_rank: int | None = None  # MLA: head_dim is the latent width, values its first this

    def __post_init__(self) -> None:
        for name in ("dp_size", "steps", "num_heads", "num_kv_heads", "head_dim", "page_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def value_dim(self) -> int:
        """Width of a value row and an output row (MLA: ``kv_lora_rank``)."""
        return self.head_dim if self.kv_lora_rank is None else self.kv_lora_rank

    @property
    def longest(self) -> int:
        return self.max_prompt + self.max_decode

    @property
    def padding_pages(self) -> bool:
        """Whether each rank holds back a padding page for one-token padding rows."""
        return self.padding_convention == "one-token"

    @property
    def pages_per_rank(self) -> int:
        """Enough for ``max_running`` sequences at their longest, a spare page, and the
        padding page where the backend pads with one-token rows."""
        sequences = self.max_running * pages_needed(self.longest, self.page_size)
        return sequences + 1 + self.padding_pages

    @property
    def total_pages(self) -> int:
        return self.pages_per_rank * self.dp_size

    def with_dp(self, dp_size: int) -> DistSetup:
        return replace(self, dp_size=dp_size)


def idle(setup: DistSetup, rank: int, step: int) -> bool:
    """Whether ``rank`` has no requests at ``step``: each rank is idle now and then."""
    return setup.dp_size > 1 and (step + rank) % (setup.dp_size + 2) == 0


@dataclass
class _Running:
    seq_id: int
    prompt_left: int
    decode_left: int


@dataclass
class RankStep:
    """One rank's step: its requests, built metadata (padding included) and inputs."""

    index: int
    step: Step | None  # None: the rank runs no forward (skipped, or idle and unpadded)
    real_tokens: int
    queries: list[torch.Tensor] = field(default_factory=list)  # per layer [T, H, D]
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    sequences: list[list[SequenceKV | None]] = field(default_factory=list)  # per layer, per row

    @property
    def query_lens(self) -> list[int]:
        return [] if self.step is None else [row.query_len for row in self.step.rows]


class RankSchedule:
    """One rank's engine loop: arrivals, chunked prefill, decode, finish, page reuse.

    ``plan(step)`` says how many tokens the rank holds before the group
    exchange; ``build(step, padding)`` then builds the padded batch and its
    tensors. ``keep_history`` keeps every sequence's K/V for the oracle.
    """

    def __init__(self, setup: DistSetup, rank: int, *, keep_history: bool = False) -> None:
        self.setup = setup
        self.rank = rank
        self.keep_history = keep_history
        self.pool = PagePool(setup.total_pages, setup.dp_size, padding_pages=setup.padding_pages)
        self.builder = BatchBuilder(self.pool, rank, setup.page_size)
        self._draw = random.Random(setup.seed * 1_000_003 + rank)
        self._running: list[_Running] = []
        self._requests: list[tuple[int, int]] = []
        self._planned = -1
        self.history: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def plan(self, step: int) -> int:
        """Admit arrivals and choose this step's requests; returns their token count."""
        if step != self._planned + 1:
            raise ValueError(f"rank {self.rank}: steps run in order; asked for {step}")
        self._planned = step
        s = self.setup
        arrivals = self._draw.randint(0, 2)  # drawn every step, so idleness shifts nothing
        prompts = [self._draw.randint(1, s.max_prompt) for _ in range(arrivals)]
        decodes = [self._draw.randint(1, s.max_decode) for _ in range(arrivals)]
        if idle(s, self.rank, step):
            self._requests = []
            return 0
        for prompt, decode in zip(prompts, decodes, strict=True):
            if len(self._running) < s.max_running:
                seq_id = self.builder.admit()
                self._running.append(_Running(seq_id, prompt, decode))
                self.history[seq_id] = []
        self._requests = [
            (r.seq_id, min(r.prompt_left, s.chunk) if r.prompt_left else 1) for r in self._running
        ]
        return sum(q for _, q in self._requests)

    def build(self, step: int, padding: int) -> RankStep:
        """The step's batch with ``padding`` one-token padding rows, and its tensors.

        A rank with no requests and no padding runs no ``forward``: no batch.
        """
        if step != self._planned:
            raise ValueError(f"rank {self.rank}: build({step}) before plan({step})")
        s = self.setup
        real = sum(q for _, q in self._requests)
        if not self._requests and padding == 0:
            return RankStep(step, None, real)
        rows = len(self._requests)
        built = self.builder.step(
            self._requests,
            causal=True,
            pad_to=rows + padding if padding else None,
            pad_query_len=1,
            device=s.device,
        )
        result = RankStep(step, built, real)
        for layer in range(s.num_layers):
            self._draw_layer(result, layer)
        self._advance()
        return result

    def _draw_layer(self, result: RankStep, layer: int) -> None:
        s = self.setup
        assert result.step is not None
        seed = ((s.seed * 7919 + self.rank) * 104_729 + result.index) * 1_299_709 + layer
        gen = torch.Generator().manual_seed(seed % SEED_MODULUS)
        tokens = result.step.num_tokens

        def draw(*shape: int) -> torch.Tensor:
            data = torch.randn(shape, generator=gen, dtype=torch.float32)
            return data.to(device=s.device, dtype=s.torch_dtype)

        query = draw(tokens, s.num_heads, s.head_dim)
        key = draw(tokens, s.num_kv_heads, s.head_dim)
        value = draw(tokens, s.num_kv_heads, s.head_dim)
        if s.kv_lora_rank is not None:  # MLA: a latent row's value is its first entries
            value = key[..., : s.kv_lora_rank]
        result.queries.append(query)
        result.keys.append(key)
        result.values.append(value)
        rows: list[SequenceKV | None] = []
        start = 0
        for row in result.step.rows:
            end = start + row.query_len
            if row.seq_id is None or not self.keep_history:
                rows.append(None)
            else:
                history = self.history[row.seq_id]
                if len(history) <= layer:
                    history.append((key[:0], value[:0]))
                k = torch.cat([history[layer][0], key[start:end]])
                v = torch.cat([history[layer][1], value[start:end]])
                history[layer] = (k, v)
                rows.append(SequenceKV(k, v))
            start = end
        result.sequences.append(rows)

    def _advance(self) -> None:
        """Consume this step's tokens; finished sequences free their pages for reuse."""
        queries = dict(self._requests)
        still = []
        for running in self._running:
            query = queries.get(running.seq_id)
            if query is None:  # not in this step (the rank was idle)
                still.append(running)
                continue
            if running.prompt_left:
                running.prompt_left -= query
            else:
                running.decode_left -= 1
            if running.prompt_left == 0 and running.decode_left == 0:
                self.builder.release(running.seq_id)
                self.history.pop(running.seq_id, None)
            else:
                still.append(running)
        self._running = still


def rank_caches(setup: DistSetup, rank: int, layout: PoolLayout) -> list[LayerCache]:
    """NaN-filled caches: ``rank``'s own pages (per-rank layout) or the whole pool (shared);
    padding pages zero-filled."""
    caches = make_layer_caches(
        num_layers=setup.num_layers,
        total_pages=setup.total_pages,
        page_size=setup.page_size,
        num_kv_heads=setup.num_kv_heads,
        head_dim=setup.head_dim,
        dtype=setup.torch_dtype,
        device=setup.device,
        layout=layout,
        dp_size=setup.dp_size,
        dp_rank=rank,
        value_dim=setup.kv_lora_rank,
    )
    if setup.padding_pages:
        for cache in caches:
            zero_padding_pages(cache, setup.total_pages, setup.dp_size)
    return caches
