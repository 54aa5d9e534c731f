"""The conformance properties, as plain functions over one backend.

Each takes a ``BackendEntry`` and drawn scenario(s) and raises
``PropertyFailure`` (an ``AssertionError``) saying what broke, for which
scenario; ``harness.Unsupported`` from the backend propagates, and the suite
reports it against the backend's claim. The pytest suites in
``suites/conformance`` are thin wrappers over these, one test per property.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from harness.conformance.large_pool import (
    WATCHED_PAGES,
    changed_watched_slots,
    large_pool_inputs,
    watched_snapshot,
)
from harness.conformance.rank_steps import RankSteps
from harness.core.batches import BatchBuilder
from harness.core.errors import PropertyFailure, Unsupported
from harness.core.kv_pages import PagePool, PoolLayout, dp_page_range, pages_needed
from harness.core.registry import BackendEntry
from harness.numerics.canary import bits, changed_slots, snapshot
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


def _call(
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
    backend = _call(prop, entry, s, backend_for, entry, s)
    _call(prop, entry, s, backend.bind_kv_caches, inputs.caches)
    if prepare:
        _call(prop, entry, s, backend.prepare, inputs.step.metadata, graph_mode=s.graph_mode)
    return backend


def forward_layer(
    prop: str, entry: BackendEntry, inputs: StepInputs, backend: Any, layer: int
) -> torch.Tensor:
    return _call(prop, entry, inputs.scenario, backend.forward, *inputs.forward_args(layer), layer)


def run_step(prop: str, entry: BackendEntry, inputs: StepInputs) -> list[torch.Tensor]:
    """Bind, prepare and forward every layer on a fresh backend."""
    backend = bound_backend(prop, entry, inputs)
    return [
        forward_layer(prop, entry, inputs, backend, layer)
        for layer in range(inputs.scenario.num_layers)
    ]


def _assert_oracle(
    prop: str, entry: BackendEntry, inputs: StepInputs, outputs: list[torch.Tensor]
) -> None:
    s = inputs.scenario
    for layer, output in enumerate(outputs):
        expected = tuple(inputs.queries[layer].shape)
        if not isinstance(output, torch.Tensor) or tuple(output.shape) != expected:
            got = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output)
            raise fail(prop, entry, s, f"layer {layer}: output shape {got} != {expected}")
        if output.dtype != s.dtype:
            raise fail(prop, entry, s, f"layer {layer}: output dtype {output.dtype} != {s.dtype}")
    for layer in range(len(outputs)):
        problem = inputs.write_problem(layer)  # FP8 caches: stored values before the oracle
        if problem is not None:
            raise fail(prop, entry, s, f"layer {layer}: {problem}")
    for layer, result in enumerate(check_outputs(inputs, outputs)):
        if not result.passed:
            raise fail(prop, entry, s, f"layer {layer}: {result.describe()}")


# -- 1. partition: a rank keeps to its pages over many steps --------------------------

PARTITION_DECODE_STEPS = 2


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
    per_rank = max(sum(pages_needed(c + steps, s.page_size) for c in s.context_lens) for s in ranks)
    dp_size, total = ranks[0].dp_size, ranks[0].total_pages
    total = max(total, per_rank * dp_size + total % dp_size)  # room to decode
    group = [replace(s, layout=PoolLayout.SHARED, total_pages=total) for s in ranks]
    first = group[0]
    pool = PagePool(first.total_pages, first.dp_size, shuffle_seed=first.seed)
    caches = scenario_caches(first)
    gen = torch.Generator().manual_seed(first.seed)
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
    _assert_oracle(
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
        _assert_oracle(prop, entry, inputs, outputs)


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
            raise fail(prop, entry, inputs.scenario, f"layer {layer}: non-finite output")


def check_ranks_together_equal_alone(entry: BackendEntry, ranks: Sequence[Scenario]) -> None:
    """Bit-identical, since each rank's tokens sit on the same physical pages both ways."""
    prop = "ranks run together equal each run alone"
    for inputs, together in _run_ranks_together(prop, entry, ranks):
        alone_inputs = make_step_inputs(inputs.scenario, pool=scenario_pool(ranks[0]))
        alone = run_step(prop, entry, alone_inputs)
        _assert_finite(prop, entry, inputs, together)
        for layer, (a, b) in enumerate(zip(together, alone, strict=True)):
            if not torch.equal(bits(a), bits(b)):
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
    _assert_oracle(prop, entry, inputs, outputs)
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


# -- 4. rejection of foreign pages and bad bindings ---------------------------------------


def _expect_value_error(
    prop: str, entry: BackendEntry, scenario: Scenario, what: str, fn: Callable[[], Any]
) -> None:
    try:
        fn()
    except ValueError:
        return
    raise fail(prop, entry, scenario, f"accepted {what} without raising ValueError")


def check_rejects_foreign_pages(entry: BackendEntry, scenario: Scenario) -> None:
    """A step of another rank (its pages, its slots) is refused by ``prepare``."""
    prop = "foreign pages are rejected"
    victim = scenario
    other = replace(scenario, dp_rank=(scenario.dp_rank + 1) % scenario.dp_size)
    inputs = make_step_inputs(victim)
    foreign = make_step_inputs(other).step.metadata
    backend = bound_backend(prop, entry, inputs, prepare=False)
    before = snapshot(inputs.caches)
    _expect_value_error(
        prop,
        entry,
        victim,
        f"rank {other.dp_rank}'s pages",
        lambda: backend.prepare(foreign, graph_mode=victim.graph_mode),
    )
    if any(changed_slots(inputs.caches, before)):
        raise fail(prop, entry, victim, "rejected prepare wrote to the cache")


def check_rejects_foreign_slot(entry: BackendEntry, scenario: Scenario) -> None:
    """One new token's slot moved onto another rank's page is refused by ``prepare``."""
    prop = "foreign slots are rejected"
    inputs = make_step_inputs(scenario)
    metadata = inputs.step.metadata
    slots = metadata.slot_mapping.clone()
    token = int((slots != -1).nonzero()[0])
    foreign_page = _foreign_page(scenario, 0)
    slots[token] = foreign_page * scenario.page_size + int(slots[token]) % scenario.page_size
    backend = bound_backend(prop, entry, inputs, prepare=False)
    _expect_value_error(
        prop,
        entry,
        scenario,
        f"slot {int(slots[token])} on page {foreign_page}",
        lambda: backend.prepare(
            replace(metadata, slot_mapping=slots), graph_mode=scenario.graph_mode
        ),
    )


def _foreign_page(scenario: Scenario, pick: int) -> int:
    """A page of a neighbouring rank: just past the rank's range or just before it."""
    own = dp_page_range(scenario.total_pages, scenario.dp_size, scenario.dp_rank)
    after, before = own.stop, own.start - 1
    choices = [p for p in (after, before) if 0 <= p < scenario.total_pages]
    return choices[pick % len(choices)]


def check_rejects_foreign_block_table_entry(entry: BackendEntry, scenario: Scenario) -> None:
    """One in-use block-table entry on another rank's page, every new slot its own.

    Tried on the last in-use entry of each of a few rows (the page a kernel
    reads last, ``ceil(seq_len / page_size) - 1``) and on one other in-use
    entry; each on a fresh backend, which must raise ``ValueError`` in
    ``prepare`` and write nothing.
    """
    prop = "a foreign in-use block-table entry is rejected"
    inputs = make_step_inputs(scenario)
    metadata = inputs.step.metadata
    rows = [i for i, row in enumerate(inputs.step.rows) if row.seq_id is not None]
    picker = torch.Generator().manual_seed(scenario.seed)
    chosen = [rows[int(i)] for i in torch.randperm(len(rows), generator=picker)[:3]]
    targets = []
    for row in chosen:
        in_use = pages_needed(int(metadata.seq_lens[row]), scenario.page_size)
        targets.append((row, in_use - 1))
    row = chosen[0]
    in_use = pages_needed(int(metadata.seq_lens[row]), scenario.page_size)
    targets.append((row, int(torch.randint(in_use, (1,), generator=picker))))
    for attempt, (row, column) in enumerate(dict.fromkeys(targets)):
        table = metadata.block_table.clone()
        page = _foreign_page(scenario, attempt)
        table[row, column] = page
        backend = bound_backend(prop, entry, inputs, prepare=False)
        before = snapshot(inputs.caches)
        _expect_value_error(
            prop,
            entry,
            scenario,
            f"block_table[{row}, {column}] = page {page} of another rank "
            f"(row {row} has {pages_needed(int(metadata.seq_lens[row]), scenario.page_size)} "
            "pages in use; no slot moved)",
            partial(
                backend.prepare,
                replace(metadata, block_table=table),
                graph_mode=scenario.graph_mode,
            ),
        )
        if any(changed_slots(inputs.caches, before)):
            raise fail(prop, entry, scenario, "rejected prepare wrote to the cache")


def check_stale_block_table_entries_ignored(entry: BackendEntry, scenario: Scenario) -> None:
    """Entries past a row's in-use pages hold stale ids, as engines leave them: never rejected.

    Every entry past the in-use ones (two extra columns included, and every
    entry of a graph-mode padding row) gets a page the row does not use:
    another rank's, or another row's of this rank. The step must run and
    match the oracle.
    """
    prop = "stale block-table entries past the in-use ones are ignored"
    inputs = make_step_inputs(scenario)
    metadata = inputs.step.metadata
    table = metadata.block_table
    table = torch.cat([table, torch.full_like(table[:, :2], -1)], dim=1)
    picker = torch.Generator().manual_seed(scenario.seed)
    for row, step_row in enumerate(inputs.step.rows):
        in_use = pages_needed(step_row.seq_len, scenario.page_size)
        used = set(step_row.pages)
        stale = [p for p in range(scenario.total_pages) if p not in used]
        for column in range(in_use, table.shape[1]) if stale else ():
            table[row, column] = stale[int(torch.randint(len(stale), (1,), generator=picker))]
    stale_step = replace(inputs.step, metadata=replace(metadata, block_table=table))
    stale_inputs = replace(inputs, step=stale_step)
    _assert_oracle(prop, entry, stale_inputs, run_step(prop, entry, stale_inputs))


def check_bind_rejects_unbound_range(entry: BackendEntry, scenario: Scenario) -> None:
    """Per-rank tensors of another rank, or of the wrong head geometry, are refused."""
    prop = "bind_kv_caches rejects caches that do not hold the rank's pages"
    other = (scenario.dp_rank + 1) % scenario.dp_size
    s = replace(scenario, layout=PoolLayout.PER_RANK)
    caches = scenario_caches(s, dp_rank=other)
    backend = _call(prop, entry, s, backend_for, entry, s)
    if dp_page_range(s.total_pages, s.dp_size, other) != dp_page_range(
        s.total_pages, s.dp_size, s.dp_rank
    ):
        _expect_value_error(
            prop, entry, s, f"rank {other}'s per-rank cache", lambda: backend.bind_kv_caches(caches)
        )
    wrong = scenario_caches(s, layout=PoolLayout.SHARED, num_kv_heads=s.num_kv_heads + 1)
    _expect_value_error(
        prop,
        entry,
        s,
        "a cache with num_kv_heads + 1",
        lambda: backend_for(entry, s).bind_kv_caches(wrong),
    )


BAD_CONSTRUCTOR_VALUES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("num_heads", {"num_heads": 0}),
    ("num_kv_heads", {"num_kv_heads": -1}),
    ("head_dim", {"head_dim": 0}),
    ("num_heads", {"num_heads": 3, "num_kv_heads": 2}),
    ("scale", {"scale": float("nan")}),
    ("scale", {"scale": float("inf")}),
    ("scale", {"scale": -0.5}),
    ("scale", {"scale": 0.0}),
    ("dp_size", {"dp_size": 0, "dp_rank": 0}),
    ("dp_rank", {"dp_size": 2, "dp_rank": 2}),
    ("dp_rank", {"dp_size": 2, "dp_rank": -1}),
)


def check_constructor_rejects(entry: BackendEntry, field: str, changes: dict[str, Any]) -> None:
    prop = "constructor rejects bad values"
    args: dict[str, Any] = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "scale": 0.5}
    if "dp_size" in changes and not entry.accepts_dp:
        raise Unsupported("backend is not DP-aware")
    try:
        entry.cls(**(args | changes))
    except ValueError as exc:
        if field not in str(exc):
            raise fail(
                prop, entry, None, f"{changes}: ValueError does not name {field!r}: {exc}"
            ) from exc
        return
    raise fail(prop, entry, None, f"{changes} accepted without ValueError")


BAD_VARIANT_VALUES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("sliding_window", {"sliding_window": 0}),
    ("sliding_window", {"sliding_window": -4}),
    ("logits_soft_cap", {"logits_soft_cap": float("nan")}),
    ("logits_soft_cap", {"logits_soft_cap": float("inf")}),
    ("logits_soft_cap", {"logits_soft_cap": -30.0}),
    ("sinks", {"sinks": "wrong-shape"}),
    ("alibi_slopes", {"alibi_slopes": "wrong-shape"}),
    ("kv_cache_dtype", {"kv_cache_dtype": "fp4"}),
    ("k_scale", {"kv_cache_dtype": "fp8", "k_scale": 0.0}),
    ("v_scale", {"kv_cache_dtype": "fp8", "v_scale": -1.0}),
    ("k_scale", {"kv_cache_dtype": "fp8", "k_scale": float("nan")}),
)
"""Bad variant keywords; ``"wrong-shape"`` and ``"fp8"`` are filled in per backend."""

_VARIANT_FLAGS = {
    "sliding_window": "sliding_window",
    "logits_soft_cap": "soft_cap",
    "sinks": "sinks",
    "alibi_slopes": "alibi",
}


def variant_keyword_claimed(caps: Any, keyword: str) -> bool:
    """Whether a backend with ``caps`` takes the variant ``keyword`` at all."""
    flag = _VARIANT_FLAGS.get(keyword)
    if flag is not None:
        return bool(getattr(caps, flag))
    return any(d != "auto" for d in caps.kv_cache_dtypes)


def check_variant_constructor_rejects(
    entry: BackendEntry, keyword: str, changes: dict[str, Any]
) -> None:
    """A claimed variant's bad value is a ``ValueError`` naming the keyword."""
    prop = "constructor rejects bad variant values"
    fp8 = [d for d in entry.capabilities.kv_cache_dtypes if d != "auto"]
    args: dict[str, Any] = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "scale": 0.5}
    filled = dict(changes)
    if filled.get("kv_cache_dtype") == "fp8":
        filled["kv_cache_dtype"] = fp8[0]
    if filled.get(keyword) == "wrong-shape":
        filled[keyword] = torch.zeros(3)  # num_heads is 4
    try:
        entry.cls(**(args | filled))
    except ValueError as exc:
        if keyword not in str(exc):
            raise fail(
                prop, entry, None, f"{changes}: ValueError does not name {keyword!r}: {exc}"
            ) from exc
        return
    raise fail(prop, entry, None, f"{filled} accepted without ValueError")


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
        output = _call(prop, entry, scenario, backend.forward, *args, layer)
        for name, tensor, copy in zip(("query", "key", "value"), args, copies, strict=True):
            if not torch.equal(bits(tensor), copy):
                raise fail(prop, entry, scenario, f"forward(layer {layer}) modified {name}")
        real = real_rows(inputs)
        if output.shape != args[0].shape or output.dtype != args[0].dtype:
            raise fail(
                prop,
                entry,
                scenario,
                f"output {tuple(output.shape)} {output.dtype}, "
                f"expected {tuple(args[0].shape)} {args[0].dtype}",
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
    _assert_oracle(prop, entry, a, out_a)
    s = a.scenario
    for layer, (x, y) in enumerate(zip(out_a, out_b, strict=True)):
        exact, naive = a.reference(layer)  # computed once, in _assert_oracle
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
    for layer, (a, b) in enumerate(zip(first, second, strict=True)):
        if not torch.equal(bits(a), bits(b)):
            raise fail(prop, entry, scenario, f"layer {layer}: second run differs")


# -- optional outputs: the log-sum-exp and out= buffers -----------------------------------


def check_lse_matches_oracle(entry: BackendEntry, scenario: Scenario) -> None:
    """``forward_with_lse`` returns the same output as ``forward`` would, and the oracle's LSE."""
    prop = "forward_with_lse matches the oracle"
    inputs = make_step_inputs(scenario)
    backend = bound_backend(prop, entry, inputs)
    outputs, lses = [], []
    for layer in range(scenario.num_layers):
        result = _call(
            prop, entry, scenario, backend.forward_with_lse, *inputs.forward_args(layer), layer
        )
        if not isinstance(result, tuple) or len(result) != 2:
            raise fail(prop, entry, scenario, f"returned {type(result).__name__}, not (out, lse)")
        outputs.append(result[0])
        lses.append(result[1])
    _assert_oracle(prop, entry, inputs, outputs)
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
        wide = torch.full(
            (*query.shape[:-1], query.shape[-1] * width + 2),
            OUT_BUFFER_FILL,
            dtype=query.dtype,
            device=query.device,
        )
        buffer = wide[..., 1 : 1 + query.shape[-1] * width : width]
        before = bits(wide)
        result = _call(
            prop, entry, scenario, backend.forward, *inputs.forward_args(layer), layer, out=buffer
        )
        if result is not buffer and not (
            isinstance(result, torch.Tensor)
            and result.data_ptr() == buffer.data_ptr()
            and result.stride() == buffer.stride()
        ):
            raise fail(prop, entry, scenario, f"layer {layer}: the result is not the out buffer")
        outside = torch.ones_like(wide, dtype=torch.bool)
        outside[..., 1 : 1 + query.shape[-1] * width : width] = False
        if not torch.equal(bits(wide)[outside.cpu()], before[outside.cpu()]):
            raise fail(prop, entry, scenario, f"layer {layer}: wrote outside the out buffer")
        outputs.append(buffer.clone())
    _assert_oracle(prop, entry, inputs, outputs)
