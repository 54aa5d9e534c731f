"""What a non-finite output's evidence supports: where it is, and what could have made it.

Unused cache memory and the gaps of strided inputs hold NaN by design, so a
kernel that reads past what it may read returns NaN instead of a plausible
wrong number. But a NaN also comes from a kernel's own arithmetic (a soft-cap
formed from exponentials overflows once ``|logit / cap|`` passes 88.7 in
float32; ``q.k`` past float16's range; an unnormalised ``P.V`` of large
values). A fixed guess sends its reader the wrong way half the time; this
module says which of the two the step allowed:
the rows it is in, whether any NaN lay where an in-bounds or a nearly
in-bounds read reaches, and how large the logits of the affected rows are.
"""

from __future__ import annotations

import torch

from harness.numerics.scenario import StepInputs

EXP_OVERFLOW = 88.72  # ln(float32 max): exp() of more is inf
FLOAT16_MAX = 65504.0


def nonfinite_evidence(inputs: StepInputs, layer: int, output: torch.Tensor) -> str:
    """One sentence per fact about ``output``'s non-finite values in ``layer``."""
    s = inputs.scenario
    bad = ~torch.isfinite(output.detach().cpu().flatten(1)).all(-1)  # per token
    affected, tokens, start = [], [], 0
    for index, row in enumerate(inputs.step.rows):
        span = slice(start, start + row.query_len)
        if row.seq_id is not None and bad[span].any():
            affected.append(index)
            tokens.append(span)
        start += row.query_len
    real = sum(row.seq_id is not None for row in inputs.step.rows)
    facts = [f"in {len(affected)} of {real} sequences ({_some(affected)})"]
    reachable = []
    if s.noncontiguous:
        reachable.append(
            "the step's query, key and value are strided views whose gaps hold NaN (a kernel "
            "that assumes a unit stride in the last dimension reads them)"
        )
    ragged = [i for i in affected if inputs.step.rows[i].seq_len % s.page_size]
    if ragged:
        reachable.append(
            f"the last page of {len(ragged)} of them holds NaN past the sequence's end "
            "(a read past the end sees it)"
        )
    facts += reachable or [
        "no NaN lay within reach of an in-bounds read (those sequences end on a page "
        "boundary and the inputs are dense): it came from the kernel's own arithmetic or "
        "from memory of another page"
    ]
    facts.append(_logit_fact(inputs, layer, tokens))
    return "; ".join(facts)


def _some(indices: list[int]) -> str:
    shown = ", ".join(str(i) for i in indices[:6])
    return f"rows {shown}{', ...' if len(indices) > 6 else ''}"


def _logit_fact(inputs: StepInputs, layer: int, tokens: list[slice]) -> str:
    """How large the affected rows' logits get, and whether that overflows by itself."""
    if not tokens:
        return "no sequence's row is affected (only padding rows)"
    s = inputs.scenario
    oracle, _ = inputs.reference(layer)
    reach = max(float(oracle.logit_scale[span].max()) for span in tokens)
    cap = s.variant.logits_soft_cap
    if cap is not None and reach / cap > EXP_OVERFLOW:
        return (
            f"their |logit / soft_cap| reaches {reach / cap:.3g}: past {EXP_OVERFLOW}, "
            "exp() of it overflows float32, so a soft-cap formed from exponentials "
            "(tanh as a ratio of exps) gives inf / inf = NaN with no bad read"
        )
    if s.dtype == torch.float16 and reach / s.softmax_scale > FLOAT16_MAX:
        return (
            f"their raw q.k reaches {reach / s.softmax_scale:.3g}, past float16's range: "
            "a dot product kept in float16 overflows"
        )
    largest = max(float(oracle.value_scale[span].max()) for span in tokens)
    if s.dtype == torch.float16 and 2 * largest > FLOAT16_MAX:
        return (
            f"their values reach a norm of {largest:.3g}: an unnormalised weighted sum of "
            "two or more of them (P.V before dividing by the softmax's sum) kept in float16 "
            "overflows"
        )
    return f"their logits and values stay within range ({reach:.3g}): no overflow explains it"
