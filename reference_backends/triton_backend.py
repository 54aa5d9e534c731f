"""``triton``: Triton paged-attention kernels (split-KV decode, tiled causal prefill).

Decode rows (one query token) run flash-decoding: each program takes one
query token, one KV head with all the query heads of its GQA group (one K/V
load serves the group), and one range of keys; when a context is longer than
one range (``split_len``, at least 256 keys), the partial results are merged
by their log-sum-exp. Prefill and extend rows run a tiled kernel: a tile of
query tokens of one sequence and one head, an online softmax over key tiles,
bottom-right causal. Both read K/V in place through the block table with the
cache's strides (see ``reference_backends.triton_kernels``).

``prepare`` does all host work: the local block table, the work lists of the
two kernels, the split size and the scratch for partial results. ``forward``
then only writes the new K/V and launches kernels: with ``validate=False``
it does not synchronise with the host, so it can be captured in a CUDA graph;
graph-mode padding rows are simply not scheduled.

On CUDA the kernels are compiled by Triton. On the CPU they run in Triton's
interpreter (no ``TRITON_INTERPRET`` needed, milliseconds per program, so
for small shapes only), with its bf16 made that of compiled Triton
(``harness.core.triton_bf16``): the same kernels, no CPU-only casts. Needs
the ``triton`` extra.
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass
from types import ModuleType

import torch

from harness.core.contract import Capabilities, LayerCache
from harness.core.errors import Unsupported
from harness.core.paged_base import PagedBackendBase, PreparedStep
from harness.core.triton_mode import interpret_triton_here, triton_interprets
from harness.core.validate import CacheGeometry, CheckedMetadata
from harness.core.variants import CACHE_LAYOUTS

LOG2E = 1.4426950408889634
NO_WINDOW = 2**30  # a window no sequence reaches: the kernels' "no sliding window"
MIN_SPLIT_KEYS = 256  # a decode context past this many keys is split (flash-decoding)
DECODE_WARPS = 4  # a decode tile is only a GQA group's rows (>= 16): more warps find no work
_SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Tiling:
    """Block sizes of one device and head dim (powers of two, >= 16 for ``tl.dot``)."""

    block_d: int
    block_m: int  # prefill query tokens per program
    block_n: int  # keys per loop iteration
    num_warps: int
    interpreted: bool = False

    @classmethod
    def choose(cls, head_dim: int, dtype: torch.dtype, interpreted: bool) -> Tiling:
        """Blocks whose Q, K and V tiles (pipelined) fit an SM's shared memory.

        The interpreter's cost is per program and per op, not per element, so
        there tiles are as large as the shapes allow (see ``_block_m``).
        """
        block_d = max(16, triton_next_power_of_2(head_dim))
        if interpreted:
            return cls(block_d=block_d, block_m=16, block_n=64, num_warps=1, interpreted=True)
        wide = block_d * dtype.itemsize  # bytes of one token's head vector
        block_n = 64 if wide <= 256 else 32
        block_m = 64 if wide <= 512 else 32  # fp32 at D = 256: 32 query rows per tile
        warps = 4 if block_d <= 64 else 8
        return cls(block_d=block_d, block_m=block_m, block_n=block_n, num_warps=warps)


def triton_next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class TritonPlan:
    """Everything ``forward`` launches with, built in ``prepare``."""

    block_table: torch.Tensor  # [rows, max_pages] int32, local page ids (0 past the end)
    seq_lens: torch.Tensor  # [rows] int32
    query_start: torch.Tensor  # [rows + 1] int32
    decode_rows: torch.Tensor  # [items] int32: rows with one query token
    decode_tokens: torch.Tensor  # [items] int32: that token
    num_splits: int
    split_len: int
    part_out: torch.Tensor | None  # [items, heads, splits, D] fp32 scratch
    part_lse: torch.Tensor | None  # [items, heads, splits] fp32 scratch
    tile_rows: torch.Tensor  # [tiles] int32: prefill/extend row of each query tile
    tile_starts: torch.Tensor  # [tiles] int32: the tile's first query within its row
    tiling: Tiling  # the device's and dtype's blocks
    block_m: int  # rows of a prefill tile: (query token, query head) pairs
    all_tokens_covered: bool  # every query token is some real row's: no zero fill needed


def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def kernels(device: torch.device) -> ModuleType:
    """The kernel module, compiled by Triton for CUDA or run by its interpreter for the CPU.

    Triton decides when it is imported (its standard library) and when each
    ``@triton.jit`` runs: so the CPU path asks for the interpreter before
    triton's first import (see ``harness.core.triton_mode``), and a process cannot
    use both kinds.
    """
    if device.type == "cpu" and not interpret_triton_here():
        why = (
            "triton was imported in this process without TRITON_INTERPRET=1"
            if "TRITON_INTERPRET" not in os.environ
            else f"TRITON_INTERPRET is {os.environ['TRITON_INTERPRET']!r}"
        )
        raise Unsupported(
            f"the triton backend runs on the CPU only in Triton's interpreter, and {why}: "
            "set TRITON_INTERPRET=1 in the environment before starting Python"
        )
    if device.type == "cuda" and triton_interprets():
        raise Unsupported(
            "TRITON_INTERPRET=1 is set, so Triton would interpret the kernels on the host: "
            "unset it to run the triton backend on CUDA"
        )
    import reference_backends.triton_kernels

    return reference_backends.triton_kernels


class TritonBackend(PagedBackendBase):
    """Paged attention in Triton kernels; DP-aware; CUDA (compiled) and CPU (interpreted)."""

    per_sequence_rows = False

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
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        sinks: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
    ) -> None:
        super().__init__(
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            scale=scale,
            dp_size=dp_size,
            dp_rank=dp_rank,
            validate=validate,
            sliding_window=sliding_window,
            logits_soft_cap=logits_soft_cap,
            sinks=sinks,
            alibi_slopes=alibi_slopes,
        )
        if not _triton_available():
            raise Unsupported(
                "the triton backend needs the triton package: "
                "pip install -c constraints.txt 'attn-harness[triton]'"
            )
        self.group = num_heads // num_kv_heads

    @classmethod
    def capabilities(cls) -> Capabilities:
        """fp32/fp16/bf16, any page size and head dim; CPU (interpreted) and CUDA.

        Without the triton package it claims no device, so a default run of
        every registered backend leaves it out instead of failing on it.
        """
        devices = ("cpu", "cuda") if _triton_available() else ()
        return Capabilities(
            dtypes=_SUPPORTED_DTYPES,
            devices=devices,
            interpreted_devices=("cpu",),
            sliding_window=True,
            soft_cap=True,
            sinks=True,
            alibi=True,
            cache_layouts=CACHE_LAYOUTS,  # the kernels take the cache's strides: HND is a view
            out_buffer=True,
            padding_rows="zero",  # the output is zeroed unless every token is covered
        )

    def bind_kv_caches(self, layer_caches: list[LayerCache]) -> None:
        for index, cache in enumerate(layer_caches):
            for name in ("key", "value"):
                tensor = getattr(cache, name)
                if isinstance(tensor, torch.Tensor) and tensor.dtype not in _SUPPORTED_DTYPES:
                    raise Unsupported(
                        f"layer {index} {name}: dtype {tensor.dtype} is not supported by the "
                        "triton backend (float32, float16, bfloat16)"
                    )
                if isinstance(tensor, torch.Tensor) and tensor.device.type not in ("cpu", "cuda"):
                    raise Unsupported(
                        f"layer {index} {name}: device {tensor.device} is not supported by the "
                        "triton backend (cuda, or cpu through Triton's interpreter)"
                    )
        super().bind_kv_caches(layer_caches)

    # -- prepare: all host work --------------------------------------------

    def plan_step(self, checked: CheckedMetadata, geometry: CacheGeometry) -> TritonPlan:
        device = geometry.device
        kernels(device)  # refuses a device Triton cannot serve in this process, before forward
        interpreted = device.type == "cpu"
        tiling = Tiling.choose(self.head_dim, geometry.dtype, interpreted)
        rows = len(checked.seq_lens)
        width = max([len(p) for p in checked.pages] + [1])
        table = [
            [p - geometry.page_offset for p in pages] + [0] * (width - len(pages))
            for pages in checked.pages
        ]
        query_lens = checked.query_lens
        decode = [r for r in checked.real_rows if query_lens[r] == 1]
        longer = [r for r in checked.real_rows if query_lens[r] > 1]
        block_m = self._block_m(tiling, max([query_lens[r] for r in longer] + [1]))
        per_tile = block_m // triton_next_power_of_2(self.group)
        tiles = [(r, t) for r in longer for t in range(0, query_lens[r], per_tile)]
        longest = max([checked.seq_lens[r] for r in decode] + [1])
        num_splits = self._num_splits(longest, len(decode), device)
        split_len = math.ceil(math.ceil(longest / num_splits) / tiling.block_n) * tiling.block_n
        num_splits = math.ceil(longest / split_len)
        covered = sum(query_lens[r] for r in checked.real_rows) == len(checked.slots)

        def int32(values: list[int] | list[list[int]]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=device)

        part_out = part_lse = None
        if decode and num_splits > 1:
            part_out = torch.empty(
                (len(decode), self.num_heads, num_splits, self.head_dim),
                dtype=torch.float32,
                device=device,
            )
            part_lse = torch.empty(
                (len(decode), self.num_heads, num_splits), dtype=torch.float32, device=device
            )
        return TritonPlan(
            block_table=int32(table if rows else [[0]]),
            seq_lens=int32(checked.seq_lens or [0]),
            query_start=int32(checked.query_start),
            decode_rows=int32(decode),
            decode_tokens=int32([checked.query_start[r] for r in decode]),
            num_splits=num_splits,
            split_len=split_len,
            part_out=part_out,
            part_lse=part_lse,
            tile_rows=int32([r for r, _ in tiles]),
            tile_starts=int32([t for _, t in tiles]),
            tiling=tiling,
            block_m=block_m,
            all_tokens_covered=covered,
        )

    def _block_m(self, tiling: Tiling, longest_query: int) -> int:
        """Rows of a prefill tile: (query token, query head) pairs, a power of two.

        On the CPU a tile takes a whole short query at once, as the
        interpreter's cost is per program.
        """
        group_pad = triton_next_power_of_2(self.group)
        rows = max(tiling.block_m, group_pad)
        if tiling.interpreted:
            rows = max(rows, min(256, triton_next_power_of_2(longest_query * group_pad)))
        return rows

    def _num_splits(self, longest: int, items: int, device: torch.device) -> int:
        """Key ranges per decode query: enough programs to fill the device.

        Never ranges shorter than ``MIN_SPLIT_KEYS``. On the CPU (interpreted)
        every context past that is split, so the merge path is exercised.
        """
        most = max(1, math.ceil(longest / MIN_SPLIT_KEYS))
        if device.type != "cuda":
            return most
        programs = 4 * torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(most, math.ceil(programs / max(1, items * self.num_kv_heads))))

    def _per_head(self, which: str, device: torch.device) -> torch.Tensor:
        """``per_head(which)``, or a one-element dummy when the variant has none (the
        kernels take a pointer anyway)."""
        values = self.per_head(which, device)
        if values is not None:
            return values
        dummies: dict[torch.device, torch.Tensor] = self.__dict__.setdefault("_dummies", {})
        if device not in dummies:
            dummies[device] = torch.zeros(1, dtype=torch.float32, device=device)
        return dummies[device]

    # -- forward: launches only ---------------------------------------------

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        plan: TritonPlan = step.plan
        code = kernels(query.device)
        tiling = plan.tiling
        precision = "ieee" if query.dtype == torch.float32 else "tf32"
        make = torch.empty if plan.all_tokens_covered else torch.zeros
        out = make(query.shape, dtype=query.dtype, device=query.device)
        key, value = cache.key_nhd, cache.value_nhd  # an HND cache as an NHD view: strides differ
        scale_log2 = self.scale * LOG2E  # the kernels use exp2
        variant = self.variant
        cap = variant.logits_soft_cap or 1.0
        sinks = self._per_head("sinks", query.device)
        common = (
            *query.stride(),
            *key.stride(),
            *value.stride(),
            *out.stride(),
            plan.block_table.stride(0),
            scale_log2,
            key.shape[1],
            variant.sliding_window or NO_WINDOW,
            self.scale / cap,  # the soft-cap's tanh argument per unit of q.k
            cap * LOG2E,
            sinks,
            self._per_head("alibi_slopes", query.device),
        )
        flags = {
            "SOFT_CAP": variant.logits_soft_cap is not None,
            "HAS_SINKS": variant.sinks is not None,
            "HAS_ALIBI": variant.alibi_slopes is not None,
        }
        items = plan.decode_rows.numel()
        if items:
            split = plan.num_splits > 1
            code.decode_split_kernel[(items, self.num_kv_heads, plan.num_splits)](
                query,
                key,
                value,
                out,
                plan.part_out if split else out,
                plan.part_lse if split else out,
                plan.block_table,
                plan.seq_lens,
                plan.decode_rows,
                plan.decode_tokens,
                *common,
                plan.split_len,
                plan.num_splits,
                self.num_heads,
                **flags,
                GROUP=self.group,
                BLOCK_H=max(16, triton_next_power_of_2(self.group)),
                HEAD_DIM=self.head_dim,
                BLOCK_D=tiling.block_d,
                BLOCK_N=tiling.block_n,
                SPLIT=split,
                PRECISION=precision,
                num_warps=DECODE_WARPS,
            )
            if split:
                code.merge_splits_kernel[(items, self.num_heads)](
                    plan.part_out,
                    plan.part_lse,
                    out,
                    plan.decode_tokens,
                    sinks,
                    *out.stride(),
                    plan.num_splits,
                    self.num_heads,
                    HAS_SINKS=flags["HAS_SINKS"],
                    HEAD_DIM=self.head_dim,
                    BLOCK_D=tiling.block_d,
                    BLOCK_S=max(2, triton_next_power_of_2(plan.num_splits)),
                )
        tiles = plan.tile_rows.numel()
        if tiles:
            code.prefill_kernel[(tiles, self.num_kv_heads)](
                query,
                key,
                value,
                out,
                plan.block_table,
                plan.seq_lens,
                plan.query_start,
                plan.tile_rows,
                plan.tile_starts,
                *common,
                **flags,
                GROUP=self.group,
                GROUP_PAD=triton_next_power_of_2(self.group),
                HEAD_DIM=self.head_dim,
                BLOCK_D=tiling.block_d,
                BLOCK_M=plan.block_m,
                BLOCK_N=tiling.block_n,
                CAUSAL=step.checked.causal,
                PRECISION=precision,
                num_warps=tiling.num_warps,
            )
        return out
