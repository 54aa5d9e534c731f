"""How close correct backends come to the tolerance on one step shape, over many seeds.

    python tools/bound_margin.py --backends vllm-cpu,reference --head-dim 256 \\
        --context 3 --values massive-qk --seeds 300

A conformance failure at 1.1x the bound is either a bug or a bound that a
correct kernel's arithmetic can reach. This runs one single-sequence step
shape (one query token over ``--context`` keys) at every seed in turn and
prints each backend's worst, median and 90th-percentile ratio of error to
bound: a correct kernel should stay at a quarter of the bound or less, and
``reference`` beside it shows what plain fp32 arithmetic reaches.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from harness.core.contract import capabilities_of
from harness.core.registry import default_registry
from harness.numerics.scenario import (
    Scenario,
    backend_for,
    check_outputs,
    engine_conventions,
    run_scenario,
)
from harness.numerics.value_regimes import VALUE_REGIMES

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def worst_ratios(name: str, shape: Scenario, seeds: int) -> torch.Tensor:
    """Each seed's worst error / bound over its heads, for backend ``name``."""
    entry = default_registry().resolve(name)
    scenario = replace(shape, **engine_conventions(capabilities_of(entry.cls)))
    if scenario.page_format is not None:
        scenario = replace(scenario, cache_layout=scenario.page_format.name)
    ratios = []
    for seed in range(seeds):
        inputs, outputs = run_scenario(
            lambda s: backend_for(entry, s), replace(scenario, seed=seed)
        )
        ratios.append(max(c.worst_ratio for c in check_outputs(inputs, outputs)))
    return torch.tensor(ratios, dtype=torch.float64)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python tools/bound_margin.py")
    parser.add_argument("--backends", default="reference", help="comma-separated names")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--context", type=int, default=3, help="keys the query token sees")
    parser.add_argument("--scale", type=float, default=None, help="default: 1/sqrt(head dim)")
    parser.add_argument("--values", choices=VALUE_REGIMES, default="normal")
    parser.add_argument("--seeds", type=int, default=100)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pages = -(-args.context // args.page_size) + 1
    shape = Scenario(
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        page_size=args.page_size,
        total_pages=pages,
        num_layers=1,
        context_lens=(args.context,),
        query_lens=(1,),
        dtype=DTYPES[args.dtype],
        scale=args.scale,
        values=args.values,
    )
    print(f"{shape.describe()}; {args.seeds} seeds; ratio = error / bound, worst head per seed")
    for name in args.backends.split(","):
        r = worst_ratios(name, shape, args.seeds)
        print(
            f"{name:>12}: worst {r.max():.3f}  median {r.median():.3f}  "
            f"p90 {r.quantile(0.9):.3f}  over the bound {int((r > 1).sum())}"
        )


if __name__ == "__main__":
    main()
