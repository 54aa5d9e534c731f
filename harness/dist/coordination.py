"""DP coordination as engines do it: token counts exchanged, padded to the group's maximum.

Every step each rank reports how many query tokens it holds. The group pads
every rank's batch to the largest count (in graph mode, to the smallest
captured size that holds it), so all ranks run the same shape together; a
rank with nothing to do runs a dummy batch of padding. These functions are
pure: ``harness.dist.worker`` calls them on what the collectives returned, so
every rank computes the same answer, or raises the same error, from the same
gathered data, and none is left waiting in a later collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SMALL_GRAPH_SIZES = (1, 2, 4, 8)
GRAPH_SIZE_STEP = 16
"""Captured batch sizes: 1, 2, 4, 8, then every multiple of 16 (as vLLM and SGLang capture)."""


class DPMetadataError(ValueError):
    """The group's token counts are inconsistent; every rank raises the same one.

    ``culprit`` is the rank whose report was bad.
    """

    def __init__(self, message: str, culprit: int | None = None) -> None:
        super().__init__(message)
        self.culprit = culprit


def captured_size(num_tokens: int) -> int:
    """The smallest captured graph size holding ``num_tokens`` (>= 1) tokens."""
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens must be an int >= 1, got {num_tokens!r}")
    for size in SMALL_GRAPH_SIZES:
        if num_tokens <= size:
            return size
    return -(-num_tokens // GRAPH_SIZE_STEP) * GRAPH_SIZE_STEP


@dataclass(frozen=True)
class CountReport:
    """What one rank puts into the step's exchange.

    ``counts`` is the rank's DP metadata as an engine holds it: a list with
    one entry per rank, its own entry set, the others zero (summed over the
    group, it becomes every rank's count). ``actual`` is how many tokens the
    rank's batch really holds, sent beside it so a false claim is caught.
    """

    rank: int
    counts: tuple[int, ...]
    actual: int

    @classmethod
    def honest(cls, rank: int, dp_size: int, tokens: int) -> CountReport:
        counts = [0] * dp_size
        counts[rank] = tokens
        return cls(rank, tuple(counts), tokens)


def group_counts(reports: Sequence[CountReport], dp_size: int, step: int) -> list[int]:
    """Every rank's token count for ``step`` (as shown, from 1), or ``DPMetadataError``.

    Checks, in rank order: one report per rank; a count list of ``dp_size``
    entries; no negative count; no count for another rank; and a rank's
    count equal to the tokens its batch holds (a claim of more, or fewer,
    would pad the group wrongly or drop tokens).
    """
    where = f"step {step}: bad DP metadata"
    ranks = sorted(r.rank for r in reports)
    if ranks != list(range(dp_size)):
        raise DPMetadataError(
            f"{where}: reports came from ranks {ranks}, expected 0..{dp_size - 1}"
        )
    totals = [0] * dp_size
    for report in sorted(reports, key=lambda r: r.rank):
        rank, counts = report.rank, report.counts
        if len(counts) != dp_size:
            raise DPMetadataError(
                f"{where} from rank {rank}: its token-count list has {len(counts)} entries, "
                f"expected one per rank (dp_size={dp_size})",
                rank,
            )
        negative = [i for i, n in enumerate(counts) if n < 0]
        if negative:
            raise DPMetadataError(
                f"{where} from rank {rank}: negative token count {counts[negative[0]]} "
                f"for rank {negative[0]}",
                rank,
            )
        foreign = [i for i, n in enumerate(counts) if n and i != rank]
        if foreign:
            raise DPMetadataError(
                f"{where} from rank {rank}: it sets the count of rank {foreign[0]}; "
                "a rank reports only its own tokens",
                rank,
            )
        if counts[rank] != report.actual:
            claim = "more" if counts[rank] > report.actual else "fewer"
            raise DPMetadataError(
                f"{where} from rank {rank}: it claims {counts[rank]} tokens but its batch "
                f"holds {report.actual} ({claim} than it has)",
                rank,
            )
        totals = [a + b for a, b in zip(totals, counts, strict=True)]
    return totals


@dataclass(frozen=True)
class PaddedStep:
    """How one step runs across the group: its padded size and this rank's padding."""

    counts: tuple[int, ...]
    padded_tokens: int  # this rank's batch holds this many tokens (padding included)
    padding: int  # this rank's padding tokens, one padding row each
    graph_mode: bool  # what ``prepare`` is told: graph mode, or padding rows present

    @property
    def skipped(self) -> bool:
        """No rank has tokens: the whole group skips the step (an idle rank alone never does)."""
        return max(self.counts, default=0) == 0


def pad_step(counts: Sequence[int], rank: int, *, graph: bool, can_pad: bool = True) -> PaddedStep:
    """Pad ``rank``'s batch to the group maximum (graph mode: its captured size).

    When no rank has tokens the group skips the step, as engines do. A
    backend that cannot take padding rows (``can_pad=False``) runs its own
    batch unpadded; an idle rank then runs no ``forward`` but still takes part
    in the step's collectives.
    """
    largest = max(counts, default=0)
    if largest == 0:
        return PaddedStep(tuple(counts), 0, 0, graph)
    if not can_pad:
        return PaddedStep(tuple(counts), counts[rank], 0, False)
    target = captured_size(largest) if graph else largest
    padding = target - counts[rank]
    return PaddedStep(tuple(counts), target, padding, graph or padding > 0)
