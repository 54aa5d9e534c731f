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
import datetime
import os
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness.dist.check import GroupChecker, RankVerdict, run_layers
from harness.dist.coordination import CountReport, DPMetadataError, group_counts, pad_step
from harness.dist.faults import Fault, corrupt, strike
from harness.dist.progress import Heartbeat, Status, write_status, write_summary
from harness.dist.schedule import DistSetup, RankSchedule, rank_caches
from harness.kv_pages import PoolLayout

EXIT_FAILED, EXIT_USAGE = 1, 2


class StepCheckFailed(RuntimeError):
    """Rank 0 found a wrong output or a stray write; every rank raises it."""


class UsageProblem(ValueError):
    """The run cannot start as asked (backend, capability); every rank raises it."""


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


def dist_backend(choice: str, device: str, dp_size: int) -> str:
    """NCCL where every rank has a GPU of its own, gloo otherwise."""
    if choice != "auto":
        return choice
    cuda = device.startswith("cuda") and torch.cuda.is_available()
    return "nccl" if cuda and torch.cuda.device_count() >= dp_size else "gloo"


def _rank_device(device: str, rank: int) -> str:
    if device == "cuda" and torch.cuda.device_count() > 1:
        return f"cuda:{rank % torch.cuda.device_count()}"
    return device


def join_group(choice: str, device: str, rank: int, dp_size: int, timeout: float) -> None:
    """``init_process_group`` from the launcher's file store, or torchrun's ``env://``."""
    backend = dist_backend(choice, device, dp_size)
    if backend == "nccl":  # object collectives run on the current device
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        backend,
        init_method=os.environ.get("ATTN_HARNESS_DIST_INIT", "env://"),
        rank=rank,
        world_size=dp_size,
        timeout=datetime.timedelta(seconds=timeout),
    )


def fail_rank(run_dir: Path | None, beat: Heartbeat, exc: BaseException) -> None:
    """Report how this rank failed (status file and stderr), then leave at once."""
    kind = _kind(exc, beat.phase)
    text = f"{type(exc).__name__}: {exc}"
    write_status(run_dir, Status(beat.rank, beat.step, beat.phase, kind, text))
    print(f"rank {beat.rank}: {text}", file=sys.stderr, flush=True)
    if kind in ("raised", "collective"):
        traceback.print_exc(file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    # no atexit, no destroy_process_group: either can wait on the ranks this one is leaving
    os._exit(EXIT_USAGE if kind == "usage" else EXIT_FAILED)


def fit_claim(setup: DistSetup, caps: Any) -> DistSetup:
    """The run's page size and head dim moved inside the backend's claim, where it has one.

    A backend that claims no page size 16 or head dim 32 is not wrong: the run
    takes the claimed value nearest to them instead of refusing it.
    """
    changes = {}
    for name, claim in (("page_size", caps.page_sizes), ("head_dim", caps.head_dims)):
        wanted = getattr(setup, name)
        if claim is not None and claim and wanted not in claim:
            changes[name] = min(claim, key=lambda v: (abs(v - wanted), v))
    return replace(setup, **changes) if changes else setup


class RankLoop:
    """The engine loop of one rank; rank 0 also checks the group."""

    def __init__(self, args: argparse.Namespace, rank: int, dp_size: int, beat: Heartbeat) -> None:
        from harness.registry import DPBackendConfig, default_registry, instantiate_backend

        self.args, self.rank, self.beat = args, rank, beat
        self.setup = DistSetup(
            dp_size=dp_size,
            steps=args.steps,
            seed=args.seed,
            dtype=args.dtype,
            device=_rank_device(args.device, rank),
            graph=args.graph,
        )
        try:
            entry = default_registry().resolve(args.backend)
        except (ValueError, ImportError, LookupError) as exc:
            raise UsageProblem(f"backend {args.backend!r}: {exc}") from exc
        self.entry = entry
        self.setup = fit_claim(self.setup, entry.capabilities)
        self._check_claim(entry)
        s = self.setup

        def make(r: int) -> Any:
            return instantiate_backend(
                entry.cls,
                num_heads=s.num_heads,
                num_kv_heads=s.num_kv_heads,
                head_dim=s.head_dim,
                scale=s.scale,
                dp_config=DPBackendConfig(dp_size, r),
                name=entry.name,
            )

        self.can_pad = bool(entry.capabilities.graph_mode)
        self.schedule = RankSchedule(s, rank)
        self.caches = rank_caches(s, rank, PoolLayout.PER_RANK)
        self.backend = make(rank)
        self.backend.bind_kv_caches(self.caches)
        self.checker = GroupChecker(s, make, can_pad=self.can_pad) if rank == 0 else None
        self.steps: list[dict[str, Any]] = []

    def _check_claim(self, entry: Any) -> None:
        s, caps = self.setup, entry.capabilities
        device = s.device.split(":")[0]
        problems = []
        if not entry.accepts_dp and s.dp_size > 1:
            problems.append("its constructor takes neither dp_size/dp_rank nor **kwargs")
        if s.torch_dtype not in caps.dtypes:
            problems.append(f"it does not claim {s.dtype}")
        if device not in caps.devices:
            problems.append(f"it does not claim device {device!r}")
        for name, value in (("page_sizes", s.page_size), ("head_dims", s.head_dim)):
            claimed = getattr(caps, name)
            if claimed is not None and value not in claimed:
                problems.append(f"{name} {list(claimed)} leaves out {value}")
        if caps.max_dp_size is not None and s.dp_size > caps.max_dp_size:
            problems.append(f"it claims dp_size <= {caps.max_dp_size}")
        if caps.max_seq_len is not None and s.longest > caps.max_seq_len:
            problems.append(f"it claims contexts <= {caps.max_seq_len}, the run needs {s.longest}")
        if problems:
            raise UsageProblem(f"backend {entry.name!r} cannot run this: {'; '.join(problems)}")

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
                    "setup": {
                        k: getattr(self.setup, k)
                        for k in (
                            "steps",
                            "seed",
                            "dtype",
                            "device",
                            "graph",
                            "num_heads",
                            "num_kv_heads",
                            "head_dim",
                            "page_size",
                            "num_layers",
                        )
                    },
                    "padding": "on"
                    if self.can_pad
                    else "off (the backend claims no graph-mode padding)",
                    "seconds": time.perf_counter() - started,
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
        if padded.skipped:
            if self.checker is not None:
                for schedule in self.checker.schedules:
                    schedule.plan(step)
                self.steps.append({"step": step, "counts": counts, "padded": 0, "ranks": []})
                print(f"step {step + 1}/{s.steps}: no rank has tokens; skipped", flush=True)
            return
        beat.beat(step, "forward")
        strike(faults, rank, step + 1)
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
        message: list[Any] = [None]
        if self.checker is not None:
            beat.beat(step, "check")
            assert gathered is not None
            verdicts = self.checker.check(step, counts, gathered)
            message[0] = next((v.problem for v in verdicts if v.problem), None)
            self._record(step, counts, padded.padded_tokens, verdicts)
        beat.beat(step, "verdict")
        dist.broadcast_object_list(message, src=0)
        if message[0] is not None:
            raise StepCheckFailed(message[0])

    def _record(
        self, step: int, counts: list[int], padded: int, verdicts: list[RankVerdict]
    ) -> None:
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
        print(
            f"step {step + 1}/{self.setup.steps}: tokens {counts} -> {padded} per rank; "
            f"oracle worst {max(worst, default=0):.3f}x bound, shared pool "
            f"{max(agree, default=0):.3f}x",
            flush=True,
        )


def _kind(exc: BaseException, phase: str) -> str:
    if isinstance(exc, DPMetadataError):
        return "dp-metadata"
    if isinstance(exc, StepCheckFailed):
        return "check"
    if isinstance(exc, UsageProblem):
        return "usage"
    if phase in ("exchange", "gather", "verdict", "barrier", "init"):
        return "collective"
    return "raised"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
    """Build this rank's loop; if any rank cannot, every rank raises that rank's reason."""
    loop, problem = None, None
    try:
        loop = RankLoop(args, rank, dp_size, beat)
    except UsageProblem as exc:
        problem = f"rank {rank}: {exc}"
    except Exception as exc:  # a constructor or bind that raised: named, then shared
        problem = f"rank {rank}: setting up the backend raised {type(exc).__name__}: {exc}"
    beat.beat(-1, "exchange")
    problems: list[Any] = [None] * dp_size
    dist.all_gather_object(problems, problem)
    first = next((p for p in problems if p), None)
    if first is not None:
        raise UsageProblem(first)
    assert loop is not None
    return loop


if __name__ == "__main__":
    sys.exit(main())
