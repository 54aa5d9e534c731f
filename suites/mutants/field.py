"""Field mutants: attention-kernel bugs that shipped in real engines, planted on ``reference``.

Each class reproduces the faulty behaviour of one reported bug (vLLM, SGLang,
FlashInfer, FlashAttention, xFormers; the thread is in its docstring's
``Source:`` line) only in the regime where that bug showed (its ``Regime:``
line). Outside it the class is the reference bit for bit; inside it the
output is far off (orders of magnitude past the bound, or NaN) in fp32 too.
Every class claims what ``reference`` claims, so the suite may draw the
regime. Each overrides one or two small methods of ``ReferenceBackend``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import torch

from harness.core.contract import LayerCache
from harness.core.paged_base import PreparedStep
from reference_backends.reference import ReferenceBackend
from suites.mutants.kernel_steps import (
    key_count,
    nan_rows,
    read_as_contiguous,
    uniform_query_len,
    window_excluded,
)

SPLIT_KEYS = 256  # keys per split-KV partition
FINITE_MAX_SENTINEL = -5e4  # FlashInfer FA2's "-math::inf": a finite value
FINITE_WINDOW_MASK = -1e4  # the score a Triton kernel gives an out-of-window key
LOAD_WIDTH = 64  # head-dim width of a vectorised load whose tail is not masked
OUTPUT_CHUNK = 128  # head-dim columns of one output tile
PAGE_TOKENS_CAP = 128  # tokens per page a kernel's page walk covers
PADDED_Q_STRIDE = 8  # per-request query stride a grouped-token decode kernel pads to
TOKEN_BUDGET = 8192  # query tokens a fixed-size scratch buffer holds


# -- split-KV merges and their empty splits -----------------------------------------


class SplitKvEmptySplitNaN(ReferenceBackend):
    """Split-KV: a split with no visible key computes ``exp(-inf - (-inf))`` and poisons the row.

    Source: flashinfer-ai/flashinfer#4401 (finite-sentinel fix: clamp every exponent
    difference, since an empty split-KV chunk merged in state_t::merge/normalize gives NaN).
    Regime: a context past one 256-key split where some split holds no key the row
    may see: causal prefill and extend rows whose later splits lie in their future, or
    a sliding window that leaves a whole split out. Those rows' outputs are NaN.
    """

    def softmax(self, logits: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        probs = ReferenceBackend.softmax(logits)
        keys = logits[..., : key_count(logits, self.variant.sinks is not None)]
        if keys.shape[-1] <= SPLIT_KEYS:
            return probs  # one split: nothing to merge
        empty = [part.amax(dim=-1) == float("-inf") for part in keys.split(SPLIT_KEYS, dim=-1)]
        return nan_rows(probs, torch.stack(empty).any(dim=0))


class MergeStartsEmptyNaN(ReferenceBackend):
    """Split-KV merge seeded with the empty state: merging it with an empty first split is NaN.

    Source: flashinfer-ai/flashinfer#4051 (merge_state of two empty states, lse = -inf,
    returns NaN for both the output and the lse instead of the empty state).
    Regime: a context past one 256-key split whose first split holds no visible key:
    a sliding window whose start lies past key 255 (a fully masked first tile). Those
    rows' outputs are NaN; empty splits after a non-empty one merge correctly.
    """

    def softmax(self, logits: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        probs = ReferenceBackend.softmax(logits)
        keys = logits[..., : key_count(logits, self.variant.sinks is not None)]
        if keys.shape[-1] <= SPLIT_KEYS:
            return probs  # one split: nothing to merge
        return nan_rows(probs, keys[..., :SPLIT_KEYS].amax(dim=-1) == float("-inf"))


class SplitCountEmptyTail(ReferenceBackend):
    """Split count ``L // 256 + 1``: a context on a split boundary gets a last, empty split.

    Source: Dao-AILab/flash-attention#2336 (split-KV kernel body needed an
    ``n_block_max > n_block_min`` guard for empty-split correctness); the empty
    split's ``-inf - (-inf)`` is NaN as in flashinfer-ai/flashinfer#4401.
    Regime: a context that is an exact multiple of 256 keys (256, 512, 4096...): the
    extra split has no keys and every row of that sequence is NaN.
    """

    def softmax(self, logits: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        probs = ReferenceBackend.softmax(logits)
        length = key_count(logits, self.variant.sinks is not None)
        if length < SPLIT_KEYS or length % SPLIT_KEYS:
            return probs
        return torch.full_like(probs, float("nan"))


# -- rows whose logits all lie far below zero ---------------------------------------


class FiniteSentinelMax(ReferenceBackend):
    """Online-softmax running max starts at a finite -5e4: rows whose logits are all below it are 0.

    Source: flashinfer-ai/flashinfer#4267 (FA2 kernels initialise m to -math::inf, a finite
    5e4; a row whose every logit is below -5e4 silently returns a zero vector).
    Regime: a row whose largest logit lies below -5e4 by more than ~100 (every
    ``exp(logit - m)`` underflows): its output is zero. Shallower rows are exact.
    """

    def softmax(self, logits: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        peak = logits.amax(dim=-1, keepdim=True).clamp(min=FINITE_MAX_SENTINEL)
        weights = (logits - peak).exp()
        total = weights.sum(dim=-1, keepdim=True)
        return torch.where(total > 0, weights / total, torch.zeros_like(weights))


class WindowMaskFinite(ReferenceBackend):
    """Out-of-window keys get a score of -1e4 instead of -inf: they win rows whose logits are lower.

    Source: vllm-project/vllm#49588 (quotes kernel_paged_attention_2d masking out-of-window
    scores with ``tl.where(..., S, -10000)``; vllm-project/vllm#4405 chose a finite window
    mask for the prefix-prefill kernel so fully masked rows avoid NaN).
    Regime: a sliding window shorter than the context together with rows whose visible
    logits all lie below -1e4: the masked keys then carry almost all the weight.
    """

    def visible(
        self, query_len: int, length: int, causal: bool, device: torch.device
    ) -> torch.Tensor:
        if self.variant.sliding_window is None:
            return super().visible(query_len, length, causal, device)
        if causal:
            return self.causal_mask(query_len, length, device)
        return torch.ones(query_len, length, dtype=torch.bool, device=device)

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        logits = super().logits(q, k)
        window = self.variant.sliding_window
        if window is None:
            return logits
        outside = window_excluded(q.shape[1], k.shape[1], window, q.device)
        return logits.masked_fill(outside, FINITE_WINDOW_MASK)


# -- variants applied in one path only ------------------------------------------------


class SoftCapAfterMaskInDecode(ReferenceBackend):
    """Decode applies the soft-cap after masking: a masked key's -inf becomes -cap, visible.

    Source: flashinfer-ai/flashinfer#350 (hotfix: the decode kernel with logits cap must
    apply the soft cap before masking).
    Regime: decode rows (q = 1) with a soft-cap and masked keys (a sliding window shorter
    than the context); noticeable for caps the logits reach (1, 5, 10). Prefill and
    extend rows mask after capping, correctly.
    """

    def _capped_decode(self, query_len: int) -> bool:
        v = self.variant
        return query_len == 1 and v.logits_soft_cap is not None and v.sliding_window is not None

    def visible(
        self, query_len: int, length: int, causal: bool, device: torch.device
    ) -> torch.Tensor:
        if not self._capped_decode(query_len):
            return super().visible(query_len, length, causal, device)
        return torch.ones(query_len, length, dtype=torch.bool, device=device)  # masked in logits

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        if not self._capped_decode(q.shape[1]):
            return super().logits(q, k)
        cap, window = self.variant.logits_soft_cap, self.variant.sliding_window
        assert cap is not None
        assert window is not None
        raw = (q @ k.transpose(1, 2)) * self.scale
        raw = raw.masked_fill(window_excluded(1, k.shape[1], window, q.device), float("-inf"))
        logits = cap * torch.tanh(raw / cap)  # bug: -inf -> -cap
        if self.variant.alibi_slopes is not None:
            logits = logits + self.alibi_bias(q.shape[1], k.shape[1], q.device)
        return logits


class SoftCapIgnored(ReferenceBackend):
    """Accepts ``logits_soft_cap`` and never applies it (the kernel was planned without it).

    Source: sgl-project/sglang#33915 (FlashInfer backend passes logit_cap to the deprecated
    forward() instead of plan(), so gemma-2 and grok-1 run uncapped).
    Regime: a soft-cap with logits large enough for ``cap * tanh(x / cap)`` to differ
    from ``x`` (caps up to ~50 with logits of a few units or more).
    """

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        if self.variant.logits_soft_cap is None:
            return super().logits(q, k)
        given, self.variant = self.variant, replace(self.variant, logits_soft_cap=None)
        try:
            return super().logits(q, k)
        finally:
            self.variant = given


class SinksIgnoredInPrefill(ReferenceBackend):
    """The prefill path accepts ``sinks`` and drops them; decode applies them.

    Source: vllm-project/vllm#52148 (FlashInfer SM12x: the generic FA2 prefill path accepts
    a sinks argument but does not apply it, while XQA decode does).
    Regime: attention sinks on rows with more than one query (prefill, extend); decode
    rows are exact.
    """

    def with_sinks(self, logits: torch.Tensor) -> torch.Tensor:
        if self.variant.sinks is None or logits.shape[1] == 1:
            return super().with_sinks(logits)
        none = torch.full_like(logits[..., :1], float("-inf"))  # a sink that weighs nothing
        return torch.cat([logits, none], dim=-1)


class AlibiDroppedInDecode(ReferenceBackend):
    """ALiBi bias applied in prefill, dropped from the decode path.

    Source: HabanaAI/vllm-fork#437 (vLLM's Gaudi fork: porting flat paged attention in
    #169 left ALiBi biases out of forward_decode; MPT-7B decoded garbage).
    Regime: ALiBi slopes on decode rows (q = 1) with more than one key; prefill and
    extend rows are exact.
    """

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        if q.shape[1] != 1 or self.variant.alibi_slopes is None:
            return super().logits(q, k)
        given, self.variant = self.variant, replace(self.variant, alibi_slopes=None)
        try:
            return super().logits(q, k)
        finally:
            self.variant = given


class WindowIgnoredOnCachedPrefix(ReferenceBackend):
    """The prefix-prefill kernel applies the sliding window to new keys only, not cached ones.

    Source: vllm-project/vllm#4405 ([kernel] fix sliding window in prefix prefill Triton
    kernel: the loop over the cached context had no window mask).
    Regime: a sliding window on extend rows (1 < q < L) whose window starts inside the
    cached prefix (more than ``window`` cached keys): out-of-window cached keys are read.
    """

    def visible(
        self, query_len: int, length: int, causal: bool, device: torch.device
    ) -> torch.Tensor:
        visible = super().visible(query_len, length, causal, device)
        if self.variant.sliding_window is None or not 1 < query_len < length:
            return visible
        cached = torch.arange(length, device=device)[None, :] < length - query_len
        return visible | cached  # every cached key precedes every query: causal holds


# -- FP8 KV scales ---------------------------------------------------------------------


class Fp8ScalesIgnoredInRaggedPrefill(ReferenceBackend):
    """A fresh prefill (no cached tokens) reads the FP8 K/V without ``k_scale``/``v_scale``.

    Source: flashinfer-ai/flashinfer#4979 (BatchPrefillWithRaggedKVCacheWrapper ignores
    k_scale / v_scale for an fp8 KV cache; the paged wrapper applies them).
    Regime: an FP8 cache with a scale other than 1 on rows with no cached tokens
    (q = L, a ragged prefill); rows with cached context are exact.
    """

    def sequences(
        self, cache: LayerCache, step: PreparedStep
    ) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
        v = self.variant
        for tokens, key, value in super().sequences(cache, step):
            if v.quantized and tokens.stop - tokens.start == key.shape[1]:
                key, value = key / v.k_scale, value / v.v_scale  # the stored values, unscaled
            yield tokens, key, value


class Fp8ScalesFallBackToOne(ReferenceBackend):
    """FP8 KV scales never reach the kernel: every read dequantizes with 1.0.

    Source: sgl-project/sglang#20705 (k_scale_float / v_scale_float never set when scales
    load from --quantization-param-path: silently ignored, falling back to 1.0).
    Regime: an FP8 cache with ``k_scale`` or ``v_scale`` other than 1, every row.
    """

    def sequences(
        self, cache: LayerCache, step: PreparedStep
    ) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
        v = self.variant
        for tokens, key, value in super().sequences(cache, step):
            if v.quantized:
                key, value = key / v.k_scale, value / v.v_scale
            yield tokens, key, value


# -- head geometry ---------------------------------------------------------------------


class GqaGroupPaddedToPow2(ReferenceBackend):
    """GQA heads packed in power-of-two groups: head h reads KV head ``h // next_pow2(group)``.

    Source: flashinfer-ai/flashinfer#2684 (decode dispatch handled only GQA groups
    1, 2, 3, 4, 8; Qwen3.5-27B's group 6 failed until 5, 6, 7 were added; see also #996).
    Modelled as the silent form: the kernel's head packing assumes a power-of-two group.
    Regime: a GQA group that is not a power of two (3, 5, 6, 7, 9, 12) with two or more
    KV heads; the query heads past each group's end read the wrong KV head.
    """

    def expand_kv_heads(self, kv: torch.Tensor) -> torch.Tensor:
        group = self.num_heads // self.num_kv_heads
        packed = 1 << (group - 1).bit_length()
        if packed == group:
            return super().expand_kv_heads(kv)
        heads = torch.arange(self.num_heads, device=kv.device) // packed
        return kv.index_select(0, heads.clamp(max=self.num_kv_heads - 1))


class HeadDimTailUnmasked(ReferenceBackend):
    """Head dims past the last full 64-wide load are dropped (the tail load is never issued).

    Source: sgl-project/sglang#1281 (Triton extend/decode attention assumed a 2^n head dim;
    head_dim 96 needed the block padded to the next power of two and the tail masked).
    Regime: a head dim above 64 that is not a multiple of 64 (80, 96, 112): dims past
    64 read as zero in the logits and the output.
    """

    def expand_kv_heads(self, kv: torch.Tensor) -> torch.Tensor:
        expanded = super().expand_kv_heads(kv)
        dim = expanded.shape[-1]
        if dim > LOAD_WIDTH and dim % LOAD_WIDTH:
            expanded = expanded.clone()
            expanded[..., dim // LOAD_WIDTH * LOAD_WIDTH :] = 0
        return expanded


class OutputChunkAtColumnZero(ReferenceBackend):
    """The epilogue writes every 128-column output chunk at column 0, not at its own offset.

    Source: facebookresearch/xformers#379 (memory-efficient attention forward: the output
    tile iterator lacked ``+ col``; "this was a bug before, and the code wouldn't work
    properly for K > 128").
    Regime: a head dim above 128 (192, 256): the first columns hold the last chunk's
    values and the columns past 128 stay zero.
    """

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = super().attend_with_lse(query, cache, step)
        dim = out.shape[-1]
        if dim <= OUTPUT_CHUNK:
            return out, lse
        written = torch.zeros_like(out)
        for start in range(0, dim, OUTPUT_CHUNK):
            width = min(OUTPUT_CHUNK, dim - start)
            written[..., :width] = out[..., start : start + width]
        return written, lse


class PageTokensPast128Dropped(ReferenceBackend):
    """The page walk covers 128 tokens per page: tokens at in-page offset 128 or more are skipped.

    Source: flashinfer-ai/flashinfer#4347 (Blackwell TRTLLM-Gen paged attention kernel is
    incorrect with page sizes > 128; P0).
    Regime: a page size above 128 (256) with a sequence holding a page's 129th token;
    those keys never enter the softmax.
    """

    def visible(
        self, query_len: int, length: int, causal: bool, device: torch.device
    ) -> torch.Tensor:
        visible = super().visible(query_len, length, causal, device)
        page_size = self._require_bound().page_size
        if page_size <= PAGE_TOKENS_CAP:
            return visible
        offsets = torch.arange(length, device=device) % page_size
        return visible & (offsets < PAGE_TOKENS_CAP)[None, :]


# -- strides ---------------------------------------------------------------------------


class CombinedKvBlockStrideAssumed(ReferenceBackend):
    """Reads each K/V half of a combined cache with a contiguous page stride (half the real one).

    Source: vllm-project/vllm-xpu-kernels#258 (fix the fmha bug for interleaved_kv_cache:
    K and V share one buffer, so the page stride is twice the contiguous one).
    Regime: caches that are the two halves of one ``[pages, 2, page, KV, D]`` tensor:
    page p of K is read from K or V of page p / 2, V from page (p + 1) / 2.
    """

    def sequences(
        self, cache: LayerCache, step: PreparedStep
    ) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
        if not cache.key.is_contiguous() or not cache.value.is_contiguous():
            cache = LayerCache(
                key=read_as_contiguous(cache.key),
                value=read_as_contiguous(cache.value),
                page_offset=cache.page_offset,
                total_pages=cache.total_pages,
                layout=cache.layout,
            )
        yield from super().sequences(cache, step)


class NewKvStridesAssumed(ReferenceBackend):
    """Stores the step's new K/V reading the given views as if they were dense.

    Source: sgl-project/sgl-kernel-xpu#471 (flash_attn_varlen_func did not support
    non-contiguous q, k and v sliced from a fused projection; the fix honours row and
    head strides).
    Regime: new keys and values handed over as strided views (a fused QKV buffer);
    the cache gets the buffer's neighbouring elements and attention reads them.
    """

    def _write_step(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        layer_idx: int,
        out: torch.Tensor | None = None,
    ) -> tuple[LayerCache, PreparedStep]:
        return super()._write_step(
            query, read_as_contiguous(key), read_as_contiguous(value), layer_idx, out
        )


# -- speculative decoding and token budgets ----------------------------------------------


class SpecVerifyNoCausal(ReferenceBackend):
    """The uniform ``q_len_per_req`` decode path takes the causal extent from the request's end.

    Source: flashinfer-ai/flashinfer#4382 (trtllm-gen multi-token decode: derive the causal
    KV extent from the CTA's last valid query token; requests after the first got
    corrupted attention at batch > 1).
    Regime: a speculative-decoding step (two or more requests, every one with the same
    query length 2..8): the rows of every request after the first see all draft keys,
    later ones included.
    """

    _no_causal: bool = False

    def sequences(
        self, cache: LayerCache, step: PreparedStep
    ) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
        uniform = uniform_query_len(step) is not None
        try:
            for index, item in enumerate(super().sequences(cache, step)):
                self._no_causal = uniform and index > 0
                yield item
        finally:
            self._no_causal = False

    def visible(
        self, query_len: int, length: int, causal: bool, device: torch.device
    ) -> torch.Tensor:
        return super().visible(query_len, length, causal and not self._no_causal, device)


class SpecVerifyPaddedQStride(ReferenceBackend):
    """The uniform ``q_len_per_req`` path reads packed queries with a padded per-request stride.

    Source: flashinfer-ai/flashinfer#4059 (uniform multi-token trtllm-gen decode mis-indexes
    packed Q/O without cum_seq_lens_q when q_len_per_req does not divide the token group:
    a padded stride of tileSizeQ / numHeadsQPerKv; fixes #3929).
    Regime: a speculative-decoding step (two or more requests, every one with the same
    query length 3, 5, 6 or 7): request r reads query rows from ``r * 8``, so every
    request after the first attends with another request's (or no) queries.
    """

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q_len = uniform_query_len(step)
        if q_len is None or PADDED_Q_STRIDE % q_len == 0:
            return super().attend_with_lse(query, cache, step)
        starts = [
            start
            for start, rows in zip(step.checked.query_start, step.sequence_rows, strict=False)
            if rows is not None
        ]
        misread = query.clone()
        for request, start in enumerate(starts[1:], 1):
            for j in range(q_len):
                source = starts[0] + request * PADDED_Q_STRIDE + j
                misread[start + j] = query[source] if source < query.shape[0] else 0
        return super().attend_with_lse(misread, cache, step)


class SpecVerifyRowsAsDecode(ReferenceBackend):
    """A speculative verify block reaches the decode kernel unflattened: one query row per request.

    Source: vllm-project/vllm#51065 (TritonMLA: ``query_len * num_reqs`` query rows against
    ``num_reqs`` rows of block_table / seq_lens; decode_attention_fwd launches one program
    per query row and indexes ``B_Seqlen + cur_batch``; fixes #51848).
    Regime: a speculative-decoding step (two or more requests, every one with the same
    query length 2..8): flat query row i attends as a decode query over request i's whole
    context, and rows past the request count read nothing (modelled as zeros).
    """

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if uniform_query_len(step) is None:
            return super().attend_with_lse(query, cache, step)
        out = torch.zeros_like(query)
        lse = torch.full(query.shape[:2], float("-inf"), device=query.device)
        first = step.checked.query_start[0]
        for request, (_, key, value) in enumerate(self.sequences(cache, step)):
            row = first + request  # the decode kernel's program id, not the request's rows
            out[row], lse[row] = self.decode_row(query[row], key, value)
        return out, lse

    def decode_row(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One query ``[H, D]`` as the last position of a ``[KV, L, D]`` context."""
        q = query.float()[:, None]  # [H, 1, D]
        k, v = self.expand_kv_heads(key.float()), self.expand_kv_heads(value.float())
        logits = self.logits(q, k)
        visible = self.visible(1, k.shape[1], True, q.device)
        logits = self.with_sinks(logits.masked_fill(~visible, float("-inf")))
        probs = self.softmax(logits)
        if self.variant.sinks is not None:
            probs = probs[..., :-1]
        return (probs @ v)[:, 0].to(query.dtype), torch.logsumexp(logits, dim=-1)[:, 0]


class ScratchWrapsPastTokenBudget(ReferenceBackend):
    """A per-token scratch buffer sized for 8192 tokens wraps: token t lands in slot t % 8192.

    Source: vllm-project/vllm#48428 (the fixed FlashInfer prefill workspace overflows for
    wide-head models at the 8192-token prefill chunk; the fix sizes it from
    max_num_batched_tokens).
    Regime: a step with more than 8192 query tokens: tokens sharing a slot all read the
    output of the last one written there (another token, often another sequence).
    """

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = super().attend_with_lse(query, cache, step)
        tokens = out.shape[0]
        if tokens <= TOKEN_BUDGET:
            return out, lse
        slot = torch.arange(tokens, device=out.device) % TOKEN_BUDGET
        last_writer = slot + TOKEN_BUDGET * ((tokens - 1 - slot) // TOKEN_BUDGET)
        return out[last_writer], lse[last_writer]


FIELD_MUTANTS: tuple[type, ...] = (
    SplitKvEmptySplitNaN,
    MergeStartsEmptyNaN,
    SplitCountEmptyTail,
    FiniteSentinelMax,
    WindowMaskFinite,
    SoftCapAfterMaskInDecode,
    SoftCapIgnored,
    SinksIgnoredInPrefill,
    AlibiDroppedInDecode,
    WindowIgnoredOnCachedPrefix,
    Fp8ScalesIgnoredInRaggedPrefill,
    Fp8ScalesFallBackToOne,
    GqaGroupPaddedToPow2,
    HeadDimTailUnmasked,
    OutputChunkAtColumnZero,
    PageTokensPast128Dropped,
    CombinedKvBlockStrideAssumed,
    NewKvStridesAssumed,
    SpecVerifyNoCausal,
    SpecVerifyPaddedQStride,
    SpecVerifyRowsAsDecode,
    ScratchWrapsPastTokenBudget,
)
