"""Time ``forward`` of the built-ins against torch SDPA on the same tokens held contiguously.

The foundation issue's measurement: decode, 32 sequences x 2048 context,
32 query / 8 KV heads, head_dim 128, fp32, page size 16, on the CPU. All
three are timed in one run with ``torch.utils.benchmark`` at one fixed thread
count, ``forward`` only (after ``prepare``, validation off), and reported as
ratios to the contiguous SDPA median. Outputs are checked against each other
first: a fast wrong answer is not a result.

    python tools/paging_overhead.py [--seqs 32] [--context 2048] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils import benchmark

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import DPBackendConfig, create_attention_backend
from harness.scenario import Scenario, make_step_inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--min-run-time", type=float, default=2.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    s = Scenario(
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        page_size=16,
        total_pages=args.seqs * args.context // 16 + 8,
        num_layers=1,
        context_lens=(args.context,) * args.seqs,
        query_lens=(1,) * args.seqs,
    )
    inputs = make_step_inputs(s)
    q, k_new, v_new = inputs.queries[0], inputs.keys[0], inputs.values[0]
    keys = torch.stack([seq.key for seq in inputs.sequences[0]]).transpose(1, 2)  # [B,KV,L,D]
    values = torch.stack([seq.value for seq in inputs.sequences[0]]).transpose(1, 2)
    keys, values = keys.contiguous(), values.contiguous()
    q_contig = q.unsqueeze(2)  # [B, H, 1, D]

    def contiguous() -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q_contig, keys, values, scale=s.softmax_scale, enable_gqa=True
        )

    expected = contiguous().squeeze(2)
    stmts = {"contiguous sdpa": contiguous}
    for name in ("sdpa", "reference"):
        backend = create_attention_backend(
            name,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            scale=s.softmax_scale,
            dp_config=DPBackendConfig(1, 0),
            validate=False,
        )
        backend.bind_kv_caches(inputs.caches)
        backend.prepare(inputs.step.metadata)
        out = backend.forward(q, k_new, v_new, 0)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        stmts[name] = lambda b=backend: b.forward(q, k_new, v_new, 0)

    medians = {}
    for label, fn in stmts.items():
        timer = benchmark.Timer(
            stmt="fn()",
            globals={"fn": fn},
            num_threads=args.threads,
            label="decode",
            description=label,
        )
        medians[label] = timer.blocked_autorange(min_run_time=args.min_run_time)
    base = medians["contiguous sdpa"].median
    print(
        f"decode {args.seqs} x {args.context}, H=32 KV=8 D=128 fp32 page=16, "
        f"threads={args.threads}, torch {torch.__version__}"
    )
    for label, m in medians.items():
        print(
            f"{label:16} median {m.median * 1e3:8.2f} ms  IQR {m.iqr * 1e3:6.2f} ms  "
            f"runs {len(m.times):3d}  ratio {m.median / base:5.2f}x"
        )


if __name__ == "__main__":
    main()
