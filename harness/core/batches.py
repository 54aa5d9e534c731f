"""Build step metadata for one DP rank: decode, prefill, extend, mixed, padded.

A ``BatchBuilder`` owns the sequences of one rank. Each ``step`` grows the
named sequences by their query lengths, allocates pages from the rank's
range, and returns the ``AttentionMetadata`` a real engine would produce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from harness.core.contract import AttentionMetadata
from harness.core.kv_pages import PagePool, pages_needed, token_slots


@dataclass
class SequenceState:
    """One sequence's pages and how many of its tokens are already cached."""

    seq_id: int
    pages: list[int] = field(default_factory=list)
    cached_len: int = 0


@dataclass(frozen=True)
class StepRow:
    """One row of a built step: which sequence, its context and new tokens."""

    seq_id: int | None  # None for a graph-mode padding row
    seq_len: int
    query_len: int
    pages: tuple[int, ...]


@dataclass(frozen=True)
class Step:
    """A built step: the metadata and the host-side view that produced it."""

    metadata: AttentionMetadata
    rows: tuple[StepRow, ...]

    @property
    def num_tokens(self) -> int:
        return sum(row.query_len for row in self.rows)


class BatchBuilder:
    """Sequences of one DP rank over a shared ``PagePool``."""

    def __init__(self, pool: PagePool, rank: int, page_size: int) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        pool.rank_range(rank)  # validates the rank
        self.pool = pool
        self.rank = rank
        self.page_size = page_size
        self.sequences: dict[int, SequenceState] = {}
        self._next_id = 0

    def admit(self) -> int:
        """Start a new, empty sequence; returns its id."""
        seq_id = self._next_id
        self._next_id += 1
        self.sequences[seq_id] = SequenceState(seq_id)
        return seq_id

    def fork(self, parent: int, prefix_len: int) -> int:
        """A new sequence sharing ``parent``'s first ``prefix_len`` tokens' full pages.

        Only whole pages are shared (as prefix caches do), so the child starts
        with ``prefix_len`` rounded down to a page boundary cached.
        """
        source = self.sequences[parent]
        if not 0 <= prefix_len <= source.cached_len:
            raise ValueError(f"prefix_len {prefix_len} outside [0, {source.cached_len}]")
        shared = source.pages[: prefix_len // self.page_size]
        self.pool.retain(shared)
        seq_id = self.admit()
        child = self.sequences[seq_id]
        child.pages = list(shared)
        child.cached_len = len(shared) * self.page_size
        return seq_id

    def release(self, seq_id: int) -> None:
        """Finish a sequence and return its pages to the pool."""
        state = self.sequences.pop(seq_id)
        self.pool.free(state.pages)

    def step(
        self,
        requests: Sequence[tuple[int, int]],
        *,
        causal: bool = True,
        pad_to: int | None = None,
        pad_query_len: int = 1,
        device: str | torch.device = "cpu",
    ) -> Step:
        """Metadata for ``(seq_id, query_len)`` requests, then mark their tokens cached.

        ``pad_to`` appends graph-mode padding rows (``seq_len`` 0, block row
        and slots of -1, ``pad_query_len`` tokens each) up to that batch size;
        a pool with padding pages pads as engines' captured graphs do instead
        (``seq_len`` 1 over the rank's padding page, one token, slot -1).
        Pages for all requests are allocated before anything changes, so an
        ``OutOfPages`` leaves the builder as it was.
        """
        if len({seq_id for seq_id, _ in requests}) != len(requests):
            raise ValueError("a sequence appears twice in one step")
        if pad_to is not None and pad_to < len(requests):
            raise ValueError(f"pad_to {pad_to} is smaller than the batch ({len(requests)} rows)")
        needs = []
        for seq_id, query_len in requests:
            if query_len < 1:
                raise ValueError(f"query_len of sequence {seq_id} must be >= 1, got {query_len}")
            state = self.sequences[seq_id]
            new_len = state.cached_len + query_len
            needs.append(max(0, pages_needed(new_len, self.page_size) - len(state.pages)))
        fresh = self.pool.allocate(self.rank, sum(needs))
        rows = []
        for (seq_id, query_len), need in zip(requests, needs, strict=True):
            state = self.sequences[seq_id]
            state.pages.extend(fresh[:need])
            del fresh[:need]
            state.cached_len += query_len
            rows.append(StepRow(seq_id, state.cached_len, query_len, tuple(state.pages)))
        padding = 0 if pad_to is None else pad_to - len(rows)
        page = self.pool.padding_page(self.rank)
        pad = StepRow(None, 0, pad_query_len, ()) if page is None else StepRow(None, 1, 1, (page,))
        rows.extend(pad for _ in range(padding))
        return Step(build_metadata(rows, self.page_size, causal=causal, device=device), tuple(rows))


def build_metadata(
    rows: Sequence[StepRow],
    page_size: int,
    *,
    causal: bool = True,
    device: str | torch.device = "cpu",
) -> AttentionMetadata:
    """The ``AttentionMetadata`` for rows whose new tokens are their last ``query_len``."""
    width = max((len(row.pages) for row in rows), default=0)
    starts = [0]
    table = []
    slots: list[int] = []
    for row in rows:
        starts.append(starts[-1] + row.query_len)
        table.append(list(row.pages) + [-1] * (width - len(row.pages)))
        if row.seq_id is None:
            slots.extend([-1] * row.query_len)
        else:
            positions = range(row.seq_len - row.query_len, row.seq_len)
            slots.extend(token_slots(row.pages, positions, page_size))
    return AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor([row.seq_len for row in rows], dtype=torch.int32, device=device),
        block_table=torch.tensor(table, dtype=torch.int32, device=device).reshape(len(rows), width),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max((row.query_len for row in rows), default=0),
        max_seq_len=max((row.seq_len for row in rows), default=0),
        causal=causal,
    )
