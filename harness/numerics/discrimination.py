"""Evidence that the dtype bound discriminates: correct computations pass, real bugs fail.

At production sizes (H=32, KV=8, D=128, contexts of 1k-4k) in bf16, fp16
and fp32, each case below is compared with the float64 oracle under
``harness.numerics.tolerance``'s bound, and the worst ratio (error / bound; above 1
fails) is tabled. Correct computations: a FlashAttention-style kernel
emulated on the CPU (fp32 logits, online softmax over 64-key blocks, 256-key
splits merged by log-sum-exp, probabilities rounded to the dtype before
P.V) and the built-in backends. Bugs: an all-zeros output, uniform
attention, GQA head ``h % KV``, scale x1.1, one skipped page, one dropped
key, a causal mask off by one.

    python -m harness.numerics.discrimination            # prints the table (20-30 s on 2 cores)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from harness.core.dtypes import dtype_name
from harness.core.kv_pages import pages_needed
from harness.core.registry import default_registry
from harness.numerics.oracle import SequenceKV
from harness.numerics.scenario import (
    Scenario,
    StepInputs,
    backend_for,
    check_outputs,
    make_step_inputs,
)

Attention = Callable[[StepInputs], torch.Tensor]

BLOCK = 64  # keys per online-softmax block of the emulated kernel
SPLIT = 256  # keys per split-KV partition


@dataclass(frozen=True)
class Size:
    name: str
    context_lens: tuple[int, ...]
    query_lens: tuple[int, ...]


SIZES = (
    Size("decode 4x1024", (1024,) * 4, (1,) * 4),
    Size("decode 4x4096", (4096,) * 4, (1,) * 4),
    Size("extend q=128/2048", (2048,), (128,)),
)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def scenario_for(size: Size, dtype: torch.dtype, seed: int = 0) -> Scenario:
    return Scenario(
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        page_size=16,
        num_layers=1,
        total_pages=sum(pages_needed(c, 16) for c in size.context_lens) + 1,
        context_lens=size.context_lens,
        query_lens=size.query_lens,
        dtype=dtype,
        seed=seed,
    )


def _rows(inputs: StepInputs) -> list[tuple[slice, SequenceKV]]:
    rows, start = [], 0
    for row, seq in zip(inputs.step.rows, inputs.sequences[0], strict=True):
        if seq is not None:
            rows.append((slice(start, start + row.query_len), seq))
        start += row.query_len
    return rows


def variant(
    inputs: StepInputs,
    *,
    scale_factor: float = 1.0,
    head_map: Callable[[int, int, int], int] | None = None,
    keep: Callable[[int, int], torch.Tensor] | None = None,
    mask_shift: int = 0,
    uniform: bool = False,
) -> torch.Tensor:
    """fp32 attention from the dtype's inputs with one deliberate change, rounded to the dtype.

    ``head_map(h, H, KV)`` picks the KV head of query head h; ``keep(L,
    page_size)`` masks the keys a buggy kernel reads; ``mask_shift`` lets
    query position p see keys up to ``p + mask_shift``.
    """
    s = inputs.scenario
    query = inputs.queries[0]
    out = torch.zeros_like(query)
    heads, kv_heads = s.num_heads, s.num_kv_heads
    group = heads // kv_heads
    mapping = [head_map(h, heads, kv_heads) if head_map else h // group for h in range(heads)]
    for rows, seq in _rows(inputs):
        q = query[rows].float().transpose(0, 1)  # [H, q, D]
        k = seq.key.float().transpose(0, 1)[mapping]  # [H, L, D]
        v = seq.value.float().transpose(0, 1)[mapping]
        q_len, length = q.shape[1], k.shape[1]
        logits = (q @ k.mT) * (s.softmax_scale * scale_factor)
        if uniform:
            logits = torch.zeros_like(logits)
        positions = torch.arange(length - q_len, length)[:, None] + mask_shift
        visible = torch.arange(length)[None, :] <= positions
        if keep is not None:
            visible = visible & keep(length, s.page_size)[None, :]
        probs = logits.masked_fill(~visible, float("-inf")).softmax(-1)
        out[rows] = (probs @ v).transpose(0, 1).to(query.dtype)
    return out


def flash_style(inputs: StepInputs, *, partials_in_dtype: bool = False) -> torch.Tensor:
    """A FlashAttention / flash-decoding kernel's arithmetic, emulated.

    Per 256-key split, an online softmax over 64-key blocks: fp32 logits,
    running max and sum in fp32, unnormalised probabilities rounded to the
    dtype before P.V, fp32 accumulation. Splits merge by log-sum-exp in fp32
    (with ``partials_in_dtype`` the partial outputs are first stored in the
    dtype, as paged-attention v2 does). The output is rounded to the dtype.
    """
    s = inputs.scenario
    query, dtype = inputs.queries[0], s.dtype
    out = torch.zeros_like(query)
    group = s.num_heads // s.num_kv_heads
    for rows, seq in _rows(inputs):
        q = query[rows].transpose(0, 1)  # [H, q, D] in the dtype
        k = seq.key.transpose(0, 1).repeat_interleave(group, 0)
        v = seq.value.transpose(0, 1).repeat_interleave(group, 0)
        q_len, length = q.shape[1], k.shape[1]
        position = torch.arange(length - q_len, length)[:, None]
        partial_out, partial_lse = [], []
        for split in range(0, length, SPLIT):
            acc = torch.zeros(q.shape[0], q_len, q.shape[2])
            m = torch.full((q.shape[0], q_len, 1), float("-inf"))
            total = torch.zeros(q.shape[0], q_len, 1)
            for block in range(split, min(split + SPLIT, length), BLOCK):
                end = min(block + BLOCK, length, split + SPLIT)
                logits = (q.float() @ k[:, block:end].float().mT) * s.softmax_scale
                visible = torch.arange(block, end)[None, :] <= position
                logits = logits.masked_fill(~visible, float("-inf"))
                m_new = torch.maximum(m, logits.amax(-1, keepdim=True))
                safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                p = (logits - safe).exp()
                rescale = (m - safe).exp()
                total = total * rescale + p.sum(-1, keepdim=True)
                acc = acc * rescale + p.to(dtype).float() @ v[:, block:end].float()
                m = m_new
            part = acc / total.clamp_min(1e-30)
            if partials_in_dtype:
                part = part.to(dtype).float()
            partial_out.append(part)
            partial_lse.append(m + total.log())
        lse = torch.stack(partial_lse)  # [S, H, q, 1]
        weights = (lse - lse.amax(0)).exp()
        weights = weights / weights.sum(0)
        merged = (weights * torch.stack(partial_out)).sum(0)
        out[rows] = merged.transpose(0, 1).to(dtype)
    return out


def _builtin(name: str) -> Attention:
    def run(inputs: StepInputs) -> torch.Tensor:
        backend = backend_for(default_registry().entry(name), inputs.scenario)
        backend.bind_kv_caches(inputs.caches)
        backend.prepare(inputs.step.metadata)
        return backend.forward(*inputs.forward_args(0), 0)

    return run


def _skip_middle_page(length: int, page_size: int) -> torch.Tensor:
    keep = torch.ones(length, dtype=torch.bool)
    page = (length // page_size) // 2
    keep[page * page_size : (page + 1) * page_size] = False
    return keep


def _drop_last_key(length: int, page_size: int) -> torch.Tensor:
    keep = torch.ones(length, dtype=torch.bool)
    keep[-1] = False
    return keep


CORRECT: dict[str, Attention] = {
    "flash-style": flash_style,
    "flash-style, partials in dtype": lambda i: flash_style(i, partials_in_dtype=True),
    "reference": _builtin("reference"),
    "sdpa": _builtin("sdpa"),
}
BUGS: dict[str, Attention] = {
    "all zeros": lambda i: torch.zeros_like(i.queries[0]),
    "uniform attention": lambda i: variant(i, uniform=True),
    "GQA h % KV": lambda i: variant(i, head_map=lambda h, heads, kv: h % kv),
    "scale x1.1": lambda i: variant(i, scale_factor=1.1),
    "one page skipped": lambda i: variant(i, keep=_skip_middle_page),
    "last key dropped": lambda i: variant(i, keep=_drop_last_key),
    "causal off by one": lambda i: variant(i, mask_shift=-1),
}


def applies(case: str, size: Size) -> bool:
    """The off-by-one mask only differs from causal where a query has a later key."""
    return case != "causal off by one" or any(q > 1 for q in size.query_lens)


def worst_ratio(attention: Attention, inputs: StepInputs) -> float:
    return check_outputs(inputs, [attention(inputs)])[0].worst_ratio


def table(
    sizes: Sequence[Size] = SIZES, dtypes: Sequence[torch.dtype] = DTYPES, seed: int = 0
) -> dict[tuple[str, str, str], float]:
    """``(case, dtype, size) -> worst ratio`` for every correct computation and bug."""
    results = {}
    for size in sizes:
        for dtype in dtypes:
            inputs = make_step_inputs(scenario_for(size, dtype, seed))
            for case, attention in (CORRECT | BUGS).items():
                if applies(case, size):
                    ratio = worst_ratio(attention, inputs)
                    results[(case, dtype_name(dtype), size.name)] = ratio
    return results


def format_table(results: dict[tuple[str, str, str], float]) -> str:
    columns = sorted({(d, z) for _, d, z in results}, key=lambda c: (c[0], c[1]))
    cases = list(dict.fromkeys(c for c, _, _ in results))
    head = ["case".ljust(32)] + [f"{d} {z}".rjust(26) for d, z in columns]
    lines = ["  ".join(head)]
    for case in cases:
        cells = []
        for d, z in columns:
            ratio = results.get((case, d, z))
            cells.append(("-" if ratio is None else f"{ratio:.3g}").rjust(26))
        lines.append("  ".join([case.ljust(32), *cells]))
    return "\n".join(lines)


def main() -> None:
    results = table()
    print("worst error / bound (fails above 1):")
    print(format_table(results))
    correct = [r for (c, _, _), r in results.items() if c in CORRECT]
    bugs = [r for (c, _, _), r in results.items() if c in BUGS]
    print(f"correct: worst {max(correct):.3g}; bugs: least {min(bugs):.3g}")


if __name__ == "__main__":
    main()
