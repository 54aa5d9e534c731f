"""``sglang-triton``: SGLang's Triton decode and extend kernels, from the installed ``sglang``.

The kernels are SGLang's own files (``sglang/kernels/ops/attention/
decode_attention.py`` and ``extend_attention.py``), loaded by path from the
installed wheel (``pip install --no-deps sglang``); the one server module
they import, ``sglang.srt.utils``, is supplied as the five platform probes
they call (NVIDIA or the CPU, never ROCm). Called as SGLang's Triton backend
calls them: decode when every row decodes one token (8 KV splits, its
default; a window reads the trimmed tables its ``update_sliding_window_buffer``
builds, each row's last ``min(seq_len, window - 1)`` keys), extend otherwise
(the cached prefix through ``kv_indices``, the new tokens as ``k_extend``,
the window as ``sliding_window_size = window - 1``, SGLang's convention).
A window of 1 is 0 there, which SGLang takes as no window.

Claims what that backend serves through these kernels (ALiBi is not among
them), bf16 on the CPU too (the harness makes the interpreter's bf16 that of
compiled Triton). Without ``sglang`` or ``triton`` it claims no device.
"""

from __future__ import annotations

import functools
from types import ModuleType, SimpleNamespace

import torch

from harness.core.contract import Capabilities, LayerCache
from harness.core.engine_metadata import sglang_metadata
from harness.core.paged_base import PreparedStep
from harness.core.triton_mode import triton_interprets
from reference_backends.engine_backend import EngineKernelBackend
from reference_backends.engine_modules import load_engine_files, stand_in

KERNELS = "sglang.kernels.ops.attention"
KERNEL_FILES = ("score_mod", "decode_attention", "extend_attention")
MAX_KV_SPLITS = 8
"""SGLang's default ``--triton-attention-num-kv-splits``."""


def _platform_probes() -> ModuleType:
    """``sglang.srt.utils`` as far as the kernel files use it."""
    cuda = torch.cuda.is_available() and not triton_interprets()  # reads; never chooses

    def cores(device: int = 0) -> int:
        return torch.cuda.get_device_properties(device).multi_processor_count if cuda else 1

    return stand_in(
        "sglang.srt.utils",
        is_hip=lambda: False,
        is_cuda=lambda: cuda,
        is_gfx95_supported=lambda: False,
        is_gfx1250_supported=lambda: False,
        get_device_core_count=cores,
    )


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """``[pages, page_size, KV, D]`` as SGLang's token buffer ``[slots, KV, D]``.

    A view when the pages are contiguous rows, else a copy (read only: the new
    K/V are already written through the bound tensors).
    """
    return tensor.reshape(-1, *tensor.shape[2:])


class SglangTritonBackend(EngineKernelBackend):
    """SGLang's Triton attention kernels behind the harness's contract."""

    adapter, engine = "sglang-triton", "sglang"

    @staticmethod
    @functools.cache
    def load_kernels() -> SimpleNamespace:
        """SGLang's decode and extend entry points, loaded once per process."""
        names = ["sglang.srt.environ", *(f"{KERNELS}.{n}" for n in KERNEL_FILES)]
        loaded = load_engine_files("sglang", names, {"sglang.srt.utils": _platform_probes()})
        return SimpleNamespace(
            decode=loaded[f"{KERNELS}.decode_attention"].decode_attention_fwd,
            extend=loaded[f"{KERNELS}.extend_attention"].extend_attention_fwd,
        )

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(
            devices=cls.engine_devices(),
            interpreted_devices=("cpu",),
            sliding_window=True,
            soft_cap=True,
            sinks=True,
            out_buffer=True,
        )

    def attend(
        self,
        query: torch.Tensor,
        cache: LayerCache,
        step: PreparedStep,
        *,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
    ) -> torch.Tensor:
        assert key is not None
        assert value is not None
        engine = self.kernels_for(query)
        view = sglang_metadata(step)
        query = query.contiguous()  # the kernels take a row stride and a head stride only
        out = torch.empty_like(query)
        k_buffer, v_buffer = _flat(cache.key_nhd), _flat(cache.value_nhd)
        cap = self.variant.logits_soft_cap or 0.0
        sinks = self.per_head("sinks", query.device)
        window = (self.variant.sliding_window or 0) - 1  # SGLang's size; <= 0: no window
        lengths = step.checked.query_lens
        if all(q == 1 for q in lengths):  # decode: a one-token query sees every key either way
            rows = len(lengths)
            indptr, indices = (
                view.last_keys(window) if window > 0 else (view.kv_indptr, view.kv_indices)
            )
            splits = torch.clamp(indptr[1:] - indptr[:-1], 1, MAX_KV_SPLITS).to(torch.int32)
            logits = torch.empty(
                rows, self.num_heads, MAX_KV_SPLITS, self.head_dim,
                dtype=torch.float32, device=query.device,
            )  # fmt: skip
            lse = torch.empty(
                rows, self.num_heads, MAX_KV_SPLITS, dtype=torch.float32, device=query.device
            )
            engine.decode(
                query, k_buffer, v_buffer, out, indptr, indices,
                logits, lse, splits, MAX_KV_SPLITS, self.scale, 1.0, 1.0,
                logit_cap=cap, sinks=sinks,
            )  # fmt: skip
            return out
        engine.extend(
            query, key.contiguous(), value.contiguous(), out,
            k_buffer, v_buffer, view.qo_indptr, view.prefix_kv_indptr,
            view.prefix_kv_indices, None, step.checked.causal, None,
            max(view.max_len_extend, 1), 1.0, 1.0,
            sm_scale=self.scale, logit_cap=cap, sinks=sinks,
            sliding_window_size=window if window > 0 else -1,
        )  # fmt: skip
        return out
