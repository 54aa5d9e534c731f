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
from typing import Any

import torch

from harness.core.batches import BatchBuilder, Step
from harness.core.contract import AttentionBackend, Capabilities, LayerCache
from harness.core.dtypes import dtype_name
from harness.core.kv_pages import (
    PagePool,
    PoolLayout,
    fill_stale,
    make_layer_caches,
    token_slots,
    write_tokens,
    zero_padding_pages,
)
from harness.core.page_formats import PageFormat
from harness.core.registry import (
    BackendEntry,
    DPBackendConfig,
    HeadConfig,
    instantiate_backend,
)
from harness.core.variants import PLAIN, AttentionVariant
from harness.numerics.cache_readback import stored_sequences, write_problem
from harness.numerics.logit_shaping import (
    fp8_limit,
    offset_key_component,
    offset_queries,
    plant_keys,
    query_lean,
)
from harness.numerics.oracle import OracleOutput, SequenceKV, references
from harness.numerics.tolerance import Comparison, compare
from harness.numerics.value_regimes import RegimeChannels

MAX_ROWS_SHOWN = 8
"""Rows ``Scenario.describe`` writes out; past it, the first four, the last two and a count."""


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A single step for one DP rank; ``context_lens[i]`` includes ``query_lens[i]``.

    ``shared_prefix`` > 0 makes every sequence after the first share the first
    sequence's whole pages covering that many tokens (a prefix cache hit).
    """

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
    pad_query_len: int = 1
    padding_convention: str = "empty"  # "one-token": padding rows read each rank's padding page
    shuffle_pages: bool = False
    shared_prefix: int = 0
    noncontiguous: bool = False  # hand forward strided views instead of dense tensors
    combined_kv: bool = False  # caches are the halves of one [pages, 2, page, KV, D] per layer
    magnitude: float = 1.0  # scales q and k: large values give large logits
    planted_keys: int = 0  # keys per sequence given a large logit (see plant_positions)
    logit_offsets: tuple[float, ...] = ()  # per sequence: every logit of its rows moved by it
    values: str = "normal"  # a real-model value regime (``harness.numerics.value_regimes``)
    seed: int = 0
    device: str = "cpu"
    variant: AttentionVariant = PLAIN  # window, soft-cap, sinks, ALiBi, FP8 cache
    cache_layout: str = "NHD"  # or "HND": [pages, kv_heads, page_size, head_dim]
    page_format: PageFormat | None = None  # the backend's own (its name is cache_layout)
    unused_cache: str = "any"  # "finite": unused memory holds stale finite values, not NaN
    kv_lora_rank: int | None = None  # MLA: head_dim is the latent width, values its first this

    @property
    def is_mla(self) -> bool:
        """Whether the step is MLA: one latent cache, each value a prefix of its key row."""
        return self.kv_lora_rank is not None

    @property
    def value_dim(self) -> int:
        """Width of a value row and of an output row."""
        return self.head_dim if self.kv_lora_rank is None else self.kv_lora_rank

    @property
    def cache_dtype(self) -> torch.dtype:
        """The cache tensors' dtype: the FP8 one of an FP8 cache, else the model's."""
        return self.variant.cache_dtype or self.dtype

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def graph_mode(self) -> bool:
        return self.pad_to is not None

    @property
    def owned_format(self) -> PageFormat | None:
        """The backend's own page format, where the step's caches are in it."""
        fmt = self.page_format
        return fmt if fmt is not None and self.cache_layout == fmt.name else None

    @property
    def reserves_padding_page(self) -> bool:
        """Whether each rank's first page is held back for ``one-token`` padding rows."""
        return self.padding_convention == "one-token"

    @property
    def shared_pages(self) -> int:
        """Whole pages of the first sequence that the others share."""
        return self.shared_prefix // self.page_size

    def describe(self) -> str:
        """A one-line summary for failure reports."""
        cells = [f"{q}/{c}" for c, q in zip(self.context_lens, self.query_lens, strict=True)]
        if len(cells) > MAX_ROWS_SHOWN:  # 64+ sequences: the ends and a count, not a screenful
            cells = [*cells[:4], f"... {len(cells) - 6} more ...", *cells[-2:]]
        rows = ", ".join(cells)
        extras = [
            name
            for name, on in (
                ("graph", self.graph_mode),
                ("pad=one-token", self.graph_mode and self.reserves_padding_page),
                ("non-causal", not self.causal),
                ("shuffled", self.shuffle_pages),
                ("strided", self.noncontiguous),
                ("combined-kv", self.combined_kv),
                (f"planted={self.planted_keys}", self.planted_keys > 0),
            )
            if on
        ]
        if self.shared_prefix:
            extras.append(f"shared_prefix={self.shared_prefix}")
        if self.values != "normal":
            extras.append(f"values={self.values}")
        if any(self.logit_offsets):
            extras.append("logit_offsets=" + ",".join(f"{o:g}" for o in self.logit_offsets))
        if self.cache_layout != "NHD":
            extras.append(self.cache_layout)
        if self.kv_lora_rank is not None:
            rope = self.head_dim - self.kv_lora_rank
            extras.append(f"MLA kv_lora_rank={self.kv_lora_rank} rope={rope}")
        if not self.variant.is_plain:
            extras.append(self.variant.describe())
        return (
            f"dp {self.dp_rank}/{self.dp_size} {self.layout.value}, "
            f"{dtype_name(self.dtype)}, H={self.num_heads} "
            f"KV={self.num_kv_heads} D={self.head_dim} page={self.page_size} "
            f"pages={self.total_pages} layers={self.num_layers} scale="
            f"{self.softmax_scale:.4g} magnitude={self.magnitude}, rows (q/L) [{rows}]"
            + (f", {' '.join(extras)}" if extras else "")
        )


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
    _references: dict[int, tuple[OracleOutput, torch.Tensor]] = field(
        default_factory=dict, repr=False
    )

    def reference(self, layer: int) -> tuple[OracleOutput, torch.Tensor]:
        """The oracle and naive outputs of ``layer``, computed once and reused.

        Every backend, the peer and every property checked on these inputs
        compare against the same float64 result. With an FP8 cache the oracle
        reads the K/V the backend stored, so call this after its ``forward``
        (and check the stored values with ``write_problem``).
        """
        if layer not in self._references:
            s = self.scenario
            query_lens = [row.query_len for row in self.step.rows]
            self._references[layer] = references(
                self.queries[layer],
                self.oracle_sequences(layer),
                query_lens,
                scale=s.softmax_scale,
                causal=s.causal,
                variant=s.variant,
                value_dim=s.value_dim,
            )
        return self._references[layer]

    def forget_references(self) -> None:
        """Drop the cached oracle: with an FP8 cache each backend's stores are its own."""
        self._references.clear()

    def oracle_sequences(self, layer: int) -> list[SequenceKV | None]:
        """Each row's K/V as the backend reads them: the inputs, or for FP8 the stored values."""
        if not self.scenario.variant.quantized:
            return self.sequences[layer]
        return stored_sequences(
            self.caches[layer], self.step.rows, self.sequences[layer], self.scenario.variant
        )

    def write_problem(self, layer: int) -> str | None:
        """Why this layer's stored new K/V are not the inputs (FP8: quantized), or ``None``.

        Checked for an FP8 cache and for a backend-owned page format (whose
        views are read back); a plain cache's writes are the canary's and the
        oracle's to see.
        """
        s = self.scenario
        if not s.variant.quantized and s.owned_format is None:
            return None
        slots = self.step.metadata.slot_mapping.cpu()
        return write_problem(
            self.caches[layer], slots, self.keys[layer], self.values[layer], s.variant
        )

    def output_shape(self, layer: int) -> tuple[int, int, int]:
        """What ``forward`` returns for ``layer``: ``[T, num_heads, value_dim]``."""
        return (*self.queries[layer].shape[:2], self.scenario.value_dim)

    def forward_args(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``forward``'s query/key/value for ``layer``: strided views if the scenario says so."""
        tensors = (self.queries[layer], self.keys[layer], self.values[layer])
        if self.scenario.noncontiguous:
            tensors = tuple(strided_copy(t) for t in tensors)  # type: ignore[assignment]
        rank = self.scenario.kv_lora_rank
        if rank is not None:  # MLA: the value is the key's first entries, as engines pass it
            return tensors[0], tensors[1], tensors[1][..., :rank]
        return tensors


def strided_copy(tensor: torch.Tensor) -> torch.Tensor:
    """The same values as a non-contiguous view (every other element of a wider buffer)."""
    wide = torch.empty(
        *tensor.shape[:-1], 2 * tensor.shape[-1], dtype=tensor.dtype, device=tensor.device
    )
    view = wide[..., ::2]
    view.copy_(tensor)
    wide[..., 1::2] = float("nan")  # what a backend reading past the view would see
    return view


def _random(
    gen: torch.Generator,
    shape: tuple[int, ...],
    scenario: Scenario,
    magnitude: float = 1.0,
    regime: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Normal draws at ``magnitude``, shaped by the value ``regime``, rounded to the dtype."""
    data = torch.randn(shape, generator=gen, dtype=torch.float32) * magnitude
    if regime is not None:
        data = regime(data)
    return data.to(device=scenario.device, dtype=scenario.dtype)


def fit_fp8(tensor: torch.Tensor, scale: float, variant: AttentionVariant) -> torch.Tensor:
    """``tensor`` clamped so ``tensor / scale`` fits the FP8 range (no saturation to test)."""
    if variant.cache_dtype is None:
        return tensor
    # e5m2 * 2 is past fp16's range
    limit = min(fp8_limit(variant, scale), torch.finfo(tensor.dtype).max)
    return tensor.clamp(-limit, limit)


def _build_step(s: Scenario, pool: PagePool) -> Step:
    """Allocate the history (earlier steps) and return this step's metadata."""
    builder = BatchBuilder(pool, s.dp_rank, s.page_size)
    ids = [builder.admit()]
    history = [(ids[0], s.context_lens[0] - s.query_lens[0])]
    if s.shared_prefix:
        builder.step([r for r in history if r[1] > 0])
        history = []
        ids += [builder.fork(ids[0], s.shared_prefix) for _ in s.context_lens[1:]]
    else:
        ids += [builder.admit() for _ in s.context_lens[1:]]
    for seq_id, ctx, q in zip(ids[1:], s.context_lens[1:], s.query_lens[1:], strict=True):
        history.append((seq_id, ctx - q - builder.sequences[seq_id].cached_len))
    if any(n < 0 for _, n in history):
        raise ValueError("a sequence's cached tokens are fewer than the shared prefix")
    history = [r for r in history if r[1] > 0]
    if history:
        builder.step(history)
    return builder.step(
        list(zip(ids, s.query_lens, strict=True)),
        causal=s.causal,
        pad_to=s.pad_to,
        pad_query_len=s.pad_query_len,
        device=s.device,
    )


def engine_conventions(caps: Capabilities) -> dict[str, Any]:
    """The ``Scenario`` fields a backend's claim fixes for every step drawn for it: how its
    engine pads, which page format it owns, what its unused cache memory holds."""
    return {
        "padding_convention": caps.padding_convention,
        "page_format": caps.page_format,
        "unused_cache": caps.unused_cache,
    }


def scenario_pool(scenario: Scenario) -> PagePool:
    """The page pool of the scenario's DP group (shuffled when it says so)."""
    seed = scenario.seed if scenario.shuffle_pages else None
    return PagePool(
        scenario.total_pages,
        scenario.dp_size,
        shuffle_seed=seed,
        padding_pages=scenario.reserves_padding_page,
    )


def scenario_caches(scenario: Scenario, **overrides: Any) -> list[LayerCache]:
    """NaN-filled caches of the scenario's rank in its layout; overrides for negative tests.

    Padding pages (``Scenario.reserves_padding_page``) hold zeros, as an engine's null
    block does: a padding row that reads one token there reads a finite one. Where the
    backend's engine keeps unused memory finite (``unused_cache="finite"``), it holds
    stale finite values instead of NaN.
    """
    s = scenario
    args: dict[str, Any] = dict(
        num_layers=s.num_layers,
        total_pages=s.total_pages,
        page_size=s.page_size,
        num_kv_heads=s.num_kv_heads,
        head_dim=s.head_dim,
        dtype=s.cache_dtype,
        device=s.device,
        layout=s.layout,
        dp_size=s.dp_size,
        dp_rank=s.dp_rank,
        combined_kv=s.combined_kv,
        cache_layout=s.cache_layout,
        page_format=s.page_format
        if s.page_format and s.cache_layout == s.page_format.name
        else None,
        value_dim=s.kv_lora_rank,
    )
    caches = make_layer_caches(**(args | overrides))
    if s.unused_cache == "finite":
        gen = torch.Generator().manual_seed(s.seed + 3)
        for cache in caches:
            fill_stale(cache, gen)
    if s.reserves_padding_page:
        for cache in caches:
            zero_padding_pages(cache, s.total_pages, s.dp_size)
    return caches


def backend_for(entry: BackendEntry, scenario: Scenario, **kwargs: Any) -> Any:
    """A new instance of ``entry`` for the scenario's heads, scale and DP rank."""
    heads = HeadConfig(
        scenario.num_heads,
        scenario.num_kv_heads,
        scenario.head_dim,
        scenario.softmax_scale,
        scenario.kv_lora_rank,
    )
    return instantiate_backend(
        entry.cls,
        heads,
        dp_config=DPBackendConfig(scenario.dp_size, scenario.dp_rank),
        name=entry.name,
        **(scenario.variant.constructor_kwargs(scenario.device) | kwargs),
    )


def make_step_inputs(
    scenario: Scenario, *, pool: PagePool | None = None, caches: list[LayerCache] | None = None
) -> StepInputs:
    """Deterministic caches, inputs and metadata for ``scenario`` (never zeros).

    Pass ``pool`` and ``caches`` to place several ranks' steps in one shared
    pool; by default the scenario gets a pool and caches of its own.
    """
    s = scenario
    if len(s.context_lens) != len(s.query_lens) or not s.context_lens:
        raise ValueError("context_lens and query_lens must be non-empty and of equal length")
    step = _build_step(s, pool if pool is not None else scenario_pool(s))
    if caches is None:
        caches = scenario_caches(s)
    gen = torch.Generator().manual_seed(s.seed)
    planting = torch.Generator().manual_seed(s.seed + 1)  # draws apart, so seeds keep their data
    inputs = StepInputs(s, step, caches, [], [], [])
    shared_tokens = s.shared_pages * s.page_size
    regime = RegimeChannels(s.values, s.head_dim, s.seed)
    for cache in caches:
        rows: list[SequenceKV | None] = []
        new_k, new_v = [], []
        directions: list[torch.Tensor | None] = []
        for index, row in enumerate(step.rows):
            shape = (max(row.seq_len, row.query_len), s.num_kv_heads, s.head_dim)
            k = _random(gen, shape, s, s.magnitude, regime.queries_and_keys)
            v = _random(gen, shape, s, 1.0, regime.values)
            v = fit_fp8(v, s.variant.v_scale, s.variant)
            if s.kv_lora_rank is not None:  # MLA: a value is its latent row's first entries
                k = fit_fp8(k, s.variant.k_scale, s.variant)
                v = k[..., : s.kv_lora_rank]
            if row.seq_id is None:  # padding: inputs that must not be written
                rows.append(None)
                directions.append(None)
                new_k.append(k[: row.query_len])
                new_v.append(v[: row.query_len])
                continue
            own = shared_tokens if index > 0 else 0
            directions.append(plant_keys(k, s, range(own, row.seq_len), planting))
            if any(s.logit_offsets):  # after planting: every key shares this component
                k[..., -1] = offset_key_component(s)
            k = fit_fp8(k, s.variant.k_scale, s.variant)
            first = rows[0] if rows else None
            if index > 0 and shared_tokens and first is not None:  # the shared pages' tokens
                k[:shared_tokens] = first.key[:shared_tokens]
                v[:shared_tokens] = first.value[:shared_tokens]
            if s.kv_lora_rank is not None:
                v = k[..., : s.kv_lora_rank]  # planted or offset latent rows: their prefix
            cached = row.seq_len - row.query_len
            if cached:
                slots = torch.tensor(token_slots(row.pages, range(cached), s.page_size))
                write_tokens(
                    cache,
                    slots,
                    k[:cached],
                    v[:cached],
                    k_scale=s.variant.k_scale,
                    v_scale=s.variant.v_scale,
                )
            rows.append(SequenceKV(k, v))
            new_k.append(k[cached:])
            new_v.append(v[cached:])
        query = _random(
            gen, (step.num_tokens, s.num_heads, s.head_dim), s, s.magnitude, regime.queries_and_keys
        )
        start = 0
        for row, direction in zip(step.rows, directions, strict=True):
            if direction is not None:  # every query of the row leans toward the planted keys
                tokens = query[start : start + row.query_len]
                tokens += (direction * query_lean(s)).to(query.dtype)
            start += row.query_len
        if any(s.logit_offsets):
            offset_queries(s, step, query)
        inputs.sequences.append(rows)
        inputs.keys.append(torch.cat(new_k))
        inputs.values.append(torch.cat(new_v))
        inputs.queries.append(query)
    return inputs


def fresh_step_tokens(
    inputs: StepInputs, gen: torch.Generator, layer: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Other contents for ``layer``'s query and new K/V: the same shapes, dtype and
    distribution as the step's own (magnitude, value regime, FP8 range, MLA values as
    the latent rows' prefix), drawn from ``gen`` on its device."""
    s = inputs.scenario
    regime = RegimeChannels(s.values, s.head_dim, s.seed)

    def draw(
        like: torch.Tensor, magnitude: float, shape: Callable[..., torch.Tensor]
    ) -> torch.Tensor:
        data = torch.randn(like.shape, generator=gen, device=gen.device) * magnitude
        return shape(data).to(like.dtype)

    query = draw(inputs.queries[layer], s.magnitude, regime.queries_and_keys)
    key = fit_fp8(
        draw(inputs.keys[layer], s.magnitude, regime.queries_and_keys), s.variant.k_scale, s.variant
    )
    if s.kv_lora_rank is not None:
        return query, key, key[..., : s.kv_lora_rank]
    value = fit_fp8(draw(inputs.values[layer], 1.0, regime.values), s.variant.v_scale, s.variant)
    return query, key, value


def with_step_tokens(
    inputs: StepInputs, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> StepInputs:
    """``inputs`` (one layer) with this query and these new tokens' K/V: the same caches,
    step and cached prefix, each sequence ending in the new tokens given."""
    rows: list[SequenceKV | None] = []
    start = 0
    for row, seq in zip(inputs.step.rows, inputs.sequences[0], strict=True):
        new = slice(start, start + row.query_len)
        start += row.query_len
        if seq is None:
            rows.append(None)
            continue
        cached = row.seq_len - row.query_len
        k = torch.cat([seq.key[:cached], key[new].to(seq.key.device)])
        v = torch.cat([seq.value[:cached], value[new].to(seq.value.device)])
        rows.append(SequenceKV(k, v))
    return StepInputs(inputs.scenario, inputs.step, inputs.caches, [query], [key], [value], [rows])


def store_step_tokens(inputs: StepInputs) -> None:
    """Write every layer's new K/V into the caches as a correct backend does (FP8: quantized)."""
    s = inputs.scenario
    slots = inputs.step.metadata.slot_mapping.cpu()
    written = (slots != -1).nonzero().flatten()
    for layer, cache in enumerate(inputs.caches):
        write_tokens(
            cache,
            slots[written],
            inputs.keys[layer].index_select(0, written.to(inputs.keys[layer].device)),
            inputs.values[layer].index_select(0, written.to(inputs.values[layer].device)),
            k_scale=s.variant.k_scale,
            v_scale=s.variant.v_scale,
        )


def check_outputs(inputs: StepInputs, outputs: list[torch.Tensor]) -> list[Comparison]:
    """Compare each layer's output with the float64 oracle (FP8 writes: ``write_problem``)."""
    return [
        compare(output, *inputs.reference(layer), inputs.scenario.dtype)
        for layer, output in enumerate(outputs)
    ]


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
        backend.forward(*inputs.forward_args(layer), layer) for layer in range(scenario.num_layers)
    ]
    return inputs, outputs
