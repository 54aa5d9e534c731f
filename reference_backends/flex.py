"""``flex``: torch FlexAttention with a block mask over the step's cache pages.

What upstream does. torch's paged FlexAttention
(``torch.nn.attention.experimental._paged_attention.PagedAttention``) hands
``flex_attention`` the whole pool as one long key sequence and a block mask
whose key blocks are physical pages, with a ``mask_mod`` mapping physical
slots back to logical positions. Masking sets a score to ``-inf`` and the
probability becomes 0, but the value rows are still multiplied in:
``0 * NaN`` is NaN. So garbage in the cache reaches the output. The eager
path (``math_attention``) multiplies the probabilities by *every* value row of
the pool, so any NaN anywhere in it poisons every output; the compiled
kernels skip pages the block mask leaves out but load whole blocks, so the
unwritten tail of a sequence's last page still poisons a sequence that ends
mid-page. Upstream also needs ``page_size`` to equal the key block size
(the Triton kernels want a multiple of 16), and its Triton kernels refuse
head dims below 16.

What this backend does. It does not use that helper: ``forward`` gathers
the pages of the rows with query tokens (block copies through the possibly
strided cache views, as ``sdpa`` does) into one packed ``[N, KV, D]``
buffer, sequence after sequence, and zeroes the rows that are not tokens
(each last page's tail, and the padding up to a whole key block).
Everything flex then reads is a finite token, so a masked probability of 0
contributes exactly 0 on either path. The block mask is built on the host
in ``prepare`` from the lengths alone: query ``q`` of batch entry ``b``
sees the packed rows ``lo[b, q] <= kv < hi[b, q]``, its sequence's first
row up to its own position (bottom-right causal) or to the sequence's end
(non-causal). Key blocks wholly inside every query's range are marked full,
so the compiled kernels skip ``mask_mod`` there, and blocks outside all
ranges are never visited. Key blocks are no longer pages, so any page size
works; query heads share their KV head through ``enable_gqa``.

Eager or compiled. ``compiled=None`` (the default) compiles
``flex_attention`` on CUDA and runs it eagerly elsewhere (compiling on the
CPU works too, ``compiled=True``, but costs 10-20 s per configuration).

* Compiled calls batch rows as the kernels like them: one call when every
  row has the same query length, else decode rows in one call and each
  longer query in a call of its own; one batch entry per row, no query
  padding, over the whole packed buffer broadcast from batch 1, the block
  mask skipping other rows' keys. They use ``dynamic=True`` so lengths and
  batch sizes do not each compile anew (about five graphs per dtype and
  head shape: size-1 batch and query dims specialise), run with dynamo's
  recompile limit raised to ``RECOMPILE_LIMIT`` for the call (its default
  of 8 graphs per function is soon spent across dtypes and head shapes,
  after which dynamo silently runs flex eagerly), and zero-pad head dims
  below 16 (``compiled_min_head_dim``; Triton's ``tl.dot`` needs 16). A
  configuration whose compilation fails warns once per process and runs
  eagerly, over the whole buffer: correct, but slow and memory-hungry.
  Compilation happens in a configuration's first ``forward``, which
  benchmark warm-up absorbs.
* The eager path (``math_attention``) ignores block sparsity, materialises
  ``[B, H, q, keys]`` scores and costs ~30 ms a call at any size (it vmaps
  ``mask_mod`` through fx graphs). So eager calls pack consecutive rows
  into one batch entry while that adds fewer scores than a call of the row's
  own would cost (``EAGER_CALL_SCORES``) and the scores stay under
  ``EAGER_SCORES``, cut a long row into query ranges, and read only the keys
  their rows need.

Capabilities: everything the contract names (every float dtype, page size
and head dim, graph-mode padding, non-causal, any DP size) on CPU and CUDA;
nothing is declared unsupported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from harness.core.contract import Capabilities, LayerCache
from harness.core.paged_base import PagedBackendBase, PreparedStep
from harness.core.validate import CacheGeometry, CheckedMetadata

BLOCK = 128  # flex's default sparse block size, for queries and keys
EAGER_SCORES = 1 << 24  # most scores one eager call materialises (B * H * q * keys)
EAGER_CALL_SCORES = 1 << 20  # an eager call's fixed cost in scores computed (~30 ms on a CPU)
MIN_COMPILED_HEAD_DIM = 16  # Triton's tl.dot needs at least 16 columns
RECOMPILE_LIMIT = 64  # graphs of compiled flex_attention kept before dynamo gives up

_FROM_KV_BLOCKS_ARGS = inspect.signature(BlockMask.from_kv_blocks).parameters
_compiled_flex: Callable[..., Any] | None = None
_EAGER_FALLBACK: set[tuple[Any, ...]] = set()  # configurations the compiler failed on


def _compiled() -> Callable[..., Any]:
    """``flex_attention`` compiled once per process, with lengths dynamic."""
    global _compiled_flex
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=True)
    return _compiled_flex


def _recompile_limit() -> contextlib.AbstractContextManager[Any]:
    """Dynamo's recompile limit raised for one call (named ``cache_size_limit`` before 2.7)."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            return config.patch(**{name: max(RECOMPILE_LIMIT, getattr(config, name))})
    return contextlib.nullcontext()


@dataclass(frozen=True)
class FlexCall:
    """One ``flex_attention`` call: ``batch`` entries of ``q_len`` query tokens each.

    ``tokens`` holds the query token ids in ``[batch, q_len]`` order (``None``:
    every token in order, so the result is the output); ``keys`` the packed
    rows the call reads (the whole buffer when compiled); ``block_mask`` is
    over those rows.
    """

    batch: int
    q_len: int
    tokens: torch.Tensor | None
    keys: slice
    block_mask: BlockMask


@dataclass(frozen=True)
class FlexPlan:
    """A step's gather indices, the rows to zero and its flex calls."""

    pages: torch.Tensor  # local page ids, sequence after sequence
    num_rows: int  # packed buffer rows: pages * page_size rounded up to BLOCK
    dead_rows: torch.Tensor | None  # rows of the packed buffer that are not tokens
    calls: list[FlexCall]
    compiled: bool
    head_dim: int  # the head dim flex sees (padded when compiled and small)


@dataclass(frozen=True)
class _Row:
    """A sequence's query tokens and its packed key rows ``[lo, lo + length)``."""

    start: int  # first query token
    q_len: int
    length: int
    lo: int


_Segment = tuple[_Row, int, int]  # a row's query tokens [offset, offset + count)
_Entry = list[_Segment]  # one batch entry of a call: segments, in token order


def _compiled_calls(rows: list[_Row]) -> list[list[_Entry]]:
    """Calls as the kernels like them: one batch entry per row and no query padding.

    All rows in one call when their query lengths agree; otherwise decode rows
    in one call and each longer query in a call of its own.
    """
    if len({r.q_len for r in rows}) <= 1:
        groups = [rows] if rows else []
    else:
        decode = [r for r in rows if r.q_len == 1]
        groups = ([decode] if decode else []) + [[r] for r in rows if r.q_len > 1]
    return [[[(row, 0, row.q_len)] for row in group] for group in groups]


def _eager_calls(rows: list[_Row], num_heads: int) -> list[list[_Entry]]:
    """Calls of one packed entry each, of at most about ``EAGER_SCORES`` scores.

    The eager path computes every score of an entry, ``[H, tokens, span]`` with
    ``span`` from the first row's keys to the last one's, and costs ~30 ms a call
    whatever its size (it vmaps the mask through fx graphs). So a row joins the
    entry while that costs fewer scores than a call of its own would
    (``EAGER_CALL_SCORES`` plus its own scores): many decodes share a call, and
    many short prefills are not packed into one near-empty square (128 prefills
    of 64 tokens in one entry are 128x the scores they need). A long row is cut
    into query ranges.
    """
    calls: list[list[_Entry]] = []
    entry: _Entry = []
    tokens = span = 0
    for row in rows:
        step = max(1, EAGER_SCORES // (num_heads * row.length))
        for offset in range(0, row.q_len, step):
            count = min(step, row.q_len - offset)
            if entry:
                joined = row.lo + row.length - entry[0][0].lo
                added = ((tokens + count) * joined - tokens * span) * num_heads
                alone = count * row.length * num_heads + EAGER_CALL_SCORES
                if added > alone or (tokens + count) * joined * num_heads > EAGER_SCORES:
                    calls.append([entry])
                    entry, tokens = [], 0
            span = row.lo + row.length - (entry[0][0].lo if entry else row.lo)
            entry.append((row, offset, count))
            tokens += count
    if entry:
        calls.append([entry])
    return calls


def _mask_mod(lo: torch.Tensor, hi: torch.Tensor) -> Callable[..., Any]:
    """Query ``q`` of entry ``b`` sees the packed keys ``lo[b, q] <= kv < hi[b, q]``."""

    def mask_mod(
        b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        return (kv_idx >= lo[b, q_idx]) & (kv_idx < hi[b, q_idx])

    return mask_mod


def _blocks(lo: list[int], hi: list[int], q_block: int) -> tuple[list[int], list[int]]:
    """Partial and full key blocks of one query block of one entry.

    A block's queries form runs of one row each (one ``lo``, ``hi`` growing).
    A run may see keys ``[lo, hi of its last query)``; a key block wholly
    inside ``[lo, hi of its first query)`` is full when the query block is
    one run, and every other touched key block is partial.
    """
    qa, qb = q_block * BLOCK, min(len(lo), (q_block + 1) * BLOCK)
    touched: set[int] = set()
    runs = 0
    for j in range(qa, qb):
        if j == qa or lo[j] != lo[j - 1]:
            runs += 1
            touched.update(range(lo[j] // BLOCK, (hi[j] - 1) // BLOCK + 1))
        elif j + 1 == qb or lo[j + 1] != lo[j]:  # the run's last query sees the most
            touched.update(range(lo[j] // BLOCK, (hi[j] - 1) // BLOCK + 1))
    full = range(-(-lo[qa] // BLOCK), hi[qa] // BLOCK) if runs == 1 else range(0)
    return sorted(touched.difference(full)), list(full)


def _block_mask(
    bounds: list[tuple[list[int], list[int]]], num_keys: int, device: torch.device
) -> BlockMask:
    """The block mask of ``_mask_mod`` over ``bounds``, one ``(lo, hi)`` per entry."""
    q_len = len(bounds[0][0])
    q_blocks = math.ceil(q_len / BLOCK)
    per_entry = [[_blocks(lo, hi, i) for i in range(q_blocks)] for lo, hi in bounds]
    # as wide as there are key blocks: the compiled kernels read the key range from it
    width = max([-(-num_keys // BLOCK), *(len(p) + len(f) for e in per_entry for p, f in e)])

    def ordered(which: int) -> tuple[torch.Tensor, torch.Tensor]:
        counts = torch.zeros(len(bounds), 1, q_blocks, dtype=torch.int32)
        indices = torch.zeros(len(bounds), 1, q_blocks, width, dtype=torch.int32)
        for b, entry in enumerate(per_entry):
            for i, both in enumerate(entry):
                blocks = both[which]
                counts[b, 0, i] = len(blocks)
                if blocks:
                    indices[b, 0, i, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        return counts.to(device), indices.to(device)

    kv_num, kv_idx = ordered(0)
    full_num, full_idx = ordered(1)
    lo, hi = (
        torch.tensor([bound[k] for bound in bounds], dtype=torch.int32, device=device)
        for k in range(2)
    )
    extra: dict[str, Any] = {}
    if "compute_q_blocks" in _FROM_KV_BLOCKS_ARGS:  # transposed indices serve only backward
        extra["compute_q_blocks"] = False
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=BLOCK,
        mask_mod=_mask_mod(lo, hi),
        seq_lengths=(q_len, num_keys),
        **extra,
    )


class FlexBackend(PagedBackendBase):
    """Paged attention through torch FlexAttention over a NaN-free packed copy of the pages.

    ``compiled``: ``True`` compiles ``flex_attention``, ``False`` runs it
    eagerly, ``None`` compiles on CUDA only (see the module docstring).
    """

    per_sequence_rows = False
    compiled_min_head_dim: ClassVar[dict[str, int]] = {"cuda": MIN_COMPILED_HEAD_DIM}
    """Head dims below this are zero-padded when compiled (Triton's ``tl.dot`` needs 16)."""

    @classmethod
    def capabilities(cls) -> Capabilities:
        """The base's claim; padding rows come out zero (they see no key, or are zeroed)."""
        return dataclasses.replace(super().capabilities(), padding_rows="zero")

    def __init__(
        self,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        dp_size: int = 1,
        dp_rank: int = 0,
        validate: bool = True,
        compiled: bool | None = None,
    ) -> None:
        super().__init__(
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            scale=scale,
            dp_size=dp_size,
            dp_rank=dp_rank,
            validate=validate,
        )
        self.compiled = compiled
        self._buffers: dict[str, torch.Tensor] = {}

    def _use_compiled(self, geometry: CacheGeometry) -> bool:
        if self.compiled is None:
            return geometry.device.type == "cuda"
        return self.compiled

    def plan_step(self, checked: CheckedMetadata, geometry: CacheGeometry) -> FlexPlan:
        size, device = geometry.page_size, geometry.device
        compiled = self._use_compiled(geometry)
        rows: list[_Row] = []
        pages: list[int] = []
        dead: list[int] = []
        for r in checked.real_rows:
            q_len = checked.query_lens[r]
            if q_len == 0:
                continue  # no query tokens: nothing to read
            length, lo = checked.seq_lens[r], len(pages) * size
            rows.append(_Row(checked.query_start[r], q_len, length, lo))
            pages.extend(p - geometry.page_offset for p in checked.pages[r])
            dead.extend(range(lo + length, len(pages) * size))  # the last page's tail
        num_rows = max(BLOCK, -(-len(pages) * size // BLOCK) * BLOCK)
        dead.extend(range(len(pages) * size, num_rows))
        entries = _compiled_calls(rows) if compiled else _eager_calls(rows, self.num_heads)
        total = len(checked.slots) if len(entries) == 1 else -1  # one call may be the output
        calls = [self._call(e, checked.causal, compiled, num_rows, total, device) for e in entries]
        head_dim = self.head_dim
        if compiled:
            head_dim = max(head_dim, self.compiled_min_head_dim.get(device.type, 0))
        plan = FlexPlan(
            pages=torch.tensor(pages, dtype=torch.long, device=device),
            num_rows=num_rows,
            dead_rows=torch.tensor(dead, dtype=torch.long, device=device) if dead else None,
            calls=calls,
            compiled=compiled,
            head_dim=head_dim,
        )
        for which in ("key", "value"):  # sized here, not in forward (graph capture)
            self._buffer(which, plan, geometry)
        return plan

    def _call(
        self,
        entries: list[_Entry],
        causal: bool,
        compiled: bool,
        num_rows: int,
        num_tokens: int,
        device: torch.device,
    ) -> FlexCall:
        """One call's query tokens, key range and block mask (keys cut to need when eager).

        ``tokens`` is ``None`` when the call's queries are all ``num_tokens``, in order.
        """
        keys = slice(0, num_rows)
        if not compiled:  # one entry: its first row's keys to its last query's
            row, offset, count = entries[0][-1]
            stop = row.lo + row.length
            if causal:
                stop = row.lo + row.length - row.q_len + offset + count
            keys = slice(entries[0][0][0].lo, stop)
        bounds: list[tuple[list[int], list[int]]] = []
        tokens: list[int] = []
        for entry in entries:
            lo: list[int] = []
            hi: list[int] = []
            for row, offset, count in entry:
                first = row.lo - keys.start
                end = first + row.length
                lo.extend([first] * count)
                if causal:  # query j of the row is at position length - q_len + j
                    hi.extend(
                        range(end - row.q_len + offset + 1, end - row.q_len + offset + count + 1)
                    )
                else:
                    hi.extend([end] * count)
                tokens.extend(range(row.start + offset, row.start + offset + count))
            bounds.append((lo, hi))
        return FlexCall(
            batch=len(entries),
            q_len=len(bounds[0][0]),
            tokens=None
            if tokens == list(range(num_tokens))
            else torch.tensor(tokens, dtype=torch.long, device=device),
            keys=keys,
            block_mask=_block_mask(bounds, keys.stop - keys.start, device),
        )

    def _buffer(self, which: str, plan: FlexPlan, geometry: CacheGeometry) -> torch.Tensor:
        """The reusable packed ``[num_rows, KV, head_dim]`` buffer (pad columns stay 0)."""
        shape = (plan.num_rows, self.num_kv_heads, plan.head_dim)
        current = self._buffers.get(which)
        if (
            current is None
            or current.shape[0] < shape[0]
            or current.shape[1:] != shape[1:]
            or current.dtype != geometry.dtype
            or current.device != geometry.device
        ):
            current = torch.zeros(shape, dtype=geometry.dtype, device=geometry.device)
            self._buffers[which] = current
        return current[: shape[0]]

    def _pack(
        self, tensor: torch.Tensor, which: str, plan: FlexPlan, geometry: CacheGeometry
    ) -> torch.Tensor:
        """The step's pages, packed, with every non-token row zeroed: ``[1, KV, N, D]``."""
        buffer = self._buffer(which, plan, geometry)
        used = plan.pages.numel() * geometry.page_size
        if plan.head_dim == self.head_dim:
            # index_select follows the cache's strides: a strided half is read in place
            out = buffer[:used].view(plan.pages.numel(), geometry.page_size, *buffer.shape[1:])
            torch.index_select(tensor, 0, plan.pages, out=out)
        else:  # padded head dim: the pad columns were zeroed when the buffer was made
            gathered = tensor.index_select(0, plan.pages).flatten(0, 1)
            buffer[:used, :, : self.head_dim].copy_(gathered)
        if plan.dead_rows is not None:  # tails and padding: garbage (maybe NaN) or stale
            buffer.index_fill_(0, plan.dead_rows, 0)
        return buffer.unsqueeze(0).transpose(1, 2)

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        geometry = self._require_bound()
        plan: FlexPlan = step.plan
        if not plan.calls:  # only padding rows or empty queries: nothing is checked
            return torch.zeros_like(query)
        key = self._pack(cache.key, "key", plan, geometry)
        value = self._pack(cache.value, "value", plan, geometry)
        if plan.head_dim != self.head_dim:
            query = torch.nn.functional.pad(query, (0, plan.head_dim - self.head_dim))
        out = None if plan.calls[0].tokens is None else torch.zeros_like(query)
        for call in plan.calls:
            q = query if call.tokens is None else query.index_select(0, call.tokens)
            q = q.reshape(call.batch, call.q_len, self.num_heads, plan.head_dim).transpose(1, 2)
            result = self._flex(q, key[:, :, call.keys], value[:, :, call.keys], call, plan)
            result = result.transpose(1, 2).reshape(-1, self.num_heads, plan.head_dim)
            if out is None:
                out = result
            else:
                assert call.tokens is not None
                out.index_copy_(0, call.tokens, result)
        assert out is not None
        return out[..., : self.head_dim].contiguous()

    def _flex(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        call: FlexCall,
        plan: FlexPlan,
    ) -> torch.Tensor:
        """One flex call, compiled when the plan says so and this configuration compiles."""
        kwargs: dict[str, Any] = {
            "block_mask": call.block_mask,
            "scale": self.scale,
            "enable_gqa": self.num_heads != self.num_kv_heads,
        }
        config = (query.device.type, query.dtype, self.num_heads, self.num_kv_heads, plan.head_dim)
        if plan.compiled and config not in _EAGER_FALLBACK:
            try:
                with _recompile_limit():
                    result: torch.Tensor = _compiled()(query, key, value, **kwargs)
                return result
            except Exception as error:  # a compiler limit: stay correct, say so once
                _EAGER_FALLBACK.add(config)
                warnings.warn(
                    f"flex: compiled flex_attention failed for {config} ({error!r}); "
                    "running it eagerly (correct, but slow)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        with warnings.catch_warnings():  # the eager path is chosen here, not by mistake
            warnings.filterwarnings("ignore", message="flex_attention called without")
            eager: torch.Tensor = flex_attention(query, key, value, **kwargs)
        return eager
