"""The watchdog of one host's ranks, judging the whole group's run wherever its ranks run.

gloo's timeout covers collectives only, and a rank killed outright says
nothing, so each host's launcher watches: it polls its ranks' exit codes and
beat files; with several hosts it mirrors them into the rendezvous store and
reads the others' there. The run ends when a rank anywhere exits non-zero,
no rank anywhere has moved for ``timeout`` seconds, a host falls silent, or
another host has claimed a failure; the judgement (``diagnosis``) sees every
rank, so it names the cause, not the collateral, and the first host to
judge claims it for every host. At the end, node 0 (which holds the store)
hands the group's summary to the others and waits until they have read it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.dist.diagnosis import RunFailure, diagnose_exit, diagnose_stall
from harness.dist.progress import read_beat, read_status, read_summary
from harness.dist.rendezvous import NODE_SILENCE_S, NodeLink
from harness.processes.supervisor import Child

POLL_S = 0.05
GRACE_S = 2.0
"""After the first rank fails, how long the others get to fail on their own (and say why)."""
STARTUP_S = 180.0
"""How long ranks may take to import torch and join before the stall timeout applies."""
REMOTE_CAUSE_S = NODE_SILENCE_S + GRACE_S
"""How long a host whose ranks saw only collateral errors waits to hear the cause from the
others (a rank that raised there, or a host gone silent) before naming what it saw."""
MIN_SILENCE_S = 5.0
"""A host is called silent after ``NODE_SILENCE_S``, or the run's timeout if shorter, but
never under this: a launcher on a loaded machine may miss a few polls."""
CLOSE_S = 10.0
"""How long node 0 keeps the store up for the other hosts to read the run's end."""


def _store_errors() -> tuple[type[BaseException], ...]:
    import torch.distributed as dist

    return (dist.DistError,)


class GroupWatch:
    """Watch ``ranks`` (this host's, by global rank) until the group's run ends."""

    def __init__(self, link: NodeLink, ranks: dict[int, Child], run_dir: Path, timeout: float):
        self.link, self.ranks, self.run_dir, self.timeout = link, ranks, run_dir, timeout
        self.dp_size = link.dp_size
        self.hosts = link.plan.nnodes
        self.node = link.plan.node_rank

    # -- while the ranks run ------------------------------------------------------------

    def run(self) -> RunFailure | None:
        """``None`` once this host's ranks all exited 0; else the run's (claimed) failure."""
        try:
            return self._watch()
        except _store_errors() as exc:
            return self._store_lost(exc)

    def _watch(self) -> RunFailure | None:
        last_change = time.monotonic()
        seen: list[Any] = []
        while True:
            codes = self._local_codes()
            claimed = self._mirror(codes)
            if claimed is not None:
                return claimed
            if all(c == 0 for c in codes.values()):
                return None
            if any(c not in (None, 0) for c in codes.values()):
                return self._first_failure()
            silent = self._silent()
            if silent is not None:
                return self._claim(silent)
            now = time.monotonic()
            beats, _, all_codes = self._view()
            marks = [None if b is None else (b.step, b.phase) for b in beats]
            if marks != seen:
                seen, last_change = marks, now
            started = all(b is not None and b.phase not in ("init", "setup") for b in beats)
            if now - last_change > (self.timeout if started else max(self.timeout, STARTUP_S)):
                return self._claim(
                    diagnose_stall(beats, all_codes, now - last_change, self.timeout)
                )
            time.sleep(POLL_S)

    def _local_codes(self) -> dict[int, int | None]:
        return {rank: child.poll() for rank, child in self.ranks.items()}

    def _mirror(self, codes: dict[int, int | None]) -> RunFailure | None:
        """Publish this host's ranks; a failure another host claimed, if any."""
        if self.hosts == 1:
            return None
        link = self.link
        link.tick()
        link.publish(
            {r: read_beat(self.run_dir, r) for r in self.ranks},
            {r: read_status(self.run_dir, r) for r in self.ranks},
            codes,
        )
        return link.failure()

    def _view(self) -> tuple[list[Any], list[Any], list[Any]]:
        """Every rank's beat, status and exit code: this host's from its files, the others'
        as their hosts published them."""
        remote = [r for r in range(self.dp_size) if r not in self.ranks]
        beats, statuses, codes = self.link.view(remote) if remote else ([], [], [])
        found = dict(zip(remote, zip(beats, statuses, codes, strict=True), strict=True))
        for rank, child in self.ranks.items():
            found[rank] = (
                read_beat(self.run_dir, rank),
                read_status(self.run_dir, rank),
                child.poll(),
            )
        ordered = [found[r] for r in range(self.dp_size)]
        return [b for b, _, _ in ordered], [s for _, s, _ in ordered], [c for _, _, c in ordered]

    def _first_failure(self) -> RunFailure:
        """Give the others a moment to say why, then pick the cause, not the collateral."""
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline:
            codes = self._local_codes()
            claimed = self._mirror(codes)
            if claimed is not None:
                return claimed
            if all(c is not None for c in codes.values()):
                break
            time.sleep(POLL_S)
        failure = self._diagnosed()
        if self.hosts > 1 and self._collateral(failure):
            # what failed here broke because of another host: hear its cause
            deadline = time.monotonic() + REMOTE_CAUSE_S
            while time.monotonic() < deadline:
                claimed = self._mirror(self._local_codes())
                if claimed is not None:
                    return claimed
                silent = self._silent()
                if silent is not None:
                    return self._claim(silent)
                failure = self._diagnosed()
                if not self._collateral(failure):
                    break
                time.sleep(POLL_S)
        return self._claim(failure)

    def _diagnosed(self) -> RunFailure:
        beats, statuses, codes = self._view()
        return diagnose_exit(statuses, codes, beats)

    def _collateral(self, failure: RunFailure) -> bool:
        """Whether ``failure`` names only a rank of this host whose collective broke."""
        if failure.rank is None or failure.rank not in self.ranks:
            return False
        status = read_status(self.run_dir, failure.rank)
        return status is None or status.collateral

    def _silent(self) -> RunFailure | None:
        if self.hosts == 1:
            return None
        patience = min(NODE_SILENCE_S, max(self.timeout, MIN_SILENCE_S))
        silent = self.link.silent_nodes(patience)
        if not silent:
            return None
        node = silent[0]
        message = (
            f"node {node} ({self.link.host_of(node)}) stopped answering: its launcher has been "
            f"silent for {patience:g} s (killed, or its machine is gone), and its ranks with it"
        )
        return RunFailure(1, message)

    def _claim(self, failure: RunFailure) -> RunFailure:
        """The run's failure, the same on every host: the first one claimed wins."""
        if self.hosts == 1:
            return failure
        if failure.rank is not None and "(node " not in failure.message:
            where = self.link.where(failure.rank)
            failure = RunFailure(
                failure.code,
                f"{failure.message} [rank {failure.rank} runs on {where}]",
                failure.rank,
                failure.step,
                failure.hung,
            )
        return self.link.claim(failure)

    def _store_lost(self, exc: BaseException) -> RunFailure:
        text = str(exc).strip().splitlines()
        return RunFailure(
            1,
            f"node 0's launcher, which holds the rendezvous at {self.link.address}, is gone "
            f"({text[0] if text else type(exc).__name__}); this host's ranks were stopped",
        )

    # -- after this host's ranks have stopped ---------------------------------------------

    def finish(self, failure: RunFailure | None) -> tuple[RunFailure | None, dict[str, Any] | None]:
        """How the group's run ended, and its summary, once every host knows it."""
        if self.hosts == 1:
            return failure, read_summary(self.run_dir)
        try:
            summary = self._close(failure) if self.node == 0 else self._hear_end(failure)
            return failure or self.link.failure(), summary
        except _store_errors() as exc:
            return failure or self._store_lost(exc), None

    def _close(self, failure: RunFailure | None) -> dict[str, Any] | None:
        """Node 0: wait for every host's ranks to finish, tell them the end, let them read it."""
        others = range(1, self.hosts)
        if failure is None:
            done = self._until(
                lambda: all(self.link.heard(f"done/{n}") for n in others), self.timeout
            )
            if not done and self.link.failure() is None:
                late = [n for n in others if not self.link.heard(f"done/{n}")]
                self._claim(
                    RunFailure(
                        1,
                        f"node {late[0]} ({self.link.host_of(late[0])}) did not report its "
                        f"ranks' end within {self.timeout:g} s of this host's",
                    )
                )
        summary = read_summary(self.run_dir)
        self.link.say("summary", summary)
        self.link.say("end", True)
        self._until(
            lambda: all(self.link.heard(f"closed/{n}") for n in others),
            CLOSE_S,
            stop_on_failure=False,
        )
        return summary

    def _hear_end(self, failure: RunFailure | None) -> dict[str, Any] | None:
        """Another host: say this host's ranks are done, then read node 0's end of the run."""
        if failure is None:
            self.link.say(f"done/{self.node}", True)
        patience = self.timeout + CLOSE_S if failure is None else CLOSE_S
        self._until(lambda: bool(self.link.heard("end")), patience, stop_on_failure=False)
        summary = self.link.heard("summary")
        self.link.say(f"closed/{self.node}", True)
        return summary if isinstance(summary, dict) else None

    def _until(
        self, condition: Callable[[], bool], seconds: float, *, stop_on_failure: bool = True
    ) -> bool:
        """Poll ``condition`` until it holds (True), or a failure is claimed or ``seconds``
        pass (False)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if condition():
                return True
            if stop_on_failure and self.link.failure() is not None:
                return False
            time.sleep(POLL_S)
        return False
