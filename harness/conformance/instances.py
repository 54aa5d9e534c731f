"""Process-level state: several instances of one backend alive together, steps interleaved.

An engine keeps one backend instance per layer (Gemma's local and global
layers differ in window; gpt-oss's in sinks; every layer has its own FP8
scales) and sometimes two models in one process, and it plans a step once
for every layer. A kernel that caches a plan, a wrapper or a compiled
specialization keyed by the batch or by shapes, and not by every value of
its configuration, is right for each instance alone and wrong for the one
that runs after another: the ``ci`` draws of a single instance never see it.

``instance_groups`` draws one step from the whole conformance space (the
same draws as every property, production shapes included) and two or three
configurations of it that differ in scale, sliding window, soft-cap, sinks,
ALiBi, FP8 scales or head count, inside the backend's claim.
``check_instances_interleaved`` builds an instance of each, prepares them
all on the very same metadata object (as an engine hands one step to every
layer), runs their layers interleaved, and checks each against the oracle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from hypothesis import strategies as st

from harness.conformance.properties import (
    assert_matches_oracle,
    bound_backend,
    call_backend,
    forward_layer,
)
from harness.conformance.step_strategies import scenarios
from harness.conformance.strategies import CI_BUDGET, Budget, balanced, with_variant
from harness.core.contract import Capabilities
from harness.core.errors import PropertyFailure
from harness.core.registry import BackendEntry
from harness.numerics.scenario import Scenario, make_step_inputs

INSTANCE_COUNTS = (2, 3)
SCALE_FACTORS = (0.5, 2.0, 0.25, 1.5)
"""Another instance's scale, as a multiple of the first's (a query pre-attention scalar, a
YaRN factor): never equal to it."""


def _config(draw: st.DrawFn, caps: Capabilities, first: Scenario, budget: Budget) -> Scenario:
    """Another configuration of ``first``'s step: the same batch, pool and inputs' seed.

    Its variant is drawn anew inside the claim (window, soft-cap, sinks, ALiBi,
    FP8 scales), its head count sometimes changes (another model), and its
    scale always does, so no two instances are configured alike.
    """
    heads = first.num_heads
    groups = [g for g in (1, 2, 4) if first.num_kv_heads * g <= budget.max_heads]
    if draw(st.booleans()) and groups:
        heads = first.num_kv_heads * draw(balanced(groups))
    scale = first.softmax_scale * draw(balanced(SCALE_FACTORS))
    other = with_variant(draw, caps, replace(first, num_heads=heads, scale=scale))
    return replace(other, cache_layout=first.cache_layout)


@st.composite
def instance_groups(
    draw: st.DrawFn,
    caps: Capabilities,
    *,
    dp_aware: bool = True,
    budget: Budget = CI_BUDGET,
    device: str = "cpu",
) -> list[Scenario]:
    """Two or three configurations of one drawn step (see the module's docstring)."""
    first = draw(scenarios(caps, dp_aware=dp_aware, budget=budget, device=device))
    count = draw(balanced(INSTANCE_COUNTS))
    return [first, *(_config(draw, caps, first, budget) for _ in range(count - 1))]


def check_instances_interleaved(entry: BackendEntry, group: Sequence[Scenario]) -> None:
    """Every instance of ``group`` prepared on one metadata object, layers interleaved,
    each output checked against its own oracle."""
    prop = "instances configured differently, interleaved in one process"
    all_inputs = [make_step_inputs(s) for s in group]
    shared = all_inputs[0].step.metadata
    for inputs in all_inputs[1:]:
        mine = inputs.step.metadata
        same = all(
            torch.equal(getattr(mine, name), getattr(shared, name))
            for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping")
        )
        if not same:  # the draws keep the batch and the pool: this is the harness's own error
            raise RuntimeError("instances of one step were built with different metadata")
    backends = [bound_backend(prop, entry, inputs, prepare=False) for inputs in all_inputs]
    for inputs, backend in zip(all_inputs, backends, strict=True):
        s = inputs.scenario
        call_backend(prop, entry, s, backend.prepare, shared, graph_mode=s.graph_mode)
    outputs: list[list[torch.Tensor]] = [[] for _ in group]
    for layer in range(group[0].num_layers):
        for index, (inputs, backend) in enumerate(zip(all_inputs, backends, strict=True)):
            outputs[index].append(forward_layer(prop, entry, inputs, backend, layer))
    for index, (inputs, output) in enumerate(zip(all_inputs, outputs, strict=True)):
        try:
            assert_matches_oracle(prop, entry, inputs, output)
        except PropertyFailure as exc:
            others = "".join(
                f"\n  alive beside it: {s.describe()}" for i, s in enumerate(group) if i != index
            )
            where = f"instance {index + 1} of {len(group)}"
            raise PropertyFailure(f"{exc}\n  {where}{others}") from None
