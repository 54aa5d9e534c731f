"""Evidence that the bound discriminates with attention variants on.

As ``harness.numerics.discrimination`` does for plain attention: at production
sizes (H=32, KV=8, D=128, contexts of 2k) in bf16, fp16 and fp32, each
variant (Mistral's window, Gemma-2's soft-cap, gpt-oss's sinks, ALiBi, FP8
caches) is run by correct computations (a FlashAttention-style kernel
with the variant, emulated; the built-ins that claim it) and by one planted
bug each (the window off by one, the cap applied before scaling, sinks
ignored, ALiBi's sign flipped, FP8 scales inverted), and the worst ratio
error / bound is tabled (above 1 fails).

    python -m harness.numerics.variant_discrimination  # the table (a minute on 2 cores)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from harness.core.dtypes import dtype_name
from harness.core.errors import Unsupported
from harness.core.kv_pages import pages_needed
from harness.core.registry import default_registry
from harness.core.variants import AttentionVariant, alibi_slopes_for
from harness.numerics.discrimination import BLOCK, SPLIT
from harness.numerics.oracle import SequenceKV
from harness.numerics.scenario import (
    Scenario,
    StepInputs,
    backend_for,
    check_outputs,
    make_step_inputs,
    store_step_tokens,
)

Attention = Callable[[StepInputs], torch.Tensor]

HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
WINDOW = 512  # a quarter of the context: the window cuts every decode row


@dataclass(frozen=True)
class Case:
    """One variant and the size it is measured at."""

    name: str
    variant: AttentionVariant
    context_lens: tuple[int, ...] = (2048,) * 2
    query_lens: tuple[int, ...] = (1, 1)


SINKS = tuple(float(s) for s in torch.linspace(4.0, 10.0, HEADS))
"""Sinks that hold 0.4% (4) to 64% (10) of a 2k-key row's weight: a sink is only visible
where its weight exceeds the dtype's rounding, and these span that range."""
CASES = (
    Case("window 512", AttentionVariant(sliding_window=WINDOW)),
    Case("window 512, extend q=64", AttentionVariant(sliding_window=WINDOW), (2048,), (64,)),
    Case("soft-cap 30", AttentionVariant(logits_soft_cap=30.0)),
    Case("sinks", AttentionVariant(sinks=SINKS)),
    Case("alibi", AttentionVariant(alibi_slopes=alibi_slopes_for(HEADS))),
    Case(
        "fp8_e4m3, scales 0.3/0.05",
        AttentionVariant(kv_cache_dtype="fp8_e4m3", k_scale=0.3, v_scale=0.05),
    ),
    Case(
        "window+soft-cap+sinks (gpt-oss-like)",
        AttentionVariant(sliding_window=WINDOW, logits_soft_cap=30.0, sinks=SINKS),
    ),
)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def scenario_for(case: Case, dtype: torch.dtype, seed: int = 0) -> Scenario:
    """Planted keys give a few logits 8 above the rest, so a cap or a bias has work to do."""
    return Scenario(
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        page_size=PAGE,
        num_layers=1,
        total_pages=sum(pages_needed(c, PAGE) for c in case.context_lens) + 1,
        context_lens=case.context_lens,
        query_lens=case.query_lens,
        dtype=dtype,
        planted_keys=3,
        seed=seed,
        variant=case.variant,
    )


def inputs_for(case: Case, dtype: torch.dtype, seed: int = 0) -> StepInputs:
    """The step's inputs with its new K/V already stored, as a correct backend stores them.

    The emulated computations below are not backends; for an FP8 cache the
    oracle reads the cache, so the new tokens must be in it.
    """
    inputs = make_step_inputs(scenario_for(case, dtype, seed))
    store_step_tokens(inputs)
    return inputs


def _rows(inputs: StepInputs) -> list[tuple[slice, SequenceKV]]:
    rows, start = [], 0
    for row, seq in zip(inputs.step.rows, inputs.oracle_sequences(0), strict=True):
        if seq is not None:
            rows.append((slice(start, start + row.query_len), seq))
        start += row.query_len
    return rows


@dataclass(frozen=True)
class Bug:
    """One deliberate change to the variant's arithmetic (all off: a correct computation)."""

    window_shift: int = 0  # sees keys down to position p - W - shift + 1
    cap_before_scale: bool = False
    ignore_sinks: bool = False
    alibi_sign: float = 1.0
    kv_scale_power: float = 1.0  # dequantize with scale ** power (-1: inverted)


def flash_style(inputs: StepInputs, bug: Bug = Bug()) -> torch.Tensor:
    """FlashAttention / flash-decoding arithmetic with the step's variant.

    K/V are the values the kernel reads (FP8 dequantized) rounded to the
    dtype; per 256-key split an online softmax over 64-key blocks with fp32
    logits (soft-capped, ALiBi-biased and window-masked per block),
    probabilities rounded to the dtype before P.V; splits merged by
    log-sum-exp in fp32, the sink joining that merge as one more term with
    no value.
    """
    s = inputs.scenario
    v_ = s.variant
    query, dtype = inputs.queries[0], s.dtype
    out = torch.zeros_like(query)
    group = s.num_heads // s.num_kv_heads
    power = bug.kv_scale_power - 1.0  # the read's extra factor on top of the right one
    for rows, seq in _rows(inputs):
        k_factor = v_.k_scale**power if v_.quantized else 1.0
        v_factor = v_.v_scale**power if v_.quantized else 1.0
        q = query[rows].transpose(0, 1)  # [H, q, D] in the dtype
        k = (seq.key * k_factor).to(dtype).transpose(0, 1).repeat_interleave(group, 0)
        v = (seq.value * v_factor).to(dtype).transpose(0, 1).repeat_interleave(group, 0)
        q_len, length = q.shape[1], k.shape[1]
        position = torch.arange(length - q_len, length)[:, None]
        parts, lses = [], []
        for split in range(0, length, SPLIT):
            acc = torch.zeros(q.shape[0], q_len, q.shape[2])
            m = torch.full((q.shape[0], q_len, 1), float("-inf"))
            total = torch.zeros(q.shape[0], q_len, 1)
            for block in range(split, min(split + SPLIT, length), BLOCK):
                end = min(block + BLOCK, length, split + SPLIT)
                logits = _block_logits(q, k[:, block:end], s, bug)
                keys = torch.arange(block, end)[None, :]
                if v_.alibi_slopes is not None:
                    slopes = torch.tensor(v_.alibi_slopes)[:, None, None] * bug.alibi_sign
                    logits = logits + slopes * (keys - position).float()
                visible = keys <= position
                if v_.sliding_window is not None:
                    visible &= keys > position - v_.sliding_window - bug.window_shift
                logits = logits.masked_fill(~visible, float("-inf"))
                m_new = torch.maximum(m, logits.amax(-1, keepdim=True))
                safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                p = (logits - safe).exp()
                rescale = (m - safe).exp()
                total = total * rescale + p.sum(-1, keepdim=True)
                acc = acc * rescale + p.to(dtype).float() @ v[:, block:end].float()
                m = m_new
            parts.append(acc / total.clamp_min(1e-30))
            lses.append(m + total.log())
        lse = torch.stack(lses)  # [S, H, q, 1]
        if v_.sinks is not None and not bug.ignore_sinks:
            sink = torch.tensor(v_.sinks)[:, None, None].expand(-1, q_len, 1)
            lse = torch.cat([lse, sink[None]])
            parts.append(torch.zeros_like(parts[0]))  # the sink has no value
        weights = (lse - torch.logsumexp(lse, 0)).exp()
        merged = (weights * torch.stack(parts)).sum(0)
        out[rows] = merged.transpose(0, 1).to(dtype)
    return out


def _block_logits(q: torch.Tensor, k: torch.Tensor, s: Scenario, bug: Bug) -> torch.Tensor:
    """fp32 logits of one block, soft-capped (or capped before scaling, the bug)."""
    raw = q.float() @ k.float().mT
    cap = s.variant.logits_soft_cap
    if cap is None:
        return raw * s.softmax_scale
    if bug.cap_before_scale:
        return cap * torch.tanh(raw / cap) * s.softmax_scale
    return cap * torch.tanh(raw * s.softmax_scale / cap)


def _builtin(name: str) -> Attention:
    def run(inputs: StepInputs) -> torch.Tensor:
        backend = backend_for(default_registry().entry(name), inputs.scenario)
        backend.bind_kv_caches(inputs.caches)
        backend.prepare(inputs.step.metadata)
        return backend.forward(*inputs.forward_args(0), 0)

    return run


CORRECT: dict[str, Attention] = {
    "flash-style": flash_style,
    "reference": _builtin("reference"),
    "sdpa": _builtin("sdpa"),
}
BUGS: dict[str, tuple[Attention, Callable[[AttentionVariant], bool]]] = {
    "window off by one": (
        lambda i: flash_style(i, Bug(window_shift=1)),
        lambda v: v.sliding_window is not None,
    ),
    "cap applied before scaling": (
        lambda i: flash_style(i, Bug(cap_before_scale=True)),
        lambda v: v.logits_soft_cap is not None,
    ),
    "sinks ignored": (
        lambda i: flash_style(i, Bug(ignore_sinks=True)),
        lambda v: v.sinks is not None,
    ),
    "alibi sign flipped": (
        lambda i: flash_style(i, Bug(alibi_sign=-1.0)),
        lambda v: v.alibi_slopes is not None,
    ),
    "fp8 scales inverted": (
        lambda i: flash_style(i, Bug(kv_scale_power=-1.0)),
        lambda v: v.quantized,
    ),
}


def worst_ratio(attention: Attention, inputs: StepInputs) -> float | None:
    """Error / bound at the worst (token, head); ``None`` where the computation refuses it."""
    try:
        output = attention(inputs)
    except Unsupported:
        return None
    return check_outputs(inputs, [output])[0].worst_ratio


def table(
    cases: Sequence[Case] = CASES, dtypes: Sequence[torch.dtype] = DTYPES, seed: int = 0
) -> dict[tuple[str, str, str], float]:
    """``(computation, dtype, case) -> worst ratio`` for every correct computation and bug."""
    results = {}
    for case in cases:
        for dtype in dtypes:
            inputs = inputs_for(case, dtype, seed)
            name = dtype_name(dtype)
            runs = dict(CORRECT)
            runs |= {bug: run for bug, (run, applies) in BUGS.items() if applies(case.variant)}
            for label, attention in runs.items():
                ratio = worst_ratio(attention, inputs)
                if ratio is not None:
                    results[(label, name, case.name)] = ratio
    return results


def format_table(results: dict[tuple[str, str, str], float]) -> str:
    """Computations down, (case, dtype) across as rows of a Markdown table."""
    rows = sorted({(z, d) for _, d, z in results}, key=lambda r: (CASE_ORDER.get(r[0], 99), r[1]))
    labels = list(dict.fromkeys(c for c, _, _ in results))
    lines = ["| case | dtype | " + " | ".join(labels) + " |"]
    lines.append("|" + "---|" * (len(labels) + 2))
    for case, dtype in rows:
        cells = [results.get((label, dtype, case)) for label in labels]
        text = ["-" if r is None else f"{r:.3g}" for r in cells]
        lines.append(f"| {case} | {dtype} | " + " | ".join(text) + " |")
    return "\n".join(lines)


CASE_ORDER = {case.name: i for i, case in enumerate(CASES)}


def main() -> None:
    results = table()
    print("worst error / bound (fails above 1; '-' = not applicable or not claimed):")
    print(format_table(results))
    correct = [r for (c, _, _), r in results.items() if c in CORRECT]
    bugs = [r for (c, _, _), r in results.items() if c in BUGS]
    print(f"correct: worst {max(correct):.3g}; bugs: least {min(bugs):.3g}")


if __name__ == "__main__":
    main()
