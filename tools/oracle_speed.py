"""How long the float64 oracle takes per GPU-size benchmark case, grouped vs expanded heads.

    python tools/oracle_speed.py [--case decode-sweep/ctx=1024 ...]

The bench checks every case against the float64 oracle on the CPU before it
times anything, so on a GPU lease the oracle's CPU time is spent out of the
15 minutes. It computes each query-head group against its KV head once
(``[KV, G*q, D] @ [KV, D, L]``) and caches the result per case, shared by the
peer and every backend. The old way copied K and V out to every query head
in float64 first (``repeat_interleave``; 537 MB per tensor at L=16384) and
recomputed it for the peer and each backend. This times one pass of each way
on the same inputs, checks they agree, and prints the per-case totals for a
run of ``--backends`` backends beside the peer.
"""

from __future__ import annotations

import argparse
import time

import torch

from harness.bench.case_check import prepare_case
from harness.bench.workloads import get_workload
from harness.numerics.oracle import SequenceKV, oracle_attention

DEFAULT_CASES = (
    "decode-sweep/ctx=1024",
    "decode-sweep/ctx=2048",
    "decode-sweep/ctx=4096",
    "prefill-sweep/len=512 x8",
    "prefill-sweep/len=1024 x4",
)


def expanded_oracle(
    query: torch.Tensor, sequences: list[SequenceKV | None], query_lens: list[int], scale: float
) -> torch.Tensor:
    """The old way: K and V copied to every query head in float64, then per-head attention,
    and the same bound inputs (logit magnitude, value norms, rounding scale) as the oracle."""
    num_tokens, num_heads, head_dim = query.shape
    out = torch.zeros(num_tokens, num_heads, head_dim, dtype=torch.float64)
    start = 0
    for seq, q_len in zip(sequences, query_lens, strict=True):
        rows = slice(start, start + q_len)
        start += q_len
        if seq is None:
            continue
        group = num_heads // seq.key.shape[1]
        k = seq.key.to(torch.float64).transpose(0, 1).repeat_interleave(group, dim=0)
        v = seq.value.to(torch.float64).transpose(0, 1).repeat_interleave(group, dim=0)
        q = query[rows].to(torch.float64).transpose(0, 1)
        logits = (q @ k.transpose(1, 2)) * scale
        positions = torch.arange(seq.length - q_len, seq.length).unsqueeze(1)
        visible = torch.arange(seq.length).unsqueeze(0) <= positions  # bottom-right causal
        probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
        out[rows] = (probs @ v).transpose(0, 1)
        # the bound's inputs, as the oracle computes them: the same work on both sides
        magnitude = (q.abs().float() @ k.abs().float().transpose(1, 2)).double() * abs(scale)
        magnitude.masked_fill(~visible, 0).amax(-1)
        norms = v.norm(dim=-1).unsqueeze(1)
        norms.masked_fill(~visible, 0).amax(-1)
        (probs.square() @ norms.square().mT).sqrt()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="WORKLOAD/CASE (GPU size)")
    parser.add_argument("--backends", type=int, default=2, help="backends beside the peer")
    args = parser.parse_args()
    runs = args.backends + 1
    print(
        f"torch threads {torch.get_num_threads()}; one pass each; per case: the old way "
        f"x{runs} (peer and {args.backends} backends), the new way once"
    )
    header = ("case", "expanded s", "grouped s", "old/case s", "new/case s", "speed-up")
    print(f"{header[0]:28} " + " ".join(f"{h:>10}" for h in header[1:]))
    for name in args.case or DEFAULT_CASES:
        workload_name, case_name = name.split("/", 1)
        workload = get_workload(workload_name)
        spec = next(c for c in workload.gpu if c.name == case_name)
        case = prepare_case(workload, spec, "cpu")
        inputs = case.inputs
        query, sequences = inputs.queries[0], inputs.sequences[0]
        query_lens = [row.query_len for row in inputs.step.rows]
        scale = inputs.scenario.softmax_scale
        started = time.perf_counter()
        old = expanded_oracle(query, sequences, query_lens, scale)
        expanded_s = time.perf_counter() - started
        started = time.perf_counter()
        new = oracle_attention(query, sequences, query_lens, scale=scale).output
        grouped_s = time.perf_counter() - started
        gap = float((old - new).abs().max())
        if gap > 1e-9:
            raise SystemExit(f"{name}: the two ways disagree by {gap:.3g}")
        old_case, new_case = expanded_s * (args.backends + 1), grouped_s
        cells = (expanded_s, grouped_s, old_case, new_case)
        print(
            f"{name:28} " + " ".join(f"{c:10.2f}" for c in cells) + f" {old_case / new_case:9.1f}x",
            flush=True,
        )
        del case, inputs, old, new


if __name__ == "__main__":
    main()
