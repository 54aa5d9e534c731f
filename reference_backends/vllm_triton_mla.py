"""``vllm-triton-mla``: vLLM's Triton MLA decode (``TRITON_MLA``), from the installed ``vllm``.

The kernel is vLLM's own file (``vllm/v1/attention/ops/triton_decode_attention.py``,
``decode_attention_fwd`` with ``is_mla=True``), loaded by path from the installed
package with the engine modules it reads supplied as in ``vllm-triton``. Called as
``TritonMLAImpl.forward_mqa`` calls it: the latent cache with one head as the keys,
its first ``kv_lora_rank`` entries as the values, split-KV partials
(``attn_logits``, ``kv_lora_rank + 1`` wide: the log-sum-exp beside each partial)
merged by its second stage, the number of splits chosen by vLLM's rule (a power of
two of the longest context over 512, at most twice the device's multiprocessors).
The kernel is decode-only, so every query token is a decode row over its sequence's
pages up to its own causal extent (the kit's ``decode_rows``), as ``forward_mqa``
expands speculative rows.

Claims what vLLM's ``TritonMLABackend`` declares: fp16 and bf16 (fp16 alone on the CPU,
where the interpreter's bf16 is emulated op by op), pages a multiple of 16, any latent
geometry. Without ``vllm`` or ``triton`` it claims no device.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from harness.core.contract import Capabilities, LayerCache
from harness.core.engine_metadata import decode_rows
from harness.core.paged_base import PreparedStep
from reference_backends.engine_backend import EngineKernelBackend
from reference_backends.engine_modules import load_engine_files
from reference_backends.vllm_triton import OPS, engine_modules

MIN_WORK_PER_SPLIT = 512  # vLLM's _MIN_WORK_PER_SPLIT
SPLIT_OCCUPANCY = 2  # vLLM's _SPLIT_OCCUPANCY_MULTIPLIER
INTERPRETED_MULTIPROCESSORS = 4  # on the CPU: at most 8 splits, as a small GPU would take


def num_kv_splits(max_seq_len: int, multiprocessors: int) -> int:
    """vLLM's ``_compute_num_kv_splits``: a power of two of the work, capped by occupancy."""
    ideal = 1 << (max(1, max_seq_len // MIN_WORK_PER_SPLIT) - 1).bit_length()
    return min(ideal, multiprocessors * SPLIT_OCCUPANCY)


class VllmTritonMlaBackend(EngineKernelBackend):
    """vLLM's Triton MLA decode kernel behind the harness's contract (kind ``mla``)."""

    adapter, engine = "vllm-triton-mla", "vllm"

    @staticmethod
    @functools.cache
    def load_kernels() -> Any:
        """vLLM's ``decode_attention_fwd``, loaded once per process."""
        name = f"{OPS}.triton_decode_attention"
        return load_engine_files("vllm", [name], engine_modules())[name].decode_attention_fwd

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(
            kind="mla",
            dtypes=(torch.float16, torch.bfloat16),
            # interpreted on the CPU, bf16 arithmetic is emulated op by op (the interpreter's
            # own is wrong): decode rows of a prefill then take minutes, so fp16 only there
            dtypes_by_device={"cpu": (torch.float16,)},
            devices=cls.engine_devices(),
            interpreted_devices=("cpu",),
            page_size_multiple=16,
            padding_rows="zero",  # padding rows are never run; the output starts zeroed
            out_buffer=True,
            query_tile=1,  # one decode row per query token: what an interpreted run costs
        )

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        kernel = self.kernels_for(query)
        rows = decode_rows(step)
        out = query.new_zeros(query.shape[0], self.num_heads, self.value_dim)
        if rows.num_rows == 0:
            return out
        device = query.device
        decoded = query.new_zeros(rows.num_rows, self.num_heads, self.value_dim)
        lse = query.new_zeros(rows.num_rows, self.num_heads)
        multiprocessors = (
            torch.cuda.get_device_properties(device).multi_processor_count
            if device.type == "cuda"
            else INTERPRETED_MULTIPROCESSORS
        )
        splits = num_kv_splits(max(step.checked.seq_lens), multiprocessors)
        partials = torch.empty(
            rows.num_rows, self.num_heads, splits, self.value_dim + 1, dtype=torch.float32,
            device=device,
        )  # fmt: skip
        latent = cache.key_nhd  # [pages, page_size, 1, kv_lora_rank + rope_dim]
        kernel(
            query.index_select(0, rows.tokens).contiguous(), latent,
            latent[..., : self.value_dim], decoded, lse, rows.block_table, rows.seq_lens,
            partials, splits, self.scale, cache.page_size, is_mla=True,
        )  # fmt: skip
        return out.index_copy_(0, rows.tokens, decoded)
