"""One DP rank: ``python -m harness.dist.worker``, started by ``attn-harness dist`` or torchrun.

The rank joins the group through torch.distributed (``RANK``/``WORLD_SIZE``
from the environment, as torchrun sets them), binds its own pool
(``page_offset`` = the start of its page range, ``total_pages`` global),
builds its backend with ``(dp_size, dp_rank)``, and runs the engine loop:
plan its requests, exchange token counts, pad to the group's size, run every
layer, gather outputs to rank 0 for the checks, and hear the verdict. Every
rank leaves together: a bad count or a failed check raises the same error on
all of them, after the collective that told them, so none waits in the next.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness.core.kv_pages import PoolLayout
from harness.dist.check import GroupChecker, RankVerdict, run_layers
from harness.dist.claims import claim_problems, fit_claim
from harness.dist.coordination import CountReport, group_counts, pad_step
from harness.dist.failures import SetupFailed, StepCheckFailed, UsageProblem, fail_rank
from harness.dist.faults import Fault, corrupt, strike
from harness.dist.group import die_with_parent, join_group, local_index, rank_device
from harness.dist.progress import Heartbeat, write_summary
from harness.dist.schedule import DistSetup, RankSchedule, rank_caches

SUMMARY_FIELDS = (
    "steps", "seed", "dtype", "device", "graph",
    "num_heads", "num_kv_heads", "head_dim", "page_size", "num_layers",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.dist.worker", description=__doc__)
    p.add_argument("--backend", required=True, help="registered name or path.py:Class")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--graph", action="store_true", help="pad every step to a captured size")
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout, seconds")
    p.add_argument("--dist-backend", default="auto", choices=("auto", "gloo", "nccl"))
    p.add_argument("--run-dir", type=Path, default=None, help="beat, status and summary files")
    p.add_argument("--inject", action="append", default=[], type=Fault.parse, metavar="FAULT")
    return p


BackendFactory = Callable[[int], Any]


def backend_factory(entry: Any, setup: DistSetup) -> BackendFactory:
    """Build ``entry`` for a given dp_rank of the setup's group."""
    from harness.core.registry import DPBackendConfig, HeadConfig, instantiate_backend

    heads = HeadConfig(
        setup.num_heads, setup.num_kv_heads, setup.head_dim, setup.scale, setup.kv_lora_rank
    )

    def make(rank: int) -> Any:
        return instantiate_backend(
            entry.cls,
            heads,
            dp_config=DPBackendConfig(setup.dp_size, rank),
            name=entry.name,
        )

    return make


def resolve_entry(spec: str) -> Any:
    from harness.core.registry import default_registry

    try:
        return default_registry().resolve(spec)
    except (ValueError, ImportError, LookupError, SyntaxError) as exc:
        raise UsageProblem(f"backend {spec!r}: {exc}") from exc


class RankLoop:
    """The engine loop of one rank; rank 0 also checks the group."""

    def __init__(self, args: argparse.Namespace, rank: int, dp_size: int, beat: Heartbeat) -> None:
        self.args, self.rank, self.beat = args, rank, beat
        entry = resolve_entry(args.backend)
        setup = DistSetup(
            dp_size=dp_size,
            steps=args.steps,
            seed=args.seed,
            dtype=args.dtype,
            device=rank_device(args.device, local_index(rank)),
            graph=args.graph,
        )
        self.setup = s = fit_claim(setup, entry.capabilities)
        problems = claim_problems(
            entry,
            dtype=s.torch_dtype,
            device=s.device,
            dp_sizes=[dp_size],
            page_size=s.page_size,
            head_dim=s.head_dim,
            longest=s.longest,
            padding=s.graph,
        )
        if problems:
            raise UsageProblem(f"backend {entry.name!r} cannot run this: {'; '.join(problems)}")
        self.entry = entry
        self.can_pad = bool(entry.capabilities.graph_mode)
        self.schedule = RankSchedule(s, rank)
        self.caches = rank_caches(s, rank, PoolLayout.PER_RANK)
        make = backend_factory(entry, s)
        self.backend = _built(lambda: make(rank), rank, "building")
        _built(lambda: self.backend.bind_kv_caches(self.caches), rank, "binding its pool to")
        self.checker = None
        if rank == 0:
            shared = _shared_factory(make)
            self.checker = GroupChecker(s, shared, can_pad=self.can_pad)
        self.steps: list[dict[str, Any]] = []

    def run(self) -> None:
        started = time.perf_counter()
        for step in range(self.setup.steps):
            self._step(step)
        if self.checker is not None:
            write_summary(
                self.args.run_dir,
                {
                    "backend": self.entry.name,
                    "dp_size": self.setup.dp_size,
                    "setup": {k: getattr(self.setup, k) for k in SUMMARY_FIELDS},
                    "padding": "on" if self.can_pad else "off (the backend claims no padding)",
                    "seconds": time.perf_counter() - started,
                    "checked_steps": sum(1 for s in self.steps if s["ranks"]),
                    "steps": self.steps,
                },
            )

    def _step(self, step: int) -> None:
        s, rank, beat, faults = self.setup, self.rank, self.beat, self.args.inject
        beat.beat(step, "plan")
        tokens = self.schedule.plan(step)
        report = corrupt(faults, CountReport.honest(rank, s.dp_size, tokens), step + 1)
        beat.beat(step, "exchange")
        reports: list[Any] = [None] * s.dp_size
        dist.all_gather_object(reports, report)
        counts = group_counts(reports, s.dp_size, step + 1)
        padded = pad_step(counts, rank, graph=s.graph, can_pad=self.can_pad)
        beat.beat(step, "forward")
        strike(faults, rank, step + 1)  # before a skip, so a planted fault always fires
        if padded.skipped:
            if self.checker is not None:
                for schedule in self.checker.schedules:
                    schedule.plan(step)
                self.steps.append({"step": step, "counts": counts, "padded": 0, "ranks": []})
                print(f"step {step + 1}/{s.steps}: no rank has tokens; skipped", flush=True)
            return
        rank_step = self.schedule.build(step, padded.padding)
        outputs: list[torch.Tensor] = []
        problem = None
        if rank_step.step is not None:
            where = f"rank {rank} step {step + 1} (per-rank pool)"
            outputs, problem = run_layers(
                self.backend, self.caches, rank_step, padded.graph_mode, where
            )
            # padding rows are dropped: only the real tokens leave the rank
            outputs = [out[: rank_step.real_tokens].detach().cpu() for out in outputs]
        beat.beat(step, "gather")
        gathered: list[Any] | None = [None] * s.dp_size if rank == 0 else None
        dist.gather_object((outputs, problem), gathered, dst=0)
        verdict: list[Any] = [None]
        if self.checker is not None:
            beat.beat(step, "check")
            assert gathered is not None
            verdicts = self.checker.check(step, counts, gathered)
            verdict[0] = next(((v.problem, v.rank) for v in verdicts if v.problem), None)
            largest = padded.padded_tokens if self.can_pad else max(counts)
            self._record(step, counts, largest, verdicts)
        beat.beat(step, "verdict")
        dist.broadcast_object_list(verdict, src=0)
        if verdict[0] is not None:
            message, culprit = verdict[0]
            raise StepCheckFailed(message, culprit)

    def _record(
        self, step: int, counts: list[int], padded: int, verdicts: list[RankVerdict]
    ) -> None:
        """``padded``: every rank's padded size, or (unpadded) the largest rank's tokens."""
        self.steps.append(
            {
                "step": step,
                "counts": counts,
                "padded": padded,
                "ranks": [
                    {
                        "rank": v.rank,
                        "tokens": v.tokens,
                        "oracle_ratio": v.oracle_ratio,
                        "shared_ratio": v.shared_ratio,
                    }
                    for v in verdicts
                ],
            }
        )
        worst = [v.oracle_ratio for v in verdicts if v.oracle_ratio is not None]
        agree = [v.shared_ratio for v in verdicts if v.shared_ratio is not None]
        shape = f"{padded} per rank" if self.can_pad else "unpadded"
        print(
            f"step {step + 1}/{self.setup.steps}: tokens {counts} -> {shape}; "
            f"oracle worst {max(worst, default=0):.3f}x bound, shared pool "
            f"{max(agree, default=0):.3f}x",
            flush=True,
        )


def _built(action: Callable[[], Any], rank: int, doing: str) -> Any:
    """Run a backend's constructor or bind; what it raises is the backend's failure."""
    try:
        return action()
    except (UsageProblem, SetupFailed):
        raise
    except Exception as exc:
        raise SetupFailed(
            f"{doing} the backend for dp_rank {rank} raised {type(exc).__name__}: {exc}", rank
        ) from exc


def _shared_factory(make: BackendFactory) -> BackendFactory:
    """Rank 0's shared-pool instances, each failure named by the dp_rank it was built for."""

    def build(rank: int) -> Any:
        return _built(lambda: make(rank), rank, "building (shared pool)")

    return build


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    die_with_parent()
    rank = int(os.environ.get("RANK", "0"))
    dp_size = int(os.environ.get("WORLD_SIZE", "1"))
    if args.run_dir is not None:
        args.run_dir.mkdir(parents=True, exist_ok=True)
    beat = Heartbeat(args.run_dir, rank)
    beat.beat(-1, "init")
    try:
        join_group(args.dist_backend, args.device, rank, dp_size, args.timeout)
        beat.beat(-1, "setup")
        loop = _agreed_setup(args, rank, dp_size, beat)
        loop.run()
        beat.beat(args.steps, "barrier")
        dist.barrier()
        beat.beat(args.steps, "done")
        dist.destroy_process_group()
        return 0
    except BaseException as exc:  # every way out of a rank is reported, then the rank exits
        fail_rank(args.run_dir, beat, exc)
        raise  # not reached: fail_rank exits


def _agreed_setup(args: argparse.Namespace, rank: int, dp_size: int, beat: Heartbeat) -> RankLoop:
    """Build this rank's loop; if any rank cannot, every rank raises the first one's reason."""
    loop: RankLoop | None = None
    problem: tuple[str, str, int | None] | None = None
    try:
        loop = RankLoop(args, rank, dp_size, beat)
    except (UsageProblem, SetupFailed) as exc:
        kind = "usage" if isinstance(exc, UsageProblem) else "setup"
        problem = (kind, f"rank {rank}: {exc}", exc.culprit if exc.culprit is not None else rank)
    except Exception as exc:
        problem = ("setup", f"rank {rank}: setting up raised {type(exc).__name__}: {exc}", rank)
    beat.beat(-1, "join")
    problems: list[Any] = [None] * dp_size
    dist.all_gather_object(problems, problem)
    first = next((p for p in problems if p), None)
    if first is not None:
        kind, message, culprit = first
        raise (UsageProblem if kind == "usage" else SetupFailed)(message, culprit)
    assert loop is not None
    return loop


if __name__ == "__main__":
    sys.exit(main())
