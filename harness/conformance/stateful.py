"""A hypothesis state machine that drives one backend per rank through many steps.

Sequences are admitted to ranks, prefilled in chunks, decoded (one token
a step, or the same 2-8 drafted tokens for every request, as a
speculative-decoding verify step feeds them), forked to share prefix pages,
and released (their pages re-used by sequences admitted
later). Every rule ends in a forward step, and pools are sized so that a
step never runs out of pages, so each run is a real program rather than a
few idle draws. Runs are small or of a production shape
(``harness.conformance.stateful_shapes``). After every step, each layer's output is checked against
the float64 oracle over the full token history, and the cache against a
canary (``harness.conformance.rank_steps``).

Each run reports what it did (forward steps, rules reached, rules skipped)
through ``on_run``, and each step's shape through ``on_step``, so the suite
can count them.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TypeVar

import torch
from hypothesis import note
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from harness.conformance.claim_coverage import StatefulRun, claim_summary
from harness.conformance.cost_budget import TestCosts, step_work
from harness.conformance.rank_steps import RankSteps
from harness.conformance.stateful_shapes import MAX_LIVE, MAX_STATEFUL_DP, RunShape, run_shapes
from harness.conformance.strategies import Budget, spec_query_lens
from harness.core.batches import BatchBuilder
from harness.core.errors import OutOfPages, PropertyFailure, Unsupported
from harness.core.kv_pages import PagePool, PoolLayout, pages_needed
from harness.core.registry import BackendEntry
from harness.numerics.scenario import Scenario, backend_for, scenario_caches

T = TypeVar("T")
RULES = ("admit", "chunked-prefill", "decode", "fork", "free", "re-admit", "spec-decode")
MAX_NEW_TOKENS = 6
"""Tokens a sequence decodes after its prompt before it finishes (drawn from 1 to this)."""
MIN_RULES = 8
"""Rules every run executes before it may end (each ends in a forward step)."""


def run_machine(machine: type[RuleBasedStateMachine], settings: Settings) -> None:
    """Run ``machine`` as a test, each run at least ``MIN_RULES`` rules long.

    While exploring, hypothesis ends many runs after a rule or two; its own
    ``_min_steps`` knob (the one its test suite uses) keeps every run a real
    program. Should a future hypothesis drop it, runs are shorter, and the
    coverage table's steps-per-run figure shows it.
    """
    floor = min(MIN_RULES, settings.stateful_step_count)
    if "_min_steps" in inspect.signature(run_state_machine_as_test).parameters:
        run_state_machine_as_test(machine, settings=settings, _min_steps=floor)
    else:  # pragma: no cover - a hypothesis without the knob
        run_state_machine_as_test(machine, settings=settings)


def conformance_machine(
    entry: BackendEntry,
    budget: Budget,
    device: str = "cpu",
    *,
    on_step: Callable[[Scenario], None] | None = None,
    on_run: Callable[[StatefulRun], None] | None = None,
    costs: TestCosts | None = None,
    max_steps: int = 1,
) -> type[RuleBasedStateMachine]:
    """A state machine class bound to ``entry``, drawing inside its capabilities.

    One run in three has a production shape
    (``run_shapes``); the rest are small, and shrinking lands there.
    With ``costs`` (a backend that runs interpreted), a step larger than the
    test's step cap (``CostLedger.step_cap``: its part of the budget spread
    over ``max_steps``) is not taken: neither the backend nor the harness's
    model of the pool moves, so every later step stays consistent, and the
    run counts it under ``skipped``.
    """
    caps = entry.capabilities
    max_dp = min(budget.max_dp_size, caps.max_dp_size or budget.max_dp_size, MAX_STATEFUL_DP)
    max_dp = max_dp if entry.accepts_dp else 1

    class BackendSteps(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.ranks: list[RankSteps] = []
            self.run = StatefulRun()
            self.released: set[int] = set()  # ranks that have freed a sequence
            self.finish: dict[tuple[str, int], int] = {}  # length at which a sequence ends

        @initialize(
            shape=run_shapes(caps, budget, device, max_dp),
            layout=st.sampled_from(list(PoolLayout)),
            extra=st.integers(0, 7),
            shuffle=st.booleans(),
            data=st.data(),
        )
        def setup(
            self,
            shape: RunShape,
            layout: PoolLayout,
            extra: int,
            shuffle: bool,
            data: st.DataObject,
        ) -> None:
            g, dp_size = shape.geometry, shape.dp_size
            self.shape = shape
            self.max_context = shape.max_context
            per_rank = MAX_LIVE * pages_needed(self.max_context, g.page_size)
            per_rank += g.reserves_padding_page
            total = per_rank * dp_size + extra % dp_size
            pool = PagePool(
                total,
                dp_size,
                shuffle_seed=0 if shuffle else None,
                padding_pages=g.reserves_padding_page,
            )
            self.group = replace(g, total_pages=total, dp_size=dp_size, layout=layout)
            shared = scenario_caches(self.group) if layout is PoolLayout.SHARED else None
            gen = torch.Generator().manual_seed(total)
            for rank in range(dp_size):
                member = replace(self.group, dp_rank=rank)
                caches = shared or scenario_caches(member)
                backend = self._call(partial(backend_for, entry, member))
                self._call(partial(backend.bind_kv_caches, caches))
                builder = BatchBuilder(pool, rank, g.page_size)
                self.ranks.append(RankSteps(backend, builder, caches, g, gen, f"rank {rank}"))
            note(
                f"geometry: {g.describe()}; pool {total} pages, dp_size {dp_size}, "
                f"{layout.value}{', shuffled' if shuffle else ''}; contexts to "
                f"{self.max_context}{f' ({shape.regime})' if shape.regime else ''}"
            )
            self._admit(self.ranks[0], data)  # every run starts with a step

        def _call(self, fn: Callable[[], T]) -> T:
            """A backend call on input inside its claim: ``Unsupported`` there is a failure."""
            try:
                return fn()
            except Unsupported as exc:
                raise PropertyFailure(
                    f"backend {entry.name!r} raised Unsupported in a stateful run inside its "
                    f"declared capabilities: {exc}\n  claimed vs drawn: "
                    f"{claim_summary(caps, [self.group])}"
                ) from exc

        # -- which ranks a rule can act on ----------------------------------------

        def _growable(self, rank: RankSteps) -> list[int]:
            live = rank.builder.sequences
            return sorted(s for s in live if rank.cached_len(s) < self.max_context)

        def _forkable(self, rank: RankSteps) -> list[int]:
            page = self.group.page_size
            return sorted(s for s in self._growable(rank) if rank.cached_len(s) >= page)

        def _with_room(self) -> list[RankSteps]:
            return [r for r in self.ranks if len(r.builder.sequences) < MAX_LIVE]

        def can_admit(self) -> bool:
            return bool(self._with_room())

        def can_step(self) -> bool:
            return any(self._growable(r) for r in self.ranks)

        def can_fork(self) -> bool:
            return any(self._forkable(r) for r in self._with_room())

        def can_release(self) -> bool:
            return any(r.builder.sequences for r in self.ranks)

        def _decoding(self, rank: RankSteps) -> list[int]:
            """Prefilled sequences with room for at least two more tokens."""
            return [
                s
                for s in self._growable(rank)
                if not rank.pending[s] and self.max_context - rank.cached_len(s) >= 2
            ]

        def can_speculate(self) -> bool:
            return any(self._decoding(r) for r in self.ranks)

        # -- rules: each ends in a forward step --------------------------------------

        @precondition(can_admit)
        @rule(data=st.data())
        def admit(self, data: st.DataObject) -> None:
            self._new_request(data.draw(st.sampled_from(self._with_room()), label="rank"), data)

        def _new_request(self, rank: RankSteps, data: st.DataObject) -> None:
            forkable = bool(self._forkable(rank))
            if forkable and data.draw(st.booleans(), label="prefix cache hit"):
                self._fork(rank, data)  # its prompt starts with a cached prefix
            else:
                self._admit(rank, data)

        def _finish_after(self, rank: RankSteps, seq_id: int, data: st.DataObject) -> None:
            """Its prompt, then a few decoded tokens: then it finishes and its pages are freed."""
            new_tokens = data.draw(st.integers(1, MAX_NEW_TOKENS), label="tokens to generate")
            target = rank.cached_len(seq_id) + rank.pending[seq_id] + new_tokens
            self.finish[rank.name, seq_id] = min(target, self.max_context)

        def _admit(self, rank: RankSteps, data: st.DataObject) -> None:
            index = self.ranks.index(rank)
            self.run.reached.add("re-admit" if index in self.released else "admit")
            prompt = data.draw(self.shape.prompts(), label="prompt")
            seq_id = rank.admit(prompt)
            self._finish_after(rank, seq_id, data)
            self._step(rank, data, include=seq_id)

        @precondition(can_step)
        @rule(data=st.data())
        def step(self, data: st.DataObject) -> None:
            if self.can_speculate() and data.draw(st.integers(0, 2), label="verify") == 0:
                self._speculate(data)  # an engine with a draft model verifies every decode
                return
            rank = data.draw(st.sampled_from([r for r in self.ranks if self._growable(r)]))
            if rank in self._with_room() and data.draw(st.booleans(), label="a request arrives"):
                self._new_request(rank, data)  # as an engine schedules it: with the running ones
            else:
                self._step(rank, data)

        @precondition(can_fork)
        @rule(data=st.data())
        def fork(self, data: st.DataObject) -> None:
            rank = data.draw(st.sampled_from([r for r in self._with_room() if self._forkable(r)]))
            self._fork(rank, data)

        def _fork(self, rank: RankSteps, data: st.DataObject) -> None:
            parent = data.draw(st.sampled_from(self._forkable(rank)), label="parent")
            prefix = data.draw(st.integers(self.group.page_size, rank.cached_len(parent)))
            prompt = data.draw(st.integers(1, 8), label="child prompt")
            child = rank.fork(parent, prefix, prompt)
            rank.pending[child] = min(prompt, self.max_context - rank.cached_len(child))
            self._finish_after(rank, child, data)
            self.run.reached.add("fork")
            self._step(rank, data, include=child)

        @precondition(can_speculate)
        @rule(data=st.data())
        def speculate(self, data: st.DataObject) -> None:
            self._speculate(data)

        def _speculate(self, data: st.DataObject) -> None:
            """A verify step: every decoding request of a rank takes the same 2-8 tokens."""
            rank = data.draw(st.sampled_from([r for r in self.ranks if self._decoding(r)]))
            decoding = self._decoding(rank)
            room = max(self.max_context - rank.cached_len(s) for s in decoding)
            query = min(data.draw(spec_query_lens(), label="draft tokens + 1"), room)
            fits = [s for s in decoding if self.max_context - rank.cached_len(s) >= query]
            requests = [(s, query) for s in fits]
            self.run.reached.add("spec-decode")
            self._take_step(rank, requests, data)

        @precondition(can_release)
        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            rank = data.draw(st.sampled_from([r for r in self.ranks if r.builder.sequences]))
            seq_id = data.draw(st.sampled_from(sorted(rank.builder.sequences)), label="free")
            rank.release(seq_id)  # aborted before it finished
            del self.finish[rank.name, seq_id]
            self.run.reached.add("free")
            self.released.add(self.ranks.index(rank))
            if self._growable(rank):
                self._step(rank, data)
            else:
                self.run.skipped["step after free: no sequence left to grow"] += 1

        def _step(self, rank: RankSteps, data: st.DataObject, include: int | None = None) -> None:
            others = [s for s in self._growable(rank) if s != include]
            if include is None:
                ids = data.draw(st.lists(st.sampled_from(others), min_size=1, unique=True))
            elif others:
                ids = [include, *data.draw(st.lists(st.sampled_from(others), unique=True))]
            else:
                ids = [include]
            requests = []
            for seq_id in ids:
                pending = rank.pending[seq_id]
                room = self.max_context - rank.cached_len(seq_id)
                if pending:  # prefill: the whole prompt, or a chunk of it
                    whole = data.draw(st.booleans(), label="whole prompt")
                    chunk = self.shape.chunks(min(pending, room))
                    query = min(pending, room) if whole else data.draw(chunk, label="chunk")
                    if query < pending:
                        self.run.reached.add("chunked-prefill")
                else:
                    query = 1
                    self.run.reached.add("decode")
                requests.append((seq_id, query))
            self._take_step(rank, requests, data)

        def _take_step(
            self, rank: RankSteps, requests: list[tuple[int, int]], data: st.DataObject
        ) -> None:
            """One forward step of ``requests`` (graph-padded when drawn), then finish the done."""
            pad_to = None
            if caps.graph_mode and data.draw(st.booleans(), label="graph"):
                pad_to = len(requests) + data.draw(st.integers(0, 2))
            g = self.group
            queries = [q for _, q in requests]
            contexts = [rank.cached_len(s) + q for s, q in requests]
            work = step_work(g.num_layers, g.num_heads, queries, contexts, caps.query_tile)
            shown = f"queries {queries}"
            if costs is not None and not costs.admit_step(work, shown, max_steps):
                self.run.skipped["step: over the interpreted budget"] += 1
                return
            start = time.perf_counter()
            try:
                built = self._call(partial(rank.step, requests, pad_to=pad_to))
            except OutOfPages:
                self.run.skipped["step: rank out of pages"] += 1
                return
            if costs is not None:
                costs.charge(work, time.perf_counter() - start)
            self.run.steps += 1
            for seq_id, _ in requests:
                if rank.cached_len(seq_id) >= self.finish[rank.name, seq_id]:
                    rank.release(seq_id)  # finished: an engine frees it at once
                    del self.finish[rank.name, seq_id]
                    self.run.reached.add("free")
                    self.released.add(self.ranks.index(rank))
            if on_step is not None:
                rows = [row for row in built.rows if row.seq_id is not None]
                on_step(
                    replace(
                        self.group,
                        dp_rank=self.ranks.index(rank),
                        context_lens=tuple(row.seq_len for row in rows),
                        query_lens=tuple(row.query_len for row in rows),
                        pad_to=pad_to,
                    )
                )

        def teardown(self) -> None:
            # hypothesis also starts runs it abandons (a draw past its buffer, a
            # replayed prefix that no longer fits); only a run that finished counts
            finished = sys.exc_info()[1] is None
            if on_run is not None and self.ranks and finished:
                on_run(self.run)

    BackendSteps.__name__ = f"BackendSteps[{entry.name}]"
    return BackendSteps
