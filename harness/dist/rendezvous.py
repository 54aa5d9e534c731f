"""The run's rendezvous: one TCP store that every host's launcher and every rank joins.

torch.distributed's own ``TCPStore`` is the one rendezvous, on one host or
many (``--nnodes``/``--node-rank``/``--master``, as torchrun names them):
node 0's launcher hosts it at ``--master HOST:PORT`` (one host: a free port
on 127.0.0.1); every rank forms its process group through it
(``group.join_group``, keys under ``group/``); every launcher mirrors its
ranks' beats, statuses and exit codes into it (``launch/``), so any host
can tell the rank that caused a failure from the collateral, wherever that
rank runs, and the first host to judge a failure claims it for all. A
launcher that stops answering (killed, its machine gone) is seen by its
silence; node 0 keeps the store up until every other host has read the end.
"""

from __future__ import annotations

import datetime
import json
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from harness.dist.diagnosis import RunFailure
from harness.dist.progress import Beat, Status

NODE_SILENCE_S = 15.0
"""A host whose launcher has not ticked for this long is gone (its ranks with it)."""


@dataclass(frozen=True)
class NodePlan:
    """This host's place in the run: ``node_rank`` of ``nnodes``, the store at ``host:port``."""

    nnodes: int = 1
    node_rank: int = 0
    host: str = "127.0.0.1"
    port: int = 0  # 0: node 0 takes a free port (one host only: the others could not find it)

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise ValueError(f"--nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank {self.node_rank} is outside 0..{self.nnodes - 1}")
        if self.nnodes > 1 and not 0 < self.port < 65536:
            raise ValueError("--master HOST:PORT needs a port (1-65535) when --nnodes > 1")

    @staticmethod
    def parse_master(text: str) -> tuple[str, int]:
        """``HOST:PORT`` (``[v6]:PORT`` for an IPv6 address)."""
        host, colon, port = text.rpartition(":")
        host = host.strip("[]")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected --master HOST:PORT (port 1-65535), got {text!r}")
        return host, int(port)

    def ranks(self, dp_size: int) -> range:
        """The global ranks this host runs: a balanced, contiguous share of ``dp_size``."""
        return node_ranks(dp_size, self.nnodes, self.node_rank)


def node_ranks(dp_size: int, nnodes: int, node: int) -> range:
    """Ranks of ``node``: ``base + (node < extra)`` of them, numbered across hosts in order."""
    if dp_size < nnodes:
        raise ValueError(f"dp_size {dp_size} < --nnodes {nnodes}: a host would run no rank")
    base, extra = divmod(dp_size, nnodes)
    start = node * base + min(node, extra)
    return range(start, start + base + (node < extra))


def node_of(rank: int, dp_size: int, nnodes: int) -> int:
    return next(n for n in range(nnodes) if rank in node_ranks(dp_size, nnodes, n))


class RendezvousError(RuntimeError):
    """The store cannot be hosted or reached: the run cannot start (exit 2)."""


def _encode(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


class NodeLink:
    """One launcher's side of the store: what it publishes and what it reads of the others."""

    def __init__(self, plan: NodePlan, dp_size: int, connect_s: float) -> None:
        import torch.distributed as dist

        self.plan, self.dp_size = plan, dp_size
        hosting = plan.node_rank == 0
        if not hosting:
            _wait_for_node_0(plan.host, plan.port, connect_s)
        try:
            self.store = dist.TCPStore(
                plan.host,
                plan.port,
                is_master=hosting,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=connect_s),
            )
        except Exception as exc:  # torch raises its own network error types
            doing = "host" if hosting else "reach node 0's"
            raise RendezvousError(
                f"cannot {doing} rendezvous at {plan.host}:{plan.port}: {_first_line(exc)}"
            ) from None
        self.port = int(self.store.port) if hosting else plan.port
        self.hostname = socket.gethostname()
        self._published: dict[str, str] = {}
        self._ticks: dict[int, tuple[int, float]] = {}
        self.say(f"host/{plan.node_rank}", self.hostname)

    @property
    def address(self) -> str:
        return f"{self.plan.host}:{self.port}"

    def init_url(self) -> str:
        """What the ranks are told (``ATTN_HARNESS_DIST_INIT``): join through this store."""
        return f"store://{self.address}"

    # -- what this host says --------------------------------------------------------------

    def tick(self) -> None:
        self.store.add(f"launch/alive/{self.plan.node_rank}", 1)

    def publish(
        self,
        beats: Mapping[int, Beat | None],
        statuses: Mapping[int, Status | None],
        codes: Mapping[int, int | None],
    ) -> None:
        """This host's ranks as their files and processes show them (only what changed)."""
        for rank, beat in beats.items():
            self._put(f"launch/beat/{rank}", None if beat is None else asdict(beat))
        for rank, status in statuses.items():
            self._put(f"launch/status/{rank}", None if status is None else asdict(status))
        for rank, code in codes.items():
            self._put(f"launch/code/{rank}", code)

    def _put(self, key: str, value: Any) -> None:
        text = _encode(value)
        if self._published.get(key) != text:
            self.store.set(key, text)
            self._published[key] = text

    def claim(self, failure: RunFailure) -> RunFailure:
        """The run's failure: this one, unless another host claimed one first (theirs wins)."""
        text = _encode(asdict(failure))
        won = self.store.compare_set("launch/failure", "", text)
        return _failure(won)

    def say(self, key: str, value: Any) -> None:
        self.store.set(f"launch/{key}", _encode(value))

    # -- what the others said -------------------------------------------------------------

    def failure(self) -> RunFailure | None:
        return _failure(self.store.get("launch/failure")) if self._has("failure") else None

    def heard(self, key: str) -> Any:
        """A value another host said (``None`` when not yet)."""
        return json.loads(self.store.get(f"launch/{key}")) if self._has(key) else None

    def _has(self, key: str) -> bool:
        return bool(self.store.check([f"launch/{key}"]))

    def view(self, ranks: Sequence[int]) -> tuple[list[Any], list[Any], list[Any]]:
        """Every rank's (beat, status, exit code) as its host last published them."""
        beats, statuses, codes = [], [], []
        for rank in ranks:
            beat = self.heard(f"beat/{rank}")
            status = self.heard(f"status/{rank}")
            beats.append(None if beat is None else Beat(**beat))
            statuses.append(None if status is None else Status(**status))
            codes.append(self.heard(f"code/{rank}"))
        return beats, statuses, codes

    def silent_nodes(self, patience: float = NODE_SILENCE_S) -> list[int]:
        """Other hosts whose launcher has not ticked for ``patience`` seconds (it once had)."""
        now, silent = time.monotonic(), []
        for node in range(self.plan.nnodes):
            if node == self.plan.node_rank:
                continue
            count = int(self.store.add(f"launch/alive/{node}", 0))
            seen, since = self._ticks.get(node, (-1, now))
            if count != seen:
                self._ticks[node] = (count, now)
            elif count > 0 and now - since > patience:
                silent.append(node)
        return silent

    def host_of(self, node: int) -> str:
        return str(self.heard(f"host/{node}") or "?")

    def where(self, rank: int) -> str:
        """``node N (HOST)`` of a rank, for messages."""
        node = node_of(rank, self.dp_size, self.plan.nnodes)
        return f"node {node} ({self.host_of(node)})"

    def close(self) -> None:
        del self.store


def _wait_for_node_0(host: str, port: int, seconds: float) -> None:
    """Until node 0's store answers at ``host:port``, at most ``seconds``.

    A plain socket, tried every half second: Ctrl-C stops the wait at once
    (torch's own connect retries inside C++ and outlasts an interrupt), and a
    host started before node 0 (schedulers start hosts in any order) waits quietly.
    """
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((host, port), timeout=2.0):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise RendezvousError(
                    f"node 0's rendezvous at {host}:{port} did not answer within {seconds:g} s "
                    f"({exc.strerror or exc}): start node 0 (--node-rank 0) with the same "
                    "--master, or check the address and that the port is open"
                ) from None
        time.sleep(0.5)


def _failure(text: bytes | str) -> RunFailure:
    return RunFailure(**json.loads(text))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
