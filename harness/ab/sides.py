"""Where each side's backend comes from: a spec, at this checkout or at a git revision.

A side is a backend spec (a built-in's name, ``package.module:Class`` or
``path/file.py:Class``) and, optionally, a git revision of this project:
``revision_checkout`` puts that revision in a temporary worktree (``git
worktree add --detach``), removed afterwards, and the side's worker loads
the backend packages and relative file specs from there
(``harness.ab.worker``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from harness.processes.supervisor import Child

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class SideError(RuntimeError):
    """A side cannot be set up: the message names the side and why."""


@dataclass(frozen=True)
class SideSpec:
    """One side of a comparison: what to load and from which revision."""

    label: str  # "base" or "candidate"
    backend: str
    revision: str | None = None  # a git revision of the project; None: this checkout
    commit: str | None = None  # the revision's full hash, once resolved

    def describe(self) -> str:
        at = f" at {self.revision} ({self.commit[:10]})" if self.revision and self.commit else ""
        return f"{self.backend}{at}"

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "revision": self.revision, "commit": self.commit}


def run_git(*args: str, cwd: Path = PROJECT_ROOT) -> str:
    """`git ARGS` in `cwd`, its output stripped; a failure is a `SideError` naming the command."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SideError(f"git {' '.join(args)}: {exc}") from exc
    if done.returncode != 0:
        raise SideError(f"git {' '.join(args)}: {done.stderr.strip() or 'failed'}")
    return done.stdout.strip()


def resolve_revision(revision: str, cwd: Path = PROJECT_ROOT) -> str:
    """The full commit hash of ``revision`` in the repository at ``cwd`` (this project's)."""
    return run_git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}", cwd=cwd)


def head_commit() -> str | None:
    """This checkout's commit (None outside a git repository): recorded with the results."""
    try:
        return run_git("rev-parse", "HEAD")
    except SideError:
        return None


@contextmanager
def revision_checkout(commit: str) -> Iterator[Path]:
    """A temporary worktree of ``commit``, removed (with its git bookkeeping) afterwards."""
    with tempfile.TemporaryDirectory(prefix="attn-harness-ab-") as tmp:
        path = Path(tmp) / "checkout"
        run_git("worktree", "add", "--detach", "--quiet", str(path), commit)
        try:
            yield path
        finally:
            try:
                run_git("worktree", "remove", "--force", str(path))
            except SideError:
                run_git("worktree", "prune")


@dataclass(frozen=True)
class WorkerSettings:
    """How every worker process of a comparison runs: the same for both sides.

    ``cpus`` pins each worker to those CPUs while it times (never while it
    builds a case, so both sides build at once). On this 2-core machine an
    unpinned worker's rounds of a decode case spread 9-17% between fresh
    pairs, pinned ones 3-12% (likely because the two cores meet different
    neighbours, and an unpinned side times on either).
    """

    device: str = "cpu"
    threads: int | None = None  # torch's threads a side; None: torch's default
    cpus: tuple[int, ...] | None = None  # None: not pinned

    def arguments(self) -> list[str]:
        """The worker's command-line options for these settings."""
        args = ["--device", self.device]
        if self.threads is not None:
            args += ["--threads", str(self.threads)]
        if self.cpus is not None:
            args += ["--cpus", ",".join(map(str, self.cpus))]
        return args


STATUS_OPS = frozenset({"prepare", "load"})
"""Requests whose error is a case's status (the reply says it), not a broken worker."""


class SideProcess:
    """A running ``harness.ab.worker`` for one side: requests in, replies out, one at a time."""

    def __init__(self, side: SideSpec, *, root: Path | None, settings: WorkerSettings) -> None:
        command = [sys.executable, "-m", "harness.ab.worker", "--backend", side.backend]
        command += settings.arguments()
        if root is not None:
            command += ["--root", str(root)]
        self.side = side
        self.child = Child(
            command,
            cwd=PROJECT_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the backend's own output, as a bench run shows it
            text=True,
        )
        self.backend_class: str = ""
        self.source: str | None = None

    def handshake(self) -> None:
        """Wait for the worker's first line: its backend loaded, or why not."""
        hello = self._read()
        if "error" in hello:
            self.close()
            raise SideError(f"{self.side.label} ({self.side.describe()}): {hello['error']}")
        self.backend_class = hello.get("backend_class", "")
        self.source = hello.get("source")

    def _read(self) -> dict[str, Any]:
        stdout: IO[str] | None = self.child.process.stdout
        line = stdout.readline() if stdout is not None else ""
        if not line:
            code = self.child.process.wait()
            raise SideError(f"{self.side.label}'s worker process ended (exit status {code})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        self.send(op, **fields)
        return self.receive(op)

    def send(self, op: str, **fields: Any) -> None:
        """Send a request without waiting: the worker starts on it while the caller goes on."""
        stdin = self.child.process.stdin
        if stdin is None:
            raise SideError(f"{self.side.label}'s worker is closed")
        try:
            stdin.write(json.dumps({"op": op, **fields}) + "\n")
            stdin.flush()
        except BrokenPipeError as exc:
            raise SideError(f"{self.side.label}'s worker process ended") from exc

    def receive(self, op: str) -> dict[str, Any]:
        """The reply to the request ``op`` sent last (an error of a non-status op raises)."""
        reply = self._read()
        if op not in STATUS_OPS and "error" in reply:
            raise SideError(f"{self.side.label} ({self.side.describe()}): {reply['error']}")
        return reply

    def close(self, *, at_once: bool = False) -> None:
        """End the worker: it leaves when its input closes (after the request it is on),
        or is stopped with its process group at once (Ctrl-C) or after 30 s."""
        if self.child.process.stdin is not None and not self.child.process.stdin.closed:
            with suppress(BrokenPipeError):
                self.child.process.stdin.close()
        if at_once or self.child.wait(timeout=30) is None:
            self.child.stop()


class SidePair:
    """Both sides' workers, started together and started afresh on request.

    A process keeps one memory layout, one set of allocator and cache
    states, one placement of its threads; measured on this machine, that
    alone made one side of an A/A run 9-14% slower on some cases, for the
    whole run. ``attn-harness ab`` therefore times every round in a fresh
    pair (``harness.ab.rounds``), so such a bias varies from round to
    round, where the test sees it as spread, instead of passing for a change.
    """

    def __init__(
        self,
        specs: dict[str, SideSpec],
        roots: dict[str, Path | None],
        settings: WorkerSettings,
    ) -> None:
        self.specs, self.roots, self.settings = specs, roots, settings
        self.sides: dict[str, SideProcess] = {}
        self.started = 0  # pairs started so far

    def start(self) -> dict[str, SideProcess]:
        """Close the running pair, if any, and start a new one (both workers load at once)."""
        self.close()
        spawned: dict[str, SideProcess] = {}
        self.sides = spawned  # closed by close() even if a handshake below fails
        for label, spec in self.specs.items():
            root = self.roots[label]
            spawned[label] = SideProcess(spec, root=root, settings=self.settings)
        for side in spawned.values():
            side.handshake()
        self.started += 1
        return spawned

    def close(self, *, at_once: bool = False) -> None:
        for side in self.sides.values():
            side.close(at_once=at_once)
        self.sides = {}
