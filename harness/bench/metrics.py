"""Exact work counts of one attention step, rates, and fractions of the roofline.

Pure functions of the batch shape, with no timing or device:

* FLOPs = 4 * num_heads * head_dim * (sum over query tokens of keys seen):
  ``QK^T`` and ``PV`` are each one multiply-add (2 FLOPs) per query head,
  head-dim element and visible key. A query token at position ``p`` of a
  causal sequence sees ``p + 1`` keys; without a causal mask it sees all
  ``L``. A sliding window ``W`` caps what a query sees at its last ``W``
  keys.
* bytes = Q read + O written + each sequence's K/V read once + new K/V
  written, Q/O in the element size of the dtype and K/V in the cache's
  (1 byte for FP8): the traffic of an ideal kernel that touches every byte
  exactly once. With a window, a sequence's K/V read is the keys some query
  of it sees (``min(L, q + W - 1)``). Graph-mode padding rows (``seq_len``
  0) are no real work and are not counted.

Counts are Python ints (exact at any size); rates and fractions are floats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def keys_seen(query_len: int, seq_len: int, causal: bool, window: int | None = None) -> int:
    """Keys visible to a sequence's ``query_len`` new tokens, summed over them.

    The new tokens sit at positions ``seq_len - query_len .. seq_len - 1``;
    causal token ``p`` sees ``p + 1`` keys, so the sum is
    ``q * (L - q) + q * (q + 1) / 2``. A window ``W`` hides keys at
    positions ``<= p - W``.
    """
    if query_len < 0 or seq_len < query_len:
        raise ValueError(f"need 0 <= query_len <= seq_len, got q={query_len}, L={seq_len}")
    first, last = seq_len - query_len, seq_len - 1  # the new tokens' positions
    if window is None:
        if not causal:
            return query_len * seq_len
        return query_len * (seq_len - query_len) + query_len * (query_len + 1) // 2
    hidden = _hidden_by_window(last, window) - _hidden_by_window(first - 1, window)
    if not causal:
        return query_len * seq_len - hidden
    return _capped_prefix(seq_len, window) - _capped_prefix(first, window)


def _capped_prefix(n: int, window: int) -> int:
    """``sum_{i=1..n} min(i, W)``: keys seen by causal positions ``0 .. n-1``."""
    if n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def _hidden_by_window(last: int, window: int) -> int:
    """``sum_{p=0..last} max(0, p - W + 1)``: keys hidden from positions ``0 .. last``."""
    m = max(0, last - window + 1)
    return m * (m + 1) // 2


@dataclass(frozen=True)
class AttentionWork:
    """The shape of one step's attention for one layer, enough to count its work."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    element_bytes: int
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    causal: bool = True
    sliding_window: int | None = None
    kv_element_bytes: int | None = None  # the cache's element size; None: ``element_bytes``
    kv_lora_rank: int | None = None  # MLA: one latent row of head_dim per token, values its prefix

    def __post_init__(self) -> None:
        if len(self.query_lens) != len(self.seq_lens):
            raise ValueError("query_lens and seq_lens differ in length")
        for name in ("num_heads", "num_kv_heads", "head_dim", "element_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for q, length in self.real_rows:
            keys_seen(q, length, self.causal)  # validates each real row
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {self.sliding_window}")

    @property
    def real_rows(self) -> list[tuple[int, int]]:
        """``(query_len, seq_len)`` of every row that is not graph-mode padding."""
        return [(q, n) for q, n in zip(self.query_lens, self.seq_lens, strict=True) if n > 0]

    @property
    def num_tokens(self) -> int:
        """Query tokens of real rows: the tokens a step produces."""
        return sum(q for q, _ in self.real_rows)

    @property
    def keys_seen(self) -> int:
        return sum(keys_seen(q, n, self.causal, self.sliding_window) for q, n in self.real_rows)

    @property
    def value_dim(self) -> int:
        """Entries of a value row and an output row (MLA: ``kv_lora_rank``)."""
        return self.head_dim if self.kv_lora_rank is None else self.kv_lora_rank

    @property
    def kv_bytes_per_token(self) -> int:
        """One token's K and V in the cache; for MLA its one latent row, which every head
        reads as its key and, the first ``kv_lora_rank`` entries, as its value."""
        rows = 1 if self.kv_lora_rank is not None else 2
        return (
            rows * self.num_kv_heads * self.head_dim * (self.kv_element_bytes or self.element_bytes)
        )

    @property
    def flops(self) -> int:
        """Two per multiply-add: ``q.k`` over ``head_dim`` and ``p.v`` over the value's width."""
        return 2 * self.num_heads * (self.head_dim + self.value_dim) * self.keys_seen

    @property
    def query_bytes(self) -> int:
        """Q read."""
        return self.num_tokens * self.num_heads * self.head_dim * self.element_bytes

    @property
    def output_bytes(self) -> int:
        """O written."""
        return self.num_tokens * self.num_heads * self.value_dim * self.element_bytes

    @property
    def kv_read_bytes(self) -> int:
        """Each sequence's K and V that some query sees (all of it without a window), once."""
        window = self.sliding_window
        tokens = sum(n if window is None else min(n, q + window - 1) for q, n in self.real_rows)
        return tokens * self.kv_bytes_per_token

    @property
    def kv_write_bytes(self) -> int:
        """The new tokens' K and V written into the cache."""
        return self.num_tokens * self.kv_bytes_per_token

    @property
    def bytes(self) -> int:
        return self.query_bytes + self.output_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte: where the step sits on the roofline."""
        return self.flops / self.bytes if self.bytes else 0.0


@dataclass(frozen=True)
class Rates:
    """Achieved throughput of one step taking ``seconds``."""

    seconds: float
    tokens_per_s: float
    flops_per_s: float
    bytes_per_s: float

    @property
    def tflops(self) -> float:
        return self.flops_per_s / 1e12

    @property
    def gbps(self) -> float:
        return self.bytes_per_s / 1e9


def rates(work: AttentionWork, seconds: float) -> Rates:
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    return Rates(
        seconds=seconds,
        tokens_per_s=work.num_tokens / seconds,
        flops_per_s=work.flops / seconds,
        bytes_per_s=work.bytes / seconds,
    )


MEASUREMENT_ERROR = "measurement error"
"""The kind of flag a rate above its ceiling gets (the text before its first colon)."""


@dataclass(frozen=True)
class Roofline:
    """Achieved rates as fractions of the device's ceilings.

    ``roofline_fraction`` is the time an ideal kernel would need (bounded by
    bandwidth or by compute, whichever is slower) over the measured time,
    i.e. the larger of the two fractions. A fraction above 1 is physically
    impossible: the ceiling or the timing is wrong, and which one cannot be
    told from here, so that fraction is withheld (``None``, named in
    ``withheld``) and flagged as a measurement error; the roofline fraction
    and the bound, the larger of the two, are then unknown too.
    """

    bandwidth_fraction: float | None
    compute_fraction: float | None
    roofline_fraction: float | None
    bound: str | None  # "memory" or "compute": which ceiling limits an ideal kernel
    flags: tuple[str, ...]
    withheld: tuple[str, ...] = ()  # "bandwidth", "compute": fractions above 1, not reported


def excess_flag(name: str, fraction: float) -> str:
    """The flag of a rate at ``fraction`` (> 1) of its ceiling (``name``: bandwidth, compute)."""
    return (
        f"{MEASUREMENT_ERROR}: {name} at {fraction:.0%} of its ceiling; fraction withheld "
        "(above 100% is impossible: the ceiling probe ran while the machine was busy, "
        "or the timer or the cache flush is wrong)"
    )


def roofline(
    work: AttentionWork,
    seconds: float,
    *,
    bandwidth: float | None,
    flops: float | None,
) -> Roofline:
    """Fractions of ``bandwidth`` (bytes/s) and ``flops`` (FLOP/s); ``None`` when unknown."""
    achieved = rates(work, seconds)
    fractions = {
        "bandwidth": achieved.bytes_per_s / bandwidth if bandwidth else None,
        "compute": achieved.flops_per_s / flops if flops else None,
    }
    flags = []
    withheld = []
    for name, fraction in fractions.items():
        if fraction is not None and fraction > 1.0:
            flags.append(excess_flag(name, fraction))
            withheld.append(name)
    bw, fl = fractions["bandwidth"], fractions["compute"]
    if withheld:
        bw = None if "bandwidth" in withheld else bw
        fl = None if "compute" in withheld else fl
        return Roofline(bw, fl, None, None, tuple(flags), tuple(withheld))
    known = [f for f in (bw, fl) if f is not None]
    bound = None
    if bw is not None and fl is not None:
        bound = "memory" if bw >= fl else "compute"
    return Roofline(bw, fl, max(known) if known else None, bound, ())


def work_of_rows(
    rows: Sequence[tuple[int, int]],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    element_bytes: int,
    causal: bool = True,
) -> AttentionWork:
    """``AttentionWork`` from ``(query_len, seq_len)`` rows."""
    return AttentionWork(
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        element_bytes=element_bytes,
        query_lens=tuple(q for q, _ in rows),
        seq_lens=tuple(n for _, n in rows),
        causal=causal,
    )
