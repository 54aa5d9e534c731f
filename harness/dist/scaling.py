"""The DP scaling benchmark: a fixed global decode load over 1..8 real rank processes.

For each dp_size the launcher starts that many ranks; each takes its
balanced share of the global batch in its own per-rank pool, checks one
step against the float64 oracle (never timing a wrong answer), then runs
engine steps: exchange token counts (an all-reduce, as engines do),
``prepare``, ``forward`` over the layers, and a barrier, since a DP step
ends when its slowest rank does. Rank 0 times each whole step. The result
is a results file (workload kind ``dp-scaling``) that ``attn-harness
report`` draws; its throughput is the whole group's.

Run a rank by hand with ``python -m harness.dist.scaling`` (the launcher does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.exit_codes import EXIT_OK

WORKLOAD = "dist-dp-scaling"
VERSION = 1


@dataclass(frozen=True)
class ScalingLoad:
    """The global load every dp_size shares: ``sequences`` decoding at ``context``."""

    sequences: int = 16
    context: int = 512
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_layers: int = 1
    dtype: str = "float32"
    warmup: int = 3
    steps: int = 20

    def share(self, dp_size: int, rank: int) -> int:
        """Balanced: the first ``sequences % dp_size`` ranks take one more."""
        base, extra = divmod(self.sequences, dp_size)
        return base + (rank < extra)

    def spec(self, dp_size: int, rank: int | None = None) -> Any:
        """A ``CaseSpec`` of ``rank``'s share, or of the whole group's work (``rank=None``)."""
        from harness.bench.workloads import CaseSpec

        count = self.sequences if rank is None else self.share(dp_size, rank)
        return CaseSpec(
            f"dp={dp_size}",
            (self.context,) * count,
            (1,) * count,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            page_size=self.page_size,
            dtype=self.dtype,
            dp_size=dp_size,
            dp_rank=rank or 0,
            layout="per_rank",
        )


# -- one rank ----------------------------------------------------------------------------


def _rank_scenario(load: ScalingLoad, dp_size: int, rank: int, device: str) -> Any:
    """The rank's share in a pool sized for the largest share, so every rank agrees on it."""
    from dataclasses import replace

    from harness.core.kv_pages import pages_needed

    largest = load.share(dp_size, 0)
    total = (largest * pages_needed(load.context, load.page_size) + 1) * dp_size
    scenario = load.spec(dp_size, rank).scenario(device)
    return replace(scenario, total_pages=total, num_layers=load.num_layers)


def run_rank(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from harness.bench.case_check import accepts_validate
    from harness.dist.failures import fail_rank
    from harness.dist.group import die_with_parent, join_group
    from harness.dist.progress import Heartbeat
    from harness.dist.worker import resolve_entry
    from harness.numerics.scenario import backend_for, check_outputs, make_step_inputs

    die_with_parent()
    rank = int(os.environ.get("RANK", "0"))
    dp_size = int(os.environ.get("WORLD_SIZE", "1"))
    beat = Heartbeat(args.run_dir, rank)
    beat.beat(-1, "init")
    try:
        # torch's threads: OMP_NUM_THREADS, the launcher's share of the cores unless set
        join_group("auto", args.device, rank, dp_size, args.timeout)
        load = ScalingLoad(**json.loads(args.load))
        beat.beat(-1, "setup")
        entry = resolve_entry(args.backend)
        scenario = _rank_scenario(load, dp_size, rank, args.device)
        inputs = make_step_inputs(scenario)
        checked = backend_for(entry, scenario)
        checked.bind_kv_caches(inputs.caches)
        checked.prepare(inputs.step.metadata)
        outputs = [checked.forward(*inputs.forward_args(i), i) for i in range(load.num_layers)]
        worst = max(c.worst_ratio for c in check_outputs(inputs, outputs))
        failed = [c.describe() for c in check_outputs(inputs, outputs) if not c.passed]
        beat.beat(0, "exchange")
        verdicts: list[Any] = [None] * dp_size
        dist.all_gather_object(verdicts, (rank, worst, failed[0] if failed else None))
        kwargs = {"validate": False} if accepts_validate(entry.cls) else {}
        backend = backend_for(entry, scenario, **kwargs)
        backend.bind_kv_caches(inputs.caches)
        counts = torch.zeros(dp_size, dtype=torch.int64)
        samples: list[int] = []
        wrong = next((v for v in verdicts if v[2] is not None), None)
        calls = layer_calls(backend, inputs, load)  # fresh inputs every step, watched
        for step in range(0 if wrong else load.warmup + load.steps):
            for layer_call in calls:  # outside the timed region, before the first barrier
                layer_call.load(step)
            beat.beat(step, "barrier")
            dist.barrier()
            started = time.perf_counter_ns()
            counts.zero_()
            counts[rank] = inputs.step.num_tokens
            dist.all_reduce(counts)  # the engine's token-count exchange
            beat.beat(step, "forward")
            backend.prepare(inputs.step.metadata)
            outputs = [layer_call.target() for layer_call in calls]
            beat.beat(step, "barrier")
            dist.barrier()
            if step >= load.warmup:
                samples.append(time.perf_counter_ns() - started)
            for layer_call, output in zip(calls, outputs, strict=True):
                layer_call.keep(step, output)
                layer_call.settle()
        if not wrong:
            calls[0].judge_repeat(samples, load.warmup)  # every layer's repeat is one step
        found = next((c.problem for c in calls if c.problem is not None), None)
        timed: list[Any] = [None] * dp_size
        mine = None if found is None else (rank, found.status, found.cause)
        dist.all_gather_object(timed, mine)
        if rank == 0 and args.run_dir is not None:
            result = {
                "samples_ns": samples,
                "threads": torch.get_num_threads(),
                "oracle": [{"rank": r, "worst_ratio": w, "problem": p} for r, w, p in verdicts],
                "timed": [{"rank": t[0], "status": t[1], "cause": t[2]} for t in timed if t],
            }
            (args.run_dir / "bench.json").write_text(json.dumps(result), encoding="utf-8")
        beat.beat(load.steps, "done")
        dist.destroy_process_group()
    except BaseException as exc:
        fail_rank(args.run_dir, beat, exc)


def layer_calls(backend: Any, inputs: Any, load: ScalingLoad) -> list[Any]:
    """Each layer's timed calls (``harness.bench.timed_checks``): its own buffers, refilled
    from a pool of fresh inputs every step; its outputs compared step to step, some steps
    held to the oracle, and one step reading an earlier one's inputs again."""
    from harness.bench.fresh_inputs import InputPool
    from harness.bench.timed_checks import BackendTarget, TimedCalls, call_plan
    from harness.numerics.scenario import StepInputs

    s = inputs.scenario
    steps = load.warmup + load.steps
    plan = call_plan(s.seed, load.warmup, load.steps)
    calls = []
    for layer in range(load.num_layers):
        own = StepInputs(
            s,
            inputs.step,
            [inputs.caches[layer]],
            [inputs.queries[layer]],
            [inputs.keys[layer]],
            [inputs.values[layer]],
            [inputs.sequences[layer]],
        )
        target = BackendTarget.over(
            backend,
            inputs.forward_args(layer),
            [inputs.caches[layer]],
            s.variant.quantized,
            layer,
        )
        pool = InputPool(own, steps, seed=s.seed * 1000 + layer)
        calls.append(TimedCalls(pool, target, plan, s.dtype))
    return calls


def build_rank_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.dist.scaling")
    p.add_argument("--backend", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--load", required=True, help="the ScalingLoad as JSON")
    p.add_argument("--run-dir", type=Path, default=None)
    p.add_argument("--timeout", type=float, default=120.0)
    return p


# -- the sweep ---------------------------------------------------------------------------


Progress = Callable[[str], None]


def sweep(
    backend: str,
    dp_sizes: Sequence[int],
    load: ScalingLoad,
    *,
    device: str = "cpu",
    timeout: float = 120.0,
    progress: Progress = print,
    command: Sequence[str] = (),
) -> Any:
    """One launch per dp_size; returns the run's ``RunRecord``."""
    from dataclasses import asdict

    from harness import __version__
    from harness.bench.ceilings import run_ceilings
    from harness.bench.environment import fingerprint
    from harness.bench.run_results import case_metrics
    from harness.dist.launcher import launch
    from harness.dist.progress import read_json
    from harness.results.store import CaseRecord, RunRecord, TimingRecord

    ceilings = run_ceilings(device, dtypes=(load.spec(1).torch_dtype,), measure_probe=False)
    cases = []
    threads_seen = []
    for dp_size in dp_sizes:
        spec = load.spec(dp_size)
        with tempfile.TemporaryDirectory(prefix="attn-harness-scaling-") as folder:
            run_dir = Path(folder)
            outcome = launch(
                ["--backend", backend, "--device", device, "--load", json.dumps(asdict(load))],
                dp_size,
                run_dir,
                timeout=timeout,
                echo_rank0=False,
                module="harness.dist.scaling",
            )
            measured = read_json(run_dir / "bench.json")
        base = dict(
            id=f"{WORKLOAD}@{VERSION}/dp={dp_size}/{backend}",
            role="backend",
            backend=backend,
            workload=WORKLOAD,
            workload_version=VERSION,
            case=f"dp={dp_size}",
            spec=spec.to_json() | {"processes": dp_size},
            peer=None,
        )
        if outcome.exit_code != EXIT_OK or measured is None:
            status = "TIMEOUT" if outcome.hung else "RUNTIME_ERROR"
            cases.append(
                CaseRecord(
                    **base,
                    status=status,
                    error=outcome.message,
                    oracle=None,
                    forward=None,
                    prepare=None,
                    metrics=None,
                )
            )
            progress(f"dp={dp_size}: {status}: {outcome.message}")
            continue
        oracle = measured["oracle"]
        worst = max(o["worst_ratio"] for o in oracle)
        problem = next((f"rank {o['rank']}: {o['problem']}" for o in oracle if o["problem"]), None)
        verdict = {
            "passed": problem is None,
            "worst_ratio": worst,
            "detail": problem or f"every rank within the bound (worst {worst:.3f}x)",
        }
        timed = measured.get("timed") or []
        if problem is None and timed:  # a timed step's output, or its time, not the work's
            status = timed[0]["status"]
            problem = f"rank {timed[0]['rank']}: {timed[0]['cause']}"
        else:
            status = "INCORRECT_NUMERICAL"
        if problem is not None:
            cases.append(
                CaseRecord(
                    **base,
                    status=status,
                    error=problem,
                    oracle=verdict,
                    forward=None,
                    prepare=None,
                    metrics=None,
                )
            )
            progress(f"dp={dp_size}: {status}: {problem}")
            continue
        threads_seen.append(measured["threads"])
        forward = TimingRecord(
            samples_ns=measured["samples_ns"],
            warmup_ns=[],
            clock="perf_counter_ns (rank 0, barrier to barrier)",
            threads=measured["threads"],
            stop_reason="fixed_rounds",
        )
        metrics, flags = case_metrics(spec, forward, ceilings, None)
        cases.append(
            CaseRecord(
                **base,
                status="PASSED",
                oracle=verdict,
                forward=forward,
                prepare=None,
                metrics=metrics,
                flags=flags,
            )
        )
        median_ms = forward.summary().median / 1e6
        progress(
            f"dp={dp_size}: {metrics['tokens_per_s']:.0f} tokens/s "
            f"(step {median_ms:.2f} ms median, {measured['threads']} threads per rank)"
        )
    return RunRecord(
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        tool={"name": "attn-harness dist-bench", "version": __version__, "command": list(command)},
        environment=fingerprint(device, threads=max(threads_seen, default=1)),
        ceilings=ceilings.to_json(),
        timing={
            "device": device,
            "clock": "perf_counter_ns",
            "threads": max(threads_seen, default=1),
            "cold_cache": False,
            "config": asdict(load),
            "overhead": None,
        },
        workloads=[
            {
                "name": WORKLOAD,
                "version": VERSION,
                "size": "cpu" if device == "cpu" else "gpu",
                "kind": "dp-scaling",
                "description": (
                    f"{load.sequences} sequences decoding at context {load.context}, shared by "
                    "dp_size rank processes (torch.distributed); each step: token-count "
                    "all-reduce, prepare, forward, barrier; the group's tokens per second"
                ),
            }
        ],
        cases=cases,
    )


if __name__ == "__main__":
    run_rank(build_rank_parser().parse_args())
    sys.exit(EXIT_OK)
