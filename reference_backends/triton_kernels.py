"""Triton kernels of the ``triton`` backend: split-KV decode, its merge, and tiled prefill.

Import this module only through ``reference_backends.triton_backend``:
``@triton.jit`` reads ``TRITON_INTERPRET`` when it runs (here, at import),
and so does triton's own standard library when triton is first imported;
the backend sets it for CPU use before either happens.

Every kernel reads K/V through the block table, token by token
(``page = table[pos // page_size]``, ``row = pos % page_size``), with the
cache's own strides, so any page size, a strided half of a combined K/V
tensor, and a per-rank pool (pages already made local by the host) all work
without a copy. Keys past a sequence's end are masked *at the load*, never
multiplied by a zero weight, because the cache there holds garbage (NaN in
the conformance suite).

Numerics follow FlashAttention: inputs in their dtype, logits and the
running sum in fp32 (``exp2`` of log2e-scaled logits), probabilities rounded
to the value dtype before ``P @ V``. fp32 inputs use IEEE ``tl.dot`` (not
TF32). Under Triton's interpreter bf16 computes as compiled Triton does
(``harness.core.triton_bf16``), so the kernels are the same on both.

Variants: a sliding window starts each key loop at the window's first key
and masks per query (``window`` is 2**30 when there is none); a soft-cap
(``SOFT_CAP``) maps each fp32 logit through ``cap * tanh(x / cap)`` before
the online softmax, and ALiBi (``HAS_ALIBI``) then adds
``slope_h * (key_pos - query_pos)`` (log2 units, like the logits); sinks
(``HAS_SINKS``) join the softmax's denominator where the output is
normalised: in the decode kernel without splits, in the split merge, and in
the prefill kernel.
"""

# No ``from __future__ import annotations``: triton reads the ``tl.constexpr`` annotations.
import triton
import triton.language as tl


@triton.jit
def _load_token_rows(
    ptr, page, in_page, head, stride_p, stride_s, stride_h, stride_d, offs_d, mask
):
    """``[BLOCK_N, BLOCK_D]`` rows of one cache tensor and head; 0 where masked (never read)."""
    rows = (page * stride_p + in_page * stride_s + head * stride_h)[:, None]
    return tl.load(ptr + rows + offs_d[None, :] * stride_d, mask=mask, other=0.0)


@triton.jit
def _load_kv_tile(
    k_ptr, v_ptr, table, pos, valid, page_size, kv_head, offs_d, mask_d,
    stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs, stride_vh, stride_vd,
):  # fmt: skip
    """The key and value rows of positions ``pos`` of one KV head, each position's page
    found through the row's block table (``table``); 0 where masked (never read)."""
    page = tl.load(table + pos // page_size, mask=valid, other=0).to(tl.int64)
    in_page = (pos % page_size).to(tl.int64)
    mask = valid[:, None] & mask_d[None, :]
    k = _load_token_rows(
        k_ptr, page, in_page, kv_head, stride_kp, stride_ks, stride_kh, stride_kd, offs_d, mask
    )
    v = _load_token_rows(
        v_ptr, page, in_page, kv_head, stride_vp, stride_vs, stride_vh, stride_vd, offs_d, mask
    )
    return k, v


@triton.jit
def _soft_capped(dots, cap_scale, cap_log2):
    """``cap * tanh(scale * dots / cap)`` in log2 units; ``tanh`` from one ``exp`` (stable)."""
    y = dots * cap_scale
    t = tl.exp(-2.0 * tl.abs(y))
    tanh = (1.0 - t) / (1.0 + t)
    return tl.where(y < 0, -tanh, tanh) * cap_log2


@triton.jit
def _sink_normalised(acc, m_i, l_i, sinks_ptr, head, head_mask, HAS_SINKS: tl.constexpr):
    """``acc / (l + 2^(sink - m))``: the running sum plus each head's sink (log2 units)."""
    total = l_i
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head, mask=head_mask, other=0.0) * 1.4426950408889634
        seen = m_i != float("-inf")
        total = l_i + tl.where(seen, tl.exp2(sink - tl.where(seen, m_i, 0.0)), 0.0)
    return acc / tl.where(total > 0.0, total, 1.0)[:, None]


@triton.jit
def _attend_tile(
    q,
    k,
    v,
    m_i,
    l_i,
    acc,
    keep,
    scale_log2,
    cap_scale,
    cap_log2,
    bias,
    SOFT_CAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One key tile of the online softmax: the running max, sum and weighted values after it.

    A query row that sees no key of the tile keeps its state, its running max
    ``-inf`` until it has seen a key: a finite stand-in kept across tiles
    would outweigh logits far below it and zero the row. Only the exponents
    subtract a finite max (0 while none is seen), so no ``-inf - -inf`` is
    ever computed.
    """
    dots = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if SOFT_CAP:  # noqa: SIM108 (a static branch on a constexpr, as every flag here)
        logits = _soft_capped(dots, cap_scale, cap_log2)
    else:
        logits = dots * scale_log2
    if HAS_ALIBI:  # after the cap, as the contract orders them
        logits = logits + bias
    logits = tl.where(keep, logits, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(logits, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(logits - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    p = p.to(v.dtype)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    block_table_ptr,
    seq_lens_ptr,
    item_rows_ptr,
    item_tokens_ptr,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_bt,
    scale_log2,
    page_size,
    window,
    cap_scale,
    cap_log2,
    sinks_ptr,
    alibi_ptr,
    split_len,
    num_splits,
    num_heads,
    SOFT_CAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One decode query, one KV head (all its query heads), one key range.

    The GQA group's query heads are the rows of one ``tl.dot``, so each K/V
    tile is loaded once for the whole group. With ``SPLIT`` the normalised
    partial output and its log2-sum-exp go to scratch for
    ``merge_splits_kernel``; without, the output is written directly.
    """
    item = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(item_rows_ptr + item)
    token = tl.load(item_tokens_ptr + item).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + row)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    first_key = tl.maximum(start, seq_len - window)  # the window's first key (the query: L - 1)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    head = kv_head * GROUP + offs_h
    mask_h = offs_h < GROUP
    mask_d = offs_d < HEAD_DIM
    q = tl.load(
        q_ptr + token * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=mask_h[:, None] & mask_d[None, :],
        other=0.0,
    )
    slopes = tl.load(alibi_ptr + head, mask=mask_h & HAS_ALIBI, other=0.0) * 1.4426950408889634

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    table = block_table_ptr + row.to(tl.int64) * stride_bt
    for n0 in range(first_key, end, BLOCK_N):
        pos = n0 + offs_n
        valid = pos < end
        k, v = _load_kv_tile(
            k_ptr, v_ptr, table, pos, valid, page_size, kv_head, offs_d, mask_d,
            stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs, stride_vh, stride_vd,
        )  # fmt: skip
        bias = slopes[:, None] * (pos - (seq_len - 1)).to(tl.float32)[None, :]
        m_i, l_i, acc = _attend_tile(
            q, k, v, m_i, l_i, acc, valid[None, :], scale_log2, cap_scale, cap_log2, bias,
            SOFT_CAP, HAS_ALIBI, PRECISION,
        )  # fmt: skip

    has_keys = l_i > 0.0
    if SPLIT:  # sinks join in the merge
        result = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    else:
        result = _sink_normalised(acc, m_i, l_i, sinks_ptr, head, mask_h, HAS_SINKS)
    if SPLIT:
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        part = (item * num_heads + head).to(tl.int64) * num_splits + split
        tl.store(part_lse_ptr + part, lse, mask=mask_h)
        tl.store(
            part_out_ptr + part[:, None] * HEAD_DIM + offs_d[None, :],
            result,
            mask=mask_h[:, None] & mask_d[None, :],
        )
    else:
        tl.store(
            out_ptr + token * stride_ot + head[:, None] * stride_oh + offs_d[None, :] * stride_od,
            result.to(out_ptr.dtype.element_ty),
            mask=mask_h[:, None] & mask_d[None, :],
        )


@triton.jit
def merge_splits_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    item_tokens_ptr,
    sinks_ptr,
    stride_ot,
    stride_oh,
    stride_od,
    num_splits,
    num_heads,
    HAS_SINKS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Combine one (decode query, head)'s splits by their log-sum-exp weights.

    A split past the sequence's end (or before a window) has lse = -inf and
    weight 0; the last split always holds the query's own key, so the
    weights never all vanish. A sink is one more term of the denominator.
    """
    item = tl.program_id(0)
    head = tl.program_id(1)
    token = tl.load(item_tokens_ptr + item).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < num_splits
    mask_d = offs_d < HEAD_DIM
    part = (item * num_heads + head).to(tl.int64) * num_splits + offs_s
    lse = tl.load(part_lse_ptr + part, mask=mask_s, other=float("-inf"))
    top = tl.max(lse, 0)
    extra = 0.0
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head) * 1.4426950408889634
        top = tl.maximum(top, sink)
        extra = tl.exp2(sink - top)
    weight = tl.exp2(lse - top)
    partial = tl.load(
        part_out_ptr + part[:, None] * HEAD_DIM + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :],
        other=0.0,
    )
    result = tl.sum(partial * weight[:, None], 0) / (tl.sum(weight, 0) + extra)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + offs_d * stride_od,
        result.to(out_ptr.dtype.element_ty),
        mask=mask_d,
    )


@triton.jit
def prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    block_table_ptr,
    seq_lens_ptr,
    query_start_ptr,
    tile_rows_ptr,
    tile_starts_ptr,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_bt,
    scale_log2,
    page_size,
    window,
    cap_scale,
    cap_log2,
    sinks_ptr,
    alibi_ptr,
    SOFT_CAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """``BLOCK_M // GROUP_PAD`` query tokens of one sequence x one KV head's query heads.

    The tile's rows are (token, query head) pairs, so the GQA group shares
    each K/V load here too. Causal is bottom-right: the row's queries are its
    last ``q_len`` positions, and the key loop stops after the tile's last
    query position.
    """
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    row = tl.load(tile_rows_ptr + tile)
    first = tl.load(tile_starts_ptr + tile)  # the tile's first query, counted within the row
    query_start = tl.load(query_start_ptr + row)
    query_len = tl.load(query_start_ptr + row + 1) - query_start
    seq_len = tl.load(seq_lens_ptr + row)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    in_row = first + offs_m // GROUP_PAD  # the query's index within its row
    head = kv_head * GROUP + offs_m % GROUP_PAD
    mask_m = (in_row < query_len) & (offs_m % GROUP_PAD < GROUP)
    mask_d = offs_d < HEAD_DIM
    tokens = (query_start + in_row).to(tl.int64)
    q_pos = seq_len - query_len + in_row
    q_offsets = tokens[:, None] * stride_qt + head[:, None] * stride_qh
    q = tl.load(
        q_ptr + q_offsets + offs_d[None, :] * stride_qd,
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    )
    slopes = tl.load(alibi_ptr + head, mask=mask_m & HAS_ALIBI, other=0.0) * 1.4426950408889634

    last_q_pos = seq_len - query_len + first + BLOCK_M // GROUP_PAD - 1  # the tile's last query
    if CAUSAL:
        key_end = tl.minimum(seq_len, last_q_pos + 1)
    else:  # a non-causal window is two-sided: keys up to last_q_pos + window - 1
        key_end = tl.minimum(seq_len, last_q_pos + window)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = block_table_ptr + row.to(tl.int64) * stride_bt
    key_start = tl.maximum(0, seq_len - query_len + first - window + 1)  # first query's window
    for n0 in range(key_start, key_end, BLOCK_N):
        pos = n0 + offs_n
        valid = pos < key_end
        k, v = _load_kv_tile(
            k_ptr, v_ptr, table, pos, valid, page_size, kv_head, offs_d, mask_d,
            stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs, stride_vh, stride_vd,
        )  # fmt: skip
        keep = valid[None, :] & (pos[None, :] > q_pos[:, None] - window)
        if CAUSAL:
            keep = keep & (pos[None, :] <= q_pos[:, None])
        else:
            keep = keep & (pos[None, :] < q_pos[:, None] + window)
        bias = slopes[:, None] * (pos[None, :] - q_pos[:, None]).to(tl.float32)
        m_i, l_i, acc = _attend_tile(
            q, k, v, m_i, l_i, acc, keep, scale_log2, cap_scale, cap_log2, bias,
            SOFT_CAP, HAS_ALIBI, PRECISION,
        )  # fmt: skip

    result = _sink_normalised(acc, m_i, l_i, sinks_ptr, head, mask_m, HAS_SINKS)
    out_offsets = tokens[:, None] * stride_ot + head[:, None] * stride_oh
    tl.store(
        out_ptr + out_offsets + offs_d[None, :] * stride_od,
        result.to(out_ptr.dtype.element_ty),
        mask=mask_m[:, None] & mask_d[None, :],
    )
