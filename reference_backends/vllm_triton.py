"""``vllm-triton``: vLLM's Triton ``unified_attention``, from the installed ``vllm``.

The kernel is vLLM's own file (``vllm/v1/attention/ops/
triton_unified_attention.py`` and its helpers), loaded by path from the
installed package; the engine modules it imports (``envs``, ``logger``,
``platforms``, ``triton_utils``, ``kv_cache_interface``) are supplied as the
few names it reads (NVIDIA or the CPU, never ROCm). Called as vLLM's
``TritonAttentionImpl`` calls it: a ``(window - 1, 0)`` window, per-tensor FP8
scales, and the split-KV (3D) decode below vLLM's threshold of
``128 // num_kv_heads`` query blocks, with scratch for 16 segments.

Claims what vLLM's ``TritonAttentionBackend`` declares: fp16/bf16/fp32,
pages a multiple of 16, head dims of at least 32, window, soft-cap, sinks,
ALiBi, non-causal, FP8 caches. Without ``vllm`` or ``triton`` it claims no device.
"""

from __future__ import annotations

import enum
import functools
import logging
from types import ModuleType
from typing import Any

import torch

from harness.core.contract import Capabilities, LayerCache
from harness.core.engine_metadata import vllm_metadata
from harness.core.paged_base import PreparedStep
from harness.core.triton_mode import triton_interprets
from reference_backends.engine_backend import EngineKernelBackend
from reference_backends.engine_modules import load_engine_files, stand_in

OPS = "vllm.v1.attention.ops"
SEGMENTS = 16  # vLLM's NUM_PAR_SOFTMAX_SEGMENTS
MIN_GRID_2D = 128  # vLLM's MIN_LAUNCH_GRID_SIZE_2D
WIDEST_TILE = 128  # the widest key tile the kernel reads block-table entries for


class KVQuantMode(enum.IntEnum):
    """``vllm.v1.kv_cache_interface.KVQuantMode``, the members the kernel file names."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4


def engine_modules() -> dict[str, ModuleType]:
    """The vLLM modules the kernel files import, as far as they use them."""
    import triton
    import triton.language as tl

    cuda = torch.cuda.is_available() and not triton_interprets()  # reads; never chooses

    def capability_family(family: int) -> bool:
        major, minor = torch.cuda.get_device_capability() if cuda else (0, 0)
        return (major * 10 + minor) // 10 == family // 10

    logger = logging.getLogger("vllm-triton")
    logger.debug_once = logger.debug  # type: ignore[attr-defined]
    platform = stand_in(
        "current_platform",
        fp8_dtype=lambda: torch.float8_e4m3fn,
        is_rocm=lambda: False,
        is_device_capability_family=capability_family,
    )
    return {
        "vllm.envs": stand_in("vllm.envs", VLLM_BATCH_INVARIANT=False),
        "vllm.logger": stand_in("vllm.logger", init_logger=lambda name: logger),
        "vllm.platforms": stand_in("vllm.platforms", current_platform=platform),
        "vllm.triton_utils": stand_in("vllm.triton_utils", tl=tl, triton=triton),
        "vllm.v1.kv_cache_interface": stand_in(
            "vllm.v1.kv_cache_interface", KVQuantMode=KVQuantMode
        ),
    }


class VllmTritonBackend(EngineKernelBackend):
    """vLLM's Triton unified attention kernel behind the harness's contract."""

    adapter, engine = "vllm-triton", "vllm"

    @staticmethod
    @functools.cache
    def load_kernels() -> Any:
        """vLLM's ``unified_attention``, loaded once per process."""
        names = [f"{OPS}.triton_attention_helpers", f"{OPS}.triton_unified_attention"]
        loaded = load_engine_files("vllm", names, engine_modules())
        return loaded[f"{OPS}.triton_unified_attention"].unified_attention

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(
            dtypes=(torch.float32, torch.float16, torch.bfloat16),
            devices=cls.engine_devices(),
            interpreted_devices=("cpu",),
            page_size_multiple=16,
            min_head_dim=32,
            sliding_window=True,
            soft_cap=True,
            sinks=True,
            alibi=True,
            kv_cache_dtypes=("auto", "fp8_e4m3", "fp8_e5m2"),
            cache_layouts=("NHD", "HND"),
            out_buffer=True,
        )

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        kernel = self.kernels_for(query)
        view = vllm_metadata(step, pages_per_tile=-(-WIDEST_TILE // cache.page_size))
        query = query.contiguous()  # vLLM's layers pass [tokens, heads, D] with unit D stride
        device, tokens = query.device, query.shape[0]
        out = torch.empty_like(query)
        scratch = (tokens, self.num_heads, SEGMENTS)
        padded = 1 << (self.head_dim - 1).bit_length()
        fp8 = self.variant.kv_cache_dtype != "auto"
        rows = len(step.checked.seq_lens)

        def scale(value: float) -> torch.Tensor:
            return torch.full((rows, self.num_kv_heads), value, dtype=torch.float32, device=device)

        window = self.variant.sliding_window
        kernel(
            q=query, k=cache.key_nhd, v=cache.value_nhd, out=out,
            cu_seqlens_q=view.cu_seqlens_q, max_seqlen_q=view.max_seqlen_q,
            seqused_k=view.seqused_k, max_seqlen_k=view.max_seqlen_k,
            softmax_scale=self.scale, causal=step.checked.causal,
            window_size=(window - 1, 0) if window else (-1, -1),
            block_table=view.block_table, softcap=self.variant.logits_soft_cap or 0.0,
            q_descale=None, k_descale=scale(self.variant.k_scale),
            v_descale=scale(self.variant.v_scale),
            seq_threshold_3D=MIN_GRID_2D // self.num_kv_heads,
            num_par_softmax_segments=SEGMENTS,
            softmax_segm_output=torch.empty(*scratch, padded, dtype=torch.float32, device=device),
            softmax_segm_max=torch.empty(scratch, dtype=torch.float32, device=device),
            softmax_segm_expsum=torch.empty(scratch, dtype=torch.float32, device=device),
            alibi_slopes=self.per_head("alibi_slopes", device),
            sinks=self.per_head("sinks", device),
            kv_quant_mode=KVQuantMode.FP8_PER_TENSOR if fp8 else KVQuantMode.NONE,
        )  # fmt: skip
        return out
