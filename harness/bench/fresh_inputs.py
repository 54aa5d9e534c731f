"""Fresh inputs for every timed call, and the oracle of each.

A kernel that returns what it computed last time for the same buffer, or for the
same bytes, runs in no time on a benchmark that repeats one input (flashinfer-bench
#228), and a stale CUDA-graph replay returns the output of inputs it no longer
reads (#414). So every timed call of a case reads contents of its own: the step's
query and its new tokens' K and V, drawn afresh with the case's shapes, dtype and
distribution (``harness.numerics.scenario.fresh_step_tokens``). Each call overwrites
the slots of the step's new tokens with its own K/V, as every decode step of a model
does, over the cached prefix the case built; call ``i``'s right answer is that prefix
with variant ``i``'s tokens.

One ``InputPool`` per case, shared by the peer and every backend: call ``i`` reads
variant ``i`` in every timing (drawn once, outside the timed region, when a timing
first reads it), so the oracle of a checked variant is computed once per case. The
pool's memory is bounded (``POOL_BYTES``): where a case's inputs are large the pool
holds fewer variants and the timing takes at most that many calls, since a variant
read twice would let a cache keyed by content hit.

The oracle of a variant covers every token of a small step, and a seeded sample of
``CHECKED_TOKENS`` tokens of a large causal one: a token at position ``p`` is a query
of one token over its sequence's first ``p + 1`` keys, the same attention at a
fraction of the float64 cost (a prefill of 1024 tokens: 3.5 s whole, 0.2 s sampled).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from harness.core.contract import LayerCache
from harness.numerics.cache_readback import stored_sequences
from harness.numerics.oracle import OracleOutput, SequenceKV, references
from harness.numerics.scenario import StepInputs, fresh_step_tokens, with_step_tokens
from harness.numerics.tolerance import Comparison, compare

if TYPE_CHECKING:
    from harness.bench.case_check import PreparedCase
    from harness.bench.timing import TimingConfig

POOL_BYTES = {"cpu": 512 * 2**20, "cuda": 4 * 2**30}
"""The most a case's variants hold, per device type."""
CHECKED_TOKENS = 64
"""Tokens whose output a checked call is held to the oracle on, in a causal step with more."""
MIN_VARIANTS = 8
"""Variants a pool holds however large a case is: warm-up, five samples, a final call."""


@dataclass(frozen=True)
class Variant:
    """One call's contents: the step's query and its new tokens' K and V."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor


@dataclass(frozen=True)
class CheckedTokens:
    """Which output tokens a check reads, and their oracle and naive outputs."""

    tokens: torch.Tensor | None  # None: every token of the step
    oracle: OracleOutput
    naive: torch.Tensor

    def compare(self, output: torch.Tensor, dtype: torch.dtype) -> tuple[Comparison, int]:
        """The output's checked tokens against the oracle; and the step token of the worst."""
        picked = output if self.tokens is None else output[self.tokens.to(output.device)]
        comparison = compare(picked, self.oracle, self.naive, dtype)
        worst = comparison.worst_token
        if self.tokens is not None and worst >= 0:
            worst = int(self.tokens[worst])
        return comparison, worst


def variant_bytes(inputs: StepInputs) -> int:
    """One variant's query, new keys and new values (an MLA value is a view: no bytes)."""
    tensors = [inputs.queries[0], inputs.keys[0]]
    if inputs.scenario.kv_lora_rank is None:
        tensors.append(inputs.values[0])
    return sum(t.numel() * t.element_size() for t in tensors)


def pool_size(inputs: StepInputs, wanted: int, device_type: str, least: int = 0) -> int:
    """How many variants a case's pool holds: ``wanted``, unless they pass ``POOL_BYTES``;
    never fewer than ``least`` (a timing's warm-up and fewest samples) or ``MIN_VARIANTS``."""
    each = max(1, variant_bytes(inputs))
    fits = POOL_BYTES.get(device_type, POOL_BYTES["cpu"]) // each
    return max(MIN_VARIANTS, least, min(wanted, fits))


@dataclass
class InputPool:
    """A case's variants (see the module docstring) and the oracle of each checked one.

    Variant ``i`` is drawn when a timing first reads it, from a generator seeded by the
    pool's seed and ``i``: the same contents whichever timing draws it, and no time spent
    on variants no timing reads.
    """

    inputs: StepInputs  # the case's own step: its caches, rows and cached prefix
    size: int
    seed: int
    _variants: dict[int, Variant] = field(default_factory=dict, repr=False)
    _references: dict[int, CheckedTokens] = field(default_factory=dict, repr=False)

    def __getitem__(self, index: int) -> Variant:
        if not 0 <= index < self.size:
            raise IndexError(f"variant {index} of a pool of {self.size}")
        if index not in self._variants:
            gen = torch.Generator(self.inputs.queries[0].device)
            gen.manual_seed(zlib.crc32(f"variant/{self.seed}/{index}".encode()))
            self._variants[index] = Variant(*fresh_step_tokens(self.inputs, gen))
        return self._variants[index]

    @property
    def variants(self) -> list[Variant]:
        """Every variant, drawn."""
        return [self[i] for i in range(self.size)]

    def step(self, index: int) -> StepInputs:
        v = self[index]
        return with_step_tokens(self.inputs, v.query, v.key, v.value)

    def reference(self, index: int, stored: list[SequenceKV | None] | None = None) -> CheckedTokens:
        """Variant ``index``'s oracle on its checked tokens; computed once per case unless
        ``stored`` (an FP8 cache's K/V as the timed backend stored them) is given."""
        if stored is None and index in self._references:
            return self._references[index]
        step = self.step(index)
        checked = self._checked(step, index, stored if stored is not None else step.sequences[0])
        if stored is None:
            self._references[index] = checked
        return checked

    def stored(self, index: int, caches: list[LayerCache]) -> list[SequenceKV | None]:
        """Variant ``index``'s sequences as ``caches`` hold them now (after its call)."""
        step = self.step(index)
        return stored_sequences(caches[0], step.step.rows, step.sequences[0], step.scenario.variant)

    def _checked(
        self, step: StepInputs, index: int, sequences: list[SequenceKV | None]
    ) -> CheckedTokens:
        s = step.scenario
        rows = step.step.rows
        query_lens = [row.query_len for row in rows]
        options = {
            "scale": s.softmax_scale,
            "causal": s.causal,
            "variant": s.variant,
            "value_dim": s.value_dim,
        }
        query = step.queries[0]
        if not s.causal or query.shape[0] <= CHECKED_TOKENS:
            oracle, naive = references(query, sequences, query_lens, **options)  # type: ignore[arg-type]
            return CheckedTokens(None, oracle, naive)
        positions: list[tuple[int, SequenceKV, int]] = []  # (step token, its sequence, keys seen)
        start = 0
        for row, seq in zip(rows, sequences, strict=True):
            if seq is not None:
                first = row.seq_len - row.query_len
                positions += [(start + j, seq, first + j + 1) for j in range(row.query_len)]
            start += row.query_len
        gen = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}/{index}".encode()))
        picks = sorted(torch.randperm(len(positions), generator=gen)[:CHECKED_TOKENS].tolist())
        chosen = [positions[p] for p in picks]
        tokens = torch.tensor([token for token, _, _ in chosen], dtype=torch.long)
        truncated: list[SequenceKV | None] = [
            SequenceKV(seq.key[:seen], seq.value[:seen]) for _, seq, seen in chosen
        ]
        oracle, naive = references(
            query[tokens.to(query.device)],
            truncated,
            [1] * len(chosen),
            **options,  # type: ignore[arg-type]
        )
        return CheckedTokens(tokens, oracle, naive)


def case_pool(case: PreparedCase, timing: TimingConfig) -> InputPool:
    """The case's fresh inputs (this module's docstring), drawn at its first timing."""
    if case.pool is None:
        wanted, least = timing.warmup + timing.max_samples, timing.warmup + timing.min_samples
        size = pool_size(case.inputs, wanted, torch.device(case.device).type, least)
        case.pool = InputPool(case.inputs, size, seed=case.spec.seed)
    return case.pool
