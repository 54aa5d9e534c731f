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
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils import benchmark

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.bench.peer import ContiguousPeer
from harness.core.registry import default_registry
from harness.numerics.scenario import Scenario, backend_for, make_step_inputs


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
    peer = ContiguousPeer(inputs)  # the benchmark runner's no-paging peer
    expected = peer.assemble(peer())
    stmts: dict[str, Callable[[], object]] = {"contiguous sdpa": peer}
    registry = default_registry()
    for name in ("sdpa", "reference"):
        backend = backend_for(registry.entry(name), s, validate=False)
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
