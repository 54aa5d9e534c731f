"""What the conformance strategies draw: a distribution table over many drawn steps.

    python tools/draw_distribution.py [--examples 600] [--profile ci] [--row-maxima]

Draws the way the suite does (derandomized, as the ``ci`` profile), with
the claim of ``reference`` (every variant): plain ``scenarios`` (which mix
in production shapes) and each production regime in turn. Besides sizes it
counts what engines run every day: speculative-decoding steps by query
length and GQA group, logit offsets, new tokens per step and pool sizes;
``--row-maxima`` also builds each plain draw's tensors and buckets the
actual maximum logit of every row (slower: about a minute per 1000 draws).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from harness.conformance.claim_coverage import labels
from harness.conformance.production_shapes import REGIMES
from harness.conformance.profiles import get_profile
from harness.conformance.step_strategies import production_scenarios, scenarios
from harness.core.registry import default_registry
from harness.numerics.scenario import Scenario, make_step_inputs

BINS = {
    "context": (1, 64, 65, 128, 129, 256, 257, 512, 513, 1024, 1025, 2048, 2049, 4096, 4097, 32768),
    "query length": (1, 2, 64, 65, 128, 129),
    "page size": (1, 2, 16, 17, 32, 64, 128, 256),
    "head dim": (1, 63, 64, 80, 96, 128, 192, 256),
    "GQA group": (1, 2, 8, 9, 16, 17),
    "query heads": (1, 16, 32, 64),
    "sequences": (1, 2, 5, 64, 65),
    "dp_size": (1, 2, 8, 9, 16, 17),
}


def _bin(value: int, edges: tuple[int, ...]) -> str:
    """The bucket ``[edge, next edge)`` holding ``value``."""
    below = [e for e in edges if e <= value]
    if not below:
        return f"<{edges[0]}"
    low = below[-1]
    higher = [e for e in edges if e > low]
    return (
        f"{low}" if higher and higher[0] == low + 1 else f"{low}..{higher[0] - 1 if higher else ''}"
    )


def collect(strategy: st.SearchStrategy[Scenario], examples: int) -> list[Scenario]:
    drawn: list[Scenario] = []

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def record(s: Scenario) -> None:
        drawn.append(s)

    record()
    return drawn


def describe(drawn: list[Scenario]) -> dict[str, Counter[str]]:
    counts: dict[str, Counter[str]] = {name: Counter() for name in BINS}
    extra: Counter[str] = Counter()
    for s in drawn:
        values = {
            "context": s.context_lens,
            "query length": s.query_lens,
            "page size": (s.page_size,),
            "head dim": (s.head_dim,),
            "GQA group": (s.num_heads // s.num_kv_heads,),
            "query heads": (s.num_heads,),
            "sequences": (len(s.context_lens),),
            "dp_size": (s.dp_size,),
        }
        for name, vals in values.items():
            for bucket in {_bin(v, BINS[name]) for v in vals}:  # once per bucket it reaches
                counts[name][bucket] += 1
        extra[f"dtype {str(s.dtype).removeprefix('torch.')}"] += 1
        extra[f"layout {s.layout.value}"] += 1
        extra["combined K/V cache"] += s.combined_kv
        extra["strided q/k/v"] += s.noncontiguous
        extra["planted logits"] += s.planted_keys > 0
        extra["graph-mode padding"] += s.graph_mode
        extra["MQA with 32+ heads"] += s.num_kv_heads == 1 and s.num_heads >= 32
        extra["pool not divisible by dp_size"] += s.total_pages % s.dp_size != 0
        extra["page ids past 32767"] += s.total_pages > 32768
    counts["other"] = extra
    counts["field regimes"] = field_regimes(drawn)
    return counts


def field_regimes(drawn: list[Scenario]) -> Counter[str]:
    """Spec-decode steps per (query length, GQA group), offsets, tokens per step, pool sizes."""
    found: Counter[str] = Counter()
    for s in drawn:
        step = labels(s)
        if step["batch"] == "spec-decode":
            group = s.num_heads // s.num_kv_heads
            mqa = " (MQA)" if s.num_kv_heads == 1 and group > 1 else ""
            found[f"spec-decode q={s.query_lens[0]} group={group}{mqa}"] += 1
        found[f"logit offset {step['logit_offset']}"] += 1
        found[f"tokens per step {step['tokens']}"] += 1
        found[f"pool elements {step['pool']}"] += 1
    return found


MAXIMA_EDGES = (-1e5, -3e4, -1e4, -1e3, 1e3, 1e4, 3e4, 1e5)


def row_maxima(drawn: list[Scenario]) -> Counter[str]:
    """Each real query row's largest logit (over heads), bucketed at ``MAXIMA_EDGES``."""
    found: Counter[str] = Counter()
    for s in drawn:
        inputs = make_step_inputs(replace(s, num_layers=1))
        query, start = inputs.queries[0].double(), 0
        for row, seq in zip(inputs.step.rows, inputs.sequences[0], strict=True):
            tokens = query[start : start + row.query_len]
            start += row.query_len
            if seq is None:
                continue
            keys = seq.key.double().repeat_interleave(s.num_heads // s.num_kv_heads, dim=1)
            best = torch.einsum("qhd,lhd->qhl", tokens, keys).amax(dim=(1, 2)) * s.softmax_scale
            for value in best.tolist():
                found[_maximum_bucket(value)] += 1
    return found


def _maximum_bucket(value: float) -> str:
    """``[low, high)`` of ``MAXIMA_EDGES`` holding ``value``."""
    below = [e for e in MAXIMA_EDGES if e <= value]
    above = [e for e in MAXIMA_EDGES if e > value]
    low = f"{below[-1]:g}" if below else "-inf"
    high = f"{above[0]:g}" if above else "inf"
    return f"[{low}, {high})"


def _order(bucket: str) -> tuple[int, str]:
    """Numeric buckets by their lower edge; named ones after, alphabetically."""
    head = bucket.split("..")[0].lstrip("<")
    return (int(head), "") if head.isdigit() else (2**31, bucket)


def print_table(title: str, drawn: list[Scenario]) -> None:
    print(f"\n## {title}: {len(drawn)} steps (a step counts once in each bucket it reaches)")
    for name, counter in describe(drawn).items():
        ordered = sorted(counter.items(), key=lambda kv: _order(kv[0]))
        cells = ", ".join(f"{k}: {v}" for k, v in ordered if v)
        print(f"- {name}: {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=600)
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--row-maxima", action="store_true", help="bucket actual row maxima")
    args = parser.parse_args()
    budget = get_profile(args.profile).budget
    caps = default_registry().entry("reference").capabilities
    plain = collect(scenarios(caps, budget=budget), args.examples)
    print_table("scenarios (every property)", plain)
    if args.row_maxima:
        ordered = sorted(row_maxima(plain).items(), key=lambda kv: float(kv[0][1:].split(",")[0]))
        print("- row maxima: " + ", ".join(f"{k}: {v}" for k, v in ordered))
    production = []
    for regime in REGIMES:
        production += collect(production_scenarios(caps, regime, budget=budget), args.examples // 6)
    print_table("production regimes together", production)


if __name__ == "__main__":
    main()
