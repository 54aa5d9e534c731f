"""The rejection properties: what a backend must refuse on valid-looking input, and what not.

Property 4 of the suite (``harness.conformance.properties`` holds the
others and the helpers these share): ``prepare`` refuses a step that reaches
another rank's pages, through its slots or an in-use block-table entry, and
writes nothing when it does, but ignores stale entries past the in-use ones;
``bind_kv_caches`` refuses caches that do not hold the rank's pages; the
constructor refuses bad values, a claimed variant's included. Each raises
``PropertyFailure`` saying what broke, for which scenario.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from harness.conformance.properties import (
    assert_matches_oracle,
    bound_backend,
    call_backend,
    fail,
    run_step,
)
from harness.core.errors import Unsupported
from harness.core.kv_pages import PoolLayout, dp_page_range, pages_needed
from harness.core.registry import BackendEntry, HeadConfig
from harness.numerics.canary import changed_slots, snapshot
from harness.numerics.scenario import Scenario, backend_for, make_step_inputs, scenario_caches


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
    assert_matches_oracle(prop, entry, stale_inputs, run_step(prop, entry, stale_inputs))


def check_bind_rejects_unbound_range(entry: BackendEntry, scenario: Scenario) -> None:
    """Per-rank tensors of another rank, or of the wrong head geometry, are refused."""
    prop = "bind_kv_caches rejects caches that do not hold the rank's pages"
    other = (scenario.dp_rank + 1) % scenario.dp_size
    s = replace(scenario, layout=PoolLayout.PER_RANK)
    caches = scenario_caches(s, dp_rank=other)
    backend = call_backend(prop, entry, s, backend_for, entry, s)
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


VALID_HEADS = HeadConfig(num_heads=4, num_kv_heads=2, head_dim=8, scale=0.5)
"""Valid constructor values; each bad value below replaces one or two of them."""


def _expect_constructor_error(
    prop: str, entry: BackendEntry, changes: dict[str, Any], name: str, filled: dict[str, Any]
) -> None:
    """The constructor given ``filled`` over valid values raises a ``ValueError`` naming
    ``name`` (``changes``: the bad values as the table writes them)."""
    try:
        entry.cls(**(VALID_HEADS.kwargs() | filled))
    except ValueError as exc:
        if name not in str(exc):
            raise fail(
                prop, entry, None, f"{changes}: ValueError does not name {name!r}: {exc}"
            ) from exc
        return
    raise fail(prop, entry, None, f"{filled} accepted without ValueError")


def check_constructor_rejects(entry: BackendEntry, field: str, changes: dict[str, Any]) -> None:
    if "dp_size" in changes and not entry.accepts_dp:
        raise Unsupported("backend is not DP-aware")
    prop = "constructor rejects bad values"
    _expect_constructor_error(prop, entry, changes, field, changes)


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
    filled = dict(changes)
    if filled.get("kv_cache_dtype") == "fp8":
        filled["kv_cache_dtype"] = fp8[0]
    if filled.get(keyword) == "wrong-shape":
        filled[keyword] = torch.zeros(3)  # num_heads is 4
    _expect_constructor_error(prop, entry, changes, keyword, filled)
