"""One side of a paired comparison: a process that checks and times its backend on request.

    python -m harness.ab.worker --backend SPEC [--root DIR] [--device cpu] [--threads N]
        [--cpus 0,1]

Each side runs in its own process so that two revisions of one backend (the
same module names, different code) never share an interpreter. ``--root``
is a checkout of another revision of the project (``harness.ab.sides``):
its backend packages (``reference_backends``, ``suites``) and relative
file specs are taken from there, while this process's ``harness``, the kit
both sides are checked and timed with, stays this revision's.

The coordinator (``harness.ab.rounds``) writes one JSON request per line on
stdin and reads one JSON reply per line; the backend's own prints go to
stderr, so they cannot break the protocol. Requests:

- ``{"op": "prepare", "workload": NAME, "case": CASE, "size": SIZE}``: build
  the case's inputs (seeded: both sides build the same ones), check the
  backend against the float64 oracle; reply with the status (only a
  ``PASSED`` case can be timed);
- ``{"op": "load", "workload": NAME, "case": CASE, "size": SIZE}``: the
  same inputs and a timing instance, without the oracle check (a fresh
  process for a round of a case ``prepare`` already passed); reply as
  ``prepare`` does (``PASSED``, or the status and error of what failed);
- ``{"op": "time", "key": KEY, "samples": K, "warmup": W, "cold_cache": B}``:
  K timed forwards after W warm-up ones; reply with the raw samples (ns);
- ``{"op": "drop", "key": KEY}``: free a case;
- ``{"op": "describe"}``: the backend's class and source file.

End of input ends the process.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

BACKEND_PACKAGES = ("reference_backends", "suites")
"""The project's packages that hold backends: taken from ``--root`` when it is given."""


def use_root(root: Path) -> None:
    """Load the backend packages from ``root`` (another revision's checkout) from now on."""
    sys.path.insert(0, str(root))
    for name in list(sys.modules):
        if name.split(".", 1)[0] in BACKEND_PACKAGES:
            del sys.modules[name]
    os.chdir(root)  # relative file specs name files of that revision


@contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """Every thread of this process on ``cpus`` alone for the block, then as before.

    Each thread is pinned by its id: the affinity of ``pid 0`` is the calling
    thread's alone, and torch's intra-op threads already exist.
    """
    if cpus is None:
        yield
        return
    threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    before = {tid: os.sched_getaffinity(tid) for tid in threads}
    for tid in threads:
        os.sched_setaffinity(tid, cpus)
    try:
        yield
    finally:
        for tid, mask in before.items():
            with suppress(OSError):  # a thread that has ended since
                os.sched_setaffinity(tid, mask)


class Side:
    """The backend of one side and the cases it has prepared."""

    def __init__(self, spec: str, device: str, cpus: set[int] | None = None) -> None:
        from harness.core.registry import default_registry

        self.entry = default_registry().resolve(spec)
        self.device = device
        self.cpus = cpus  # pinned to these while timing (None: not pinned)
        self.cases: dict[str, tuple[Any, Any]] = {}
        self._flusher: Callable[[], None] | None = None  # made once: 2x the LLC, 30 ms here

    def describe(self) -> dict[str, Any]:
        import inspect

        from harness.core.registry import class_label

        try:
            source = inspect.getsourcefile(self.entry.cls)
        except TypeError:
            source = None
        return {"backend_class": class_label(self.entry.cls), "source": source}

    def prepare(self, workload: str, case: str, size: str, check: bool = True) -> dict[str, Any]:
        from harness.bench.case_check import (
            check_backend,
            describe,
            prepare_case,
            timing_instance,
        )
        from harness.bench.workloads import get_workload

        found = get_workload(workload)
        specs = {spec.name: spec for spec in found.cases(size)}
        if case not in specs:
            return {"status": "RUNTIME_ERROR", "error": f"no case {case!r} in {found.key}"}
        try:
            prepared = prepare_case(found, specs[case], self.device)
        except Exception as exc:  # e.g. out of memory
            return {"status": "RUNTIME_ERROR", "error": f"building the inputs: {describe(exc)}"}
        checked = (check_backend if check else timing_instance)(self.entry, prepared)
        key = f"{found.key}/{case}"
        if checked.timed is not None:
            self.cases[key] = (prepared, checked.target(prepared))
        # What exists now lives until the worker ends: keep it out of the collection
        # ``measure`` makes before each round (80 ms with torch loaded, here; freezing
        # without collecting first costs nothing, and leaves a few cycles uncollected).
        gc.freeze()
        verdict = checked.verdict
        return {"key": key, "status": verdict.status, "error": verdict.error}

    def time(self, key: str, samples: int, warmup: int, cold_cache: bool) -> dict[str, Any]:
        from harness.bench.fresh_inputs import case_pool
        from harness.bench.timed_checks import TimedCalls, call_plan
        from harness.bench.timing import CacheFlusher, TimingConfig, measure

        prepared, target = self.cases[key]
        if cold_cache and self._flusher is None:
            self._flusher = CacheFlusher(self.device)
        config = TimingConfig(
            warmup=warmup,
            min_samples=samples,
            max_samples=samples,
            budget_s=math.inf,
            target_rel_ci=0.0,
            cold_cache=cold_cache,
        )
        flusher = self._flusher if cold_cache else None
        # fresh inputs for every call, each compared with the call before it, one reading an
        # earlier one's inputs again (``harness.bench.timed_checks``); no oracle: each round's
        # process rebuilds inputs this code already passed on, and recomputing it every
        # round would be most of a round's time
        dtype = prepared.inputs.queries[0].dtype
        plan = call_plan(prepared.spec.seed, warmup, samples, checked=0)
        calls = TimedCalls(case_pool(prepared, config), target, plan, dtype, oracle=False)
        with pinned(self.cpus):
            measured = measure(
                target, device=self.device, config=config, flusher=flusher, hooks=calls
            )
        calls.judge_repeat(measured.samples_ns, warmup)
        if calls.problem is not None:
            return {"error": f"{calls.problem.status}: {calls.problem.cause}"}
        return {"samples_ns": list(measured.samples_ns)}

    def drop(self, key: str) -> dict[str, Any]:
        self.cases.pop(key, None)
        return {}


def serve(side: Side, requests: IO[str], replies: IO[str]) -> None:
    """Answer each request line with one reply line until the input ends."""
    for line in requests:
        request = json.loads(line)
        op = request.pop("op")
        try:
            if op == "describe":
                reply = side.describe()
            elif op == "prepare":
                reply = side.prepare(**request)
            elif op == "load":
                reply = side.prepare(**request, check=False)
            elif op == "time":
                reply = side.time(**request)
            elif op == "drop":
                reply = side.drop(**request)
            else:
                reply = {"error": f"unknown request {op!r}"}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True)
    parser.add_argument("--root", type=Path, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cpus", default=None, help="comma-separated CPUs to time on")
    args = parser.parse_args(argv)
    replies = os.fdopen(os.dup(1), "w")  # the protocol's own copy of stdout
    os.dup2(2, 1)  # anything else printed, by the backend or a library, goes to stderr
    sys.stdout = sys.stderr
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.root is not None:
        use_root(args.root.resolve())
    try:
        cpus = {int(cpu) for cpu in args.cpus.split(",")} if args.cpus else None
        side = Side(args.backend, args.device, cpus)
    except Exception as exc:  # a spec that does not load: the first reply says why
        replies.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        replies.flush()
        return 1
    replies.write(json.dumps({"ready": True, **side.describe()}) + "\n")
    replies.flush()
    serve(side, sys.stdin, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
