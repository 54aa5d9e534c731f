"""``sglang-triton``: SGLang's Triton decode and extend kernels, from the installed ``sglang``.

The kernels are SGLang's own files (``sglang/kernels/ops/attention/
decode_attention.py`` and ``extend_attention.py``), loaded from the installed
wheel (``pip install --no-deps sglang``: the kernels need only torch and
triton). The one engine-internal module they import that pulls in the server,
``sglang.srt.utils``, is supplied here with the five platform probes the
files call (NVIDIA or the CPU: never ROCm). SGLang's backend runs the decode
kernel when every row decodes one token, the extend kernel otherwise (the
cached prefix read through ``kv_indices``, the step's own tokens passed as
``k_extend``/``v_extend``); so does this adapter, with the tables from the
backend kit's ``sglang_metadata``.

Claims: what SGLang's Triton backend serves through these two kernels, less
what the adapter does not reproduce: the sliding window (SGLang feeds it a
second, trimmed set of tables) and ALiBi (not in these kernels). bf16 is not
claimed, since Triton's interpreter computes it wrongly on the CPU and a
claim cannot differ by device yet. Without ``sglang`` or ``triton`` installed
it claims no device, and a default run leaves it out with a line saying so.
"""

from __future__ import annotations

import functools
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from harness.core.contract import Capabilities, LayerCache
from harness.core.engine_metadata import sglang_metadata
from harness.core.errors import Unsupported
from harness.core.paged_base import PagedBackendBase, PreparedStep
from harness.core.triton_mode import interpret_triton_here, triton_interprets
from reference_backends.engine_modules import EngineMissing, load_engine_files, package_root

KERNELS = "sglang.kernels.ops.attention"
MAX_KV_SPLITS = 8
"""SGLang's default ``--triton-attention-num-kv-splits``."""


def _platform_probes() -> ModuleType:
    """``sglang.srt.utils`` as far as the kernel files use it."""
    cuda = torch.cuda.is_available() and not triton_interprets()  # reads; never chooses

    def cores(device: int = 0) -> int:
        return torch.cuda.get_device_properties(device).multi_processor_count if cuda else 1

    probes = ModuleType("sglang.srt.utils")
    probes.__dict__.update(
        is_hip=lambda: False,
        is_cuda=lambda: cuda,
        is_gfx95_supported=lambda: False,
        is_gfx1250_supported=lambda: False,
        get_device_core_count=cores,
    )
    return probes


@functools.cache
def kernels() -> SimpleNamespace:
    """SGLang's decode and extend entry points, loaded once per process."""
    names = [
        "sglang.srt.environ",
        f"{KERNELS}.score_mod",
        f"{KERNELS}.decode_attention",
        f"{KERNELS}.extend_attention",
    ]
    loaded = load_engine_files("sglang", names, {"sglang.srt.utils": _platform_probes()})
    return SimpleNamespace(
        decode=loaded[f"{KERNELS}.decode_attention"].decode_attention_fwd,
        extend=loaded[f"{KERNELS}.extend_attention"].extend_attention_fwd,
    )


def _installed() -> bool:
    return package_root("sglang") is not None and package_root("triton") is not None


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """``[pages, page_size, KV, D]`` as SGLang's token buffer ``[slots, KV, D]``.

    A view when the pages are contiguous rows, else a copy (read only: the new
    K/V are already written through the bound tensors).
    """
    return tensor.reshape(-1, *tensor.shape[2:])


class SglangTritonBackend(PagedBackendBase):
    """SGLang's Triton attention kernels behind the harness's contract."""

    per_sequence_rows = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not _installed():
            raise Unsupported("sglang-triton needs sglang and triton: pip install --no-deps sglang")

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(
            dtypes=(torch.float32, torch.float16),
            devices=("cpu", "cuda") if _installed() else (),
            interpreted_devices=("cpu",),
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
        if query.device.type == "cpu" and not interpret_triton_here():
            raise Unsupported("sglang-triton runs on the CPU only with TRITON_INTERPRET=1")
        try:  # loaded at the first step, once its device has chosen how triton runs
            engine = kernels()
        except EngineMissing as exc:
            raise Unsupported(f"sglang-triton: {exc}") from exc
        view = sglang_metadata(step)
        query = query.contiguous()  # the kernels take a row stride and a head stride only
        out = torch.empty_like(query)
        k_buffer, v_buffer = _flat(cache.key_nhd), _flat(cache.value_nhd)
        variant = self.variant
        cap = variant.logits_soft_cap or 0.0
        sinks = self.per_head("sinks", query.device)
        lengths = step.checked.query_lens
        decoding = all(q == 1 for q in lengths)  # a one-token query sees every key either way
        if decoding:
            rows = len(lengths)
            splits = torch.clamp(view.seq_lens, 1, MAX_KV_SPLITS).to(torch.int32)
            logits = torch.empty(
                rows, self.num_heads, MAX_KV_SPLITS, self.head_dim,
                dtype=torch.float32, device=query.device,
            )  # fmt: skip
            lse = torch.empty(
                rows, self.num_heads, MAX_KV_SPLITS, dtype=torch.float32, device=query.device
            )
            engine.decode(
                query, k_buffer, v_buffer, out, view.kv_indptr, view.kv_indices,
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
        )  # fmt: skip
        return out
