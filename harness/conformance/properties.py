"""The conformance properties, as plain functions over one backend.

Each takes a ``BackendEntry`` and drawn scenario(s) and raises
``PropertyFailure`` (an ``AssertionError``) saying what broke, for which
scenario; ``harness.Unsupported`` from the backend propagates, and the suite
reports it against the backend's claim. The pytest suites in
``suites/conformance`` are thin wrappers over these, one test per property.
The rejection properties (4: foreign pages, bad bindings, bad constructor
values) are in ``harness.conformance.rejection_properties``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from harness.conformance.large_pool import (
    WATCHED_PAGES,
    changed_watched_slots,
    large_pool_inputs,
    watched_snapshot,
)
from harness.conformance.production_shapes import CostLimit
from harness.conformance.rank_steps import RankSteps
from harness.core.batches import BatchBuilder
from harness.core.errors import PropertyFailure, Unsupported
from harness.core.kv_pages import PagePool, PoolLayout, pages_needed
from harness.core.registry import BackendEntry
from harness.numerics.canary import PoolWatch, bits, changed_slots, snapshot
from harness.numerics.nan_evidence import nonfinite_evidence
from harness.numerics.scenario import (
    Scenario,
    StepInputs,
    backend_for,
    check_outputs,
    make_step_inputs,
    scenario_caches,
    scenario_pool,
)
from harness.numerics.tolerance import compare_lse, error_bound

__all__ = ["PropertyFailure", "bits", "changed_slots"]  # re-exported for older imports


def fail(prop: str, entry: BackendEntry, scenario: Scenario | None, detail: str) -> PropertyFailure:
    where = f"\n  scenario: {scenario.describe()}" if scenario is not None else ""
    return PropertyFailure(f"{prop} violated by backend {entry.name!r}{where}\n  {detail}")


def call_backend(
    prop: str,
    entry: BackendEntry,
    scenario: Scenario,
    fn: Callable[..., Any],
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Run a backend call on valid input; a ValueError there is a wrong rejection."""
    try:
        return fn(*args, **kwargs)
    except Unsupported:
        raise
    except ValueError as exc:
        raise fail(
            prop, entry, scenario, f"rejected valid input: {type(exc).__name__}: {exc}"
        ) from exc


def bound_backend(
    prop: str, entry: BackendEntry, inputs: StepInputs, *, prepare: bool = True
) -> Any:
    """A new backend for ``inputs``' rank, bound to its caches and (by default) prepared."""
    s = inputs.scenario
    backend = call_backend(prop, entry, s, backend_for, entry, s)
    call_backend(prop, entry, s, backend.bind_kv_caches, inputs.caches)
    if prepare:
        call_backend(prop, entry, s, backend.prepare, inputs.step.metadata, graph_mode=s.graph_mode)
    return backend


def forward_layer(
    prop: str, entry: BackendEntry, inputs: StepInputs, backend: Any, layer: int
) -> torch.Tensor:
    return call_backend(
        prop, entry, inputs.scenario, backend.forward, *inputs.forward_args(layer), layer
    )


def run_step(prop: str, entry: BackendEntry, inputs: StepInputs) -> list[torch.Tensor]:
    """Bind, prepare and forward every layer on a fresh backend."""
    backend = bound_backend(prop, entry, inputs)
    return [
        forward_layer(prop, entry, inputs, backend, layer)
        for layer in range(inputs.scenario.num_layers)
    ]


def assert_matches_oracle(
    prop: str, entry: BackendEntry, inputs: StepInputs, outputs: list[torch.Tensor]
) -> None:
    s = inputs.scenario
    for layer, output in enumerate(outputs):
        expected = inputs.output_shape(layer)
        if not isinstance(output, torch.Tensor) or tuple(output.shape) != expected:
            got = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output)
            raise fail(prop, entry, s, f"layer {layer}: output shape {got} != {expected}")
        if output.dtype != s.dtype:
            raise fail(prop, entry, s, f"layer {layer}: output dtype {output.dtype} != {s.dtype}")
    _assert_padding_rows(prop, entry, inputs, outputs)
    for layer in range(len(outputs)):
        problem = inputs.write_problem(layer)  # FP8 caches: stored values before the oracle
        if problem is not None:
            raise fail(prop, entry, s, f"layer {layer}: {problem}")
    for layer, result in enumerate(check_outputs(inputs, outputs)):
        if not result.passed:
            evidence = (
                nonfinite_evidence(inputs, layer, outputs[layer]) if result.nonfinite else None
            )
            raise fail(prop, entry, s, f"layer {layer}: {result.describe(evidence)}")


def _assert_padding_rows(
    prop: str, entry: BackendEntry, inputs: StepInputs, outputs: list[torch.Tensor]
) -> None:
    """Graph-mode padding rows hold what the backend's ``padding_rows`` claim promises.

    Unclaimed ("unspecified", the contract's default) they are never read; an
    engine that feeds them to later layers needs them finite (a NaN there
    poisons a batch-wide reduction) or zero.
    """
    claim = entry.capabilities.padding_rows
    if claim == "unspecified" or not inputs.scenario.graph_mode:
        return
    padding = ~real_rows(inputs)
    for layer, output in enumerate(outputs):
        rows = output.detach().cpu()[padding]
        held = (rows == 0).all() if claim == "zero" else torch.isfinite(rows).all()
        if not held:
            what = "non-zero" if claim == "zero" else "non-finite"
            bad = int((rows != 0).sum() if claim == "zero" else (~torch.isfinite(rows)).sum())
            raise fail(
                prop,
                entry,
                inputs.scenario,
                f"layer {layer}: {bad} {what} values in graph-mode padding rows, which the "
                f"backend claims are {claim} (Capabilities.padding_rows)",
            )


# -- 1. partition: a rank keeps to its pages over many steps --------------------------

PARTITION_DECODE_STEPS = 2


PARTITION_WORK = CostLimit().work // 16
"""The multiply-adds a rank's steps may cost here, where every token is computed (prefilled),
not written into the cache beforehand as the single-step properties do."""


PARTITION_ROWS = 16
"""Sequences a rank keeps here: every one is prefilled, extended and decoded, step by step."""


def _prefill_affordable(s: Scenario) -> Scenario:
    """``s`` with at most ``PARTITION_ROWS`` sequences, its longest contexts halved until
    prefilling every one fits ``PARTITION_WORK``.

    The partition is about which pages a rank touches over several steps, so a
    production group keeps its page size, DP layout and its first rows; only
    contexts whose causal prefill would take minutes shrink (each query with
    them). The other properties check many-sequence and long-context groups.
    """
    s = replace(
        s, context_lens=s.context_lens[:PARTITION_ROWS], query_lens=s.query_lens[:PARTITION_ROWS]
    )
    contexts = list(s.context_lens)
    per_key = s.num_heads * s.head_dim

    def work() -> int:
        return sum(c * c for c in contexts) * per_key // 2

    while work() > PARTITION_WORK and max(contexts) > 1:
        longest = contexts.index(max(contexts))
        contexts[longest] = -(-contexts[longest] // 2)
    if contexts == list(s.context_lens):
        return s
    queries = tuple(min(q, c) for q, c in zip(s.query_lens, contexts, strict=True))
    return replace(s, context_lens=tuple(contexts), query_lens=queries)


def check_partition_respected(entry: BackendEntry, ranks: Sequence[Scenario]) -> None:
    """Every rank of a group, on one shared pool, over consecutive steps, touches only its pages.

    Each rank's sequences are prefilled, extended by their drawn query and
    decoded, ranks interleaved step by step. After every forward, the only
    slots changed anywhere in the pool are the step's own (so no rank writes
    another's pages), and the output matches the oracle (so no rank reads
    another's pages: they hold other ranks' tokens, not its own).
    """
    prop = "each rank keeps to its pages over many steps"
    steps = PARTITION_DECODE_STEPS
    ranks = [_prefill_affordable(s) for s in ranks]
    per_rank = max(sum(pages_needed(c + steps, s.page_size) for c in s.context_lens) for s in ranks)
    dp_size, total = ranks[0].dp_size, ranks[0].total_pages
    total = max(total, per_rank * dp_size + total % dp_size)  # room to decode
    group = [  # no padding rows here: every page is the ranks' to use
        replace(s, layout=PoolLayout.SHARED, total_pages=total, padding_convention="empty")
        for s in ranks
    ]
    first = group[0]
    pool = PagePool(first.total_pages, first.dp_size, shuffle_seed=first.seed)
    caches = scenario_caches(first)
    # apart from the binding step's seed, whose tokens sit in these slots: rewriting them with
    # the same bits would read as no write at all
    gen = torch.Generator().manual_seed(first.seed + 1)
    runs = []
    for s in group:
        backend = bound_backend(prop, entry, make_step_inputs(s, caches=caches), prepare=False)
        builder = BatchBuilder(pool, s.dp_rank, s.page_size)
        run = RankSteps(backend, builder, caches, s, gen, f"rank {s.dp_rank}/{s.dp_size}")
        lengths, queries = s.context_lens, s.query_lens
        ids = [run.admit(prompt=length) for length in lengths]
        plan = [
            [(i, c - q) for i, c, q in zip(ids, lengths, queries, strict=True) if c > q],
            list(zip(ids, queries, strict=True)),
            *([(i, 1) for i in ids] for _ in range(steps)),
        ]
        runs.append((s, run, [requests for requests in plan if requests]))
    watch = PoolWatch(caches)  # once every rank is bound: one copy of the pool, not one a call
    for _, run, _ in runs:
        run.watch = watch  # one pool: every rank's writes are news to the others
    for index in range(max(len(plan) for _, _, plan in runs)):
        for s, run, plan in runs:
            if index < len(plan):
                try:
                    run.step(plan[index])
                except PropertyFailure as exc:
                    raise fail(prop, entry, s, str(exc)) from None
                except ValueError as exc:
                    if isinstance(exc, Unsupported):
                        raise
                    raise fail(prop, entry, s, f"rejected valid input: {exc}") from exc


# -- 2. oracle, every rank, together == alone -----------------------------------------


def check_matches_oracle(entry: BackendEntry, scenario: Scenario) -> None:
    inputs = make_step_inputs(scenario)
    assert_matches_oracle(
        "outputs match the oracle",
        entry,
        inputs,
        run_step("outputs match the oracle", entry, inputs),
    )


def _run_ranks_together(
    prop: str, entry: BackendEntry, ranks: Sequence[Scenario]
) -> list[tuple[StepInputs, list[torch.Tensor]]]:
    """Every rank in one pool: shared layout binds one set of tensors for all of them."""
    first = ranks[0]
    pool = scenario_pool(first)
    shared = scenario_caches(first) if first.layout is PoolLayout.SHARED else None
    all_inputs = [make_step_inputs(s, pool=pool, caches=shared) for s in ranks]
    backends = [bound_backend(prop, entry, inputs) for inputs in all_inputs]
    outputs: list[list[torch.Tensor]] = [[] for _ in ranks]
    for layer in range(first.num_layers):  # interleave ranks layer by layer
        for rank, (inputs, backend) in enumerate(zip(all_inputs, backends, strict=True)):
            outputs[rank].append(forward_layer(prop, entry, inputs, backend, layer))
    return list(zip(all_inputs, outputs, strict=True))


def check_every_rank_matches_oracle(entry: BackendEntry, ranks: Sequence[Scenario]) -> None:
    prop = "every rank matches the oracle"
    for inputs, outputs in _run_ranks_together(prop, entry, ranks):
        assert_matches_oracle(prop, entry, inputs, outputs)


def real_rows(inputs: StepInputs) -> torch.Tensor:
    """Which output rows belong to a sequence (not graph-mode padding)."""
    return torch.tensor(
        [row.seq_id is not None for row in inputs.step.rows for _ in range(row.query_len)],
        dtype=torch.bool,
    )


def _assert_finite(
    prop: str, entry: BackendEntry, inputs: StepInputs, outputs: list[torch.Tensor]
) -> None:
    """NaN is bit-equal to itself: an equality property must not pass on garbage."""
    real = real_rows(inputs)
    for layer, output in enumerate(outputs):
        if not torch.isfinite(output.detach().cpu()[real]).all():
            evidence = nonfinite_evidence(inputs, layer, output)
            raise fail(
                prop, entry, inputs.scenario, f"layer {layer}: non-finite output ({evidence})"
            )


def same_real_rows(real: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-equal on the rows ``real`` marks (``real_rows``): padding rows are unspecified."""
    return torch.equal(bits(a.detach().cpu()[real]), bits(b.detach().cpu()[real]))


def check_ranks_together_equal_alone(entry: BackendEntry, ranks: Sequence[Scenario]) -> None:
    """Bit-identical, since each rank's tokens sit on the same physical pages both ways."""
    prop = "ranks run together equal each run alone"
    for inputs, together in _run_ranks_together(prop, entry, ranks):
        alone_inputs = make_step_inputs(inputs.scenario, pool=scenario_pool(ranks[0]))
        alone = run_step(prop, entry, alone_inputs)
        _assert_finite(prop, entry, inputs, together)
        real = real_rows(inputs)
        for layer, (a, b) in enumerate(zip(together, alone, strict=True)):
            if not same_real_rows(real, a, b):
                raise fail(
                    prop,
                    entry,
                    inputs.scenario,
                    f"layer {layer}: output differs when other ranks share the pool",
                )


# -- 3. canary ----------------------------------------------------------------------------


def check_large_pool_step(entry: BackendEntry, scenario: Scenario) -> None:
    """On a pool past 2^31 elements per tensor, using its top pages: outputs match the
    oracle and, of the watched top pages, only the step's slots change
    (``harness.conformance.large_pool``: the rest of the pool is untouched virtual memory)."""
    prop = "a pool past 2^31 elements"
    inputs = large_pool_inputs(scenario)
    before = watched_snapshot(inputs)
    outputs = run_step(prop, entry, inputs)
    assert_matches_oracle(prop, entry, inputs, outputs)
    mapped = {slot for slot in inputs.step.metadata.slot_mapping.tolist() if slot != -1}
    for layer, changed in enumerate(changed_watched_slots(inputs, before)):
        if changed != mapped:
            wrong = sorted(changed ^ mapped)[:8]
            raise fail(
                prop,
                entry,
                scenario,
                f"layer {layer}: slots written in the top {WATCHED_PAGES} pages differ from "
                f"slot_mapping's at {wrong} (written {len(changed)}, mapped {len(mapped)})",
            )


def check_only_mapped_slots_change(entry: BackendEntry, scenario: Scenario) -> None:
    """After forward(layer), exactly that step's slots changed, in that layer only."""
    prop = "only slot_mapping's slots change"
    inputs = make_step_inputs(scenario)
    s = scenario
    backend = bound_backend(prop, entry, inputs)
    mapped = {slot for slot in inputs.step.metadata.slot_mapping.tolist() if slot != -1}
    for layer in range(s.num_layers):
        before = snapshot(inputs.caches)
        forward_layer(prop, entry, inputs, backend, layer)
        for other, rows in enumerate(changed_slots(inputs.caches, before)):
            expect = mapped if other == layer else set()
            if rows != expect:
                extra, missing = sorted(rows - expect)[:8], sorted(expect - rows)[:8]
                raise fail(
                    prop,
                    entry,
                    s,
                    f"forward(layer {layer}) changed layer {other}: "
                    f"unexpected slots {extra}, slots not written {missing}",
                )


# -- 5. inputs untouched, outputs sane ------------------------------------------------


def check_inputs_unmodified(entry: BackendEntry, scenario: Scenario) -> None:
    prop = "inputs are not modified"
    inputs = make_step_inputs(scenario)
    metadata = inputs.step.metadata
    tensors = {
        name: getattr(metadata, name)
        for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping")
    }
    before = {name: bits(t) for name, t in tensors.items()}
    backend = bound_backend(prop, entry, inputs)
    for layer in range(scenario.num_layers):
        args = inputs.forward_args(layer)
        copies = [bits(t) for t in args]
        output = call_backend(prop, entry, scenario, backend.forward, *args, layer)
        for name, tensor, copy in zip(("query", "key", "value"), args, copies, strict=True):
            if not torch.equal(bits(tensor), copy):
                raise fail(prop, entry, scenario, f"forward(layer {layer}) modified {name}")
        real = real_rows(inputs)
        shape = inputs.output_shape(layer)
        if tuple(output.shape) != shape or output.dtype != args[0].dtype:
            raise fail(
                prop,
                entry,
                scenario,
                f"output {tuple(output.shape)} {output.dtype}, expected {shape} {args[0].dtype}",
            )
        if not torch.isfinite(output.detach().cpu()[real]).all():
            raise fail(prop, entry, scenario, f"layer {layer}: non-finite output")
    for name, tensor in tensors.items():
        if not torch.equal(bits(tensor), before[name]):
            raise fail(prop, entry, scenario, f"metadata.{name} was modified")


# -- 6, 7. page order and layout do not matter --------------------------------------


def _assert_same_within_bound(
    prop: str,
    entry: BackendEntry,
    a: StepInputs,
    out_a: list[torch.Tensor],
    out_b: list[torch.Tensor],
) -> None:
    assert_matches_oracle(prop, entry, a, out_a)
    s = a.scenario
    for layer, (x, y) in enumerate(zip(out_a, out_b, strict=True)):
        exact, naive = a.reference(layer)  # computed once, in assert_matches_oracle
        bound = error_bound(exact, (naive.double() - exact.output).norm(dim=-1), s.dtype)
        diff = (x.detach().cpu().double() - y.detach().cpu().double()).norm(dim=-1)
        over = (diff > bound) & exact.checked[:, None]
        if over.any() or not torch.isfinite(diff[exact.checked]).all():
            raise fail(prop, entry, s, f"layer {layer}: outputs differ beyond the dtype bound")


def check_page_order_irrelevant(entry: BackendEntry, scenario: Scenario) -> None:
    prop = "physical page order does not matter"
    ordered = make_step_inputs(replace(scenario, shuffle_pages=False))
    shuffled = make_step_inputs(replace(scenario, shuffle_pages=True))
    _assert_same_within_bound(
        prop, entry, ordered, run_step(prop, entry, ordered), run_step(prop, entry, shuffled)
    )


def check_layouts_agree(entry: BackendEntry, scenario: Scenario) -> None:
    prop = "per-rank and shared layouts agree"
    shared = make_step_inputs(replace(scenario, layout=PoolLayout.SHARED))
    per_rank = make_step_inputs(replace(scenario, layout=PoolLayout.PER_RANK))
    _assert_same_within_bound(
        prop, entry, shared, run_step(prop, entry, shared), run_step(prop, entry, per_rank)
    )


# -- 8. determinism -------------------------------------------------------------------


def check_deterministic(entry: BackendEntry, scenario: Scenario) -> None:
    prop = "the same inputs give bit-identical outputs"
    inputs = make_step_inputs(scenario)
    first = run_step(prop, entry, inputs)
    _assert_finite(prop, entry, inputs, first)
    second = run_step(prop, entry, make_step_inputs(scenario))
    real = real_rows(inputs)
    for layer, (a, b) in enumerate(zip(first, second, strict=True)):
        if not same_real_rows(real, a, b):
            raise fail(prop, entry, scenario, f"layer {layer}: second run differs")


# -- optional outputs: the log-sum-exp and out= buffers -----------------------------------


def check_lse_matches_oracle(entry: BackendEntry, scenario: Scenario) -> None:
    """``forward_with_lse`` returns the same output as ``forward`` would, and the oracle's LSE."""
    prop = "forward_with_lse matches the oracle"
    inputs = make_step_inputs(scenario)
    backend = bound_backend(prop, entry, inputs)
    outputs, lses = [], []
    for layer in range(scenario.num_layers):
        result = call_backend(
            prop, entry, scenario, backend.forward_with_lse, *inputs.forward_args(layer), layer
        )
        if not isinstance(result, tuple) or len(result) != 2:
            raise fail(prop, entry, scenario, f"returned {type(result).__name__}, not (out, lse)")
        outputs.append(result[0])
        lses.append(result[1])
    assert_matches_oracle(prop, entry, inputs, outputs)
    tokens, heads = scenario_tokens(inputs), scenario.num_heads
    for layer, lse in enumerate(lses):
        if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (tokens, heads):
            got = tuple(lse.shape) if isinstance(lse, torch.Tensor) else type(lse).__name__
            raise fail(
                prop, entry, scenario, f"layer {layer}: lse shape {got} != {(tokens, heads)}"
            )
        if lse.dtype != torch.float32:
            raise fail(prop, entry, scenario, f"layer {layer}: lse dtype {lse.dtype} != float32")
        result = compare_lse(lse, inputs.reference(layer)[0], scenario.dtype)
        if not result.passed:
            raise fail(prop, entry, scenario, f"layer {layer}: lse {result.describe()}")


def scenario_tokens(inputs: StepInputs) -> int:
    return int(inputs.queries[0].shape[0])


OUT_BUFFER_FILL = float("nan")


def check_out_buffer_is_the_result(entry: BackendEntry, scenario: Scenario, strided: bool) -> None:
    """``forward(..., out=buf)`` returns ``buf`` itself, holding the output; nothing else written.

    The buffer is a view into a wider NaN-filled tensor (every other column
    when ``strided``), so a write past it, or a result left in a new tensor,
    shows. The output must match the oracle like any other.
    """
    prop = "forward(out=) writes the buffer it was given"
    inputs = make_step_inputs(scenario)
    backend = bound_backend(prop, entry, inputs)
    outputs = []
    for layer in range(scenario.num_layers):
        query = inputs.forward_args(layer)[0]
        width = 2 if strided else 1
        rows = inputs.output_shape(layer)[-1]
        wide = torch.full(
            (*query.shape[:-1], rows * width + 2),
            OUT_BUFFER_FILL,
            dtype=query.dtype,
            device=query.device,
        )
        buffer = wide[..., 1 : 1 + rows * width : width]
        before = bits(wide)
        result = call_backend(
            prop, entry, scenario, backend.forward, *inputs.forward_args(layer), layer, out=buffer
        )
        if result is not buffer and not (
            isinstance(result, torch.Tensor)
            and result.data_ptr() == buffer.data_ptr()
            and result.stride() == buffer.stride()
        ):
            raise fail(prop, entry, scenario, f"layer {layer}: the result is not the out buffer")
        outside = torch.ones_like(wide, dtype=torch.bool)
        outside[..., 1 : 1 + rows * width : width] = False
        if not torch.equal(bits(wide)[outside.cpu()], before[outside.cpu()]):
            raise fail(prop, entry, scenario, f"layer {layer}: wrote outside the out buffer")
        outputs.append(buffer.clone())
    assert_matches_oracle(prop, entry, inputs, outputs)
