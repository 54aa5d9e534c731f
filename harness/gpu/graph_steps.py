"""The steps the graph-mode check runs, and one step's buffers on the device.

``SHAPES`` are production-ish steps as an engine would capture them (bf16,
32/8 heads, head dim 128, page 16, padded rows at the end). ``GraphStep`` holds
one on the device with two contents for the same buffers, the checked step's
and another's with the same metadata, so ``harness.gpu.graph_check`` can
capture while the buffers hold one and replay on the other; it checks an
output against the float64 oracle and the cache against ``slot_mapping``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from typing import Any

import torch

from harness.bench.case_check import accepts_validate
from harness.core.kv_pages import pages_needed
from harness.core.registry import BackendEntry
from harness.numerics.canary import changed_slots, snapshot
from harness.numerics.scenario import (
    Scenario,
    StepInputs,
    backend_for,
    check_outputs,
    make_step_inputs,
)
from harness.numerics.tolerance import Comparison


@dataclass(frozen=True)
class GraphShape:
    """One step as an engine would capture it: real rows, then ``pad_rows`` padded requests."""

    name: str
    context_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    pad_rows: int
    pad_query_len: int = 1
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16

    def scenario(self, device: str, dtype: torch.dtype) -> Scenario:
        pages = sum(pages_needed(n, self.page_size) for n in self.context_lens)
        return Scenario(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            page_size=self.page_size,
            total_pages=pages + 8,  # spare pages: NaN memory no row owns
            num_layers=1,
            context_lens=self.context_lens,
            query_lens=self.query_lens,
            dtype=dtype,
            pad_to=len(self.context_lens) + self.pad_rows,
            pad_query_len=self.pad_query_len,
            planted_keys=2,  # a dropped or misplaced boundary key is a large error
            seed=zlib.crc32(self.name.encode()) & 0x7FFFFFFF,  # stable per shape
            device=device,
        )


SHAPES: tuple[GraphShape, ...] = (
    GraphShape("decode 8x1000 +2 padded", (1000,) * 8, (1,) * 8, pad_rows=2),
    GraphShape(
        "mixed 5 decode@1000 + extend 200/700 + prompt 64, +2 padded x3 tokens",
        (1000,) * 5 + (700, 64),
        (1,) * 5 + (200, 64),
        pad_rows=2,
        pad_query_len=3,
    ),
)


class GraphStep:
    """One shape's inputs on the device, with the contents to load into them between runs.

    ``inputs`` is the step that is checked. ``other`` is the same step
    (same metadata) with other values; the capture's warm-up runs on those,
    and the replay on ``inputs``' values loaded into the same buffers, as an
    engine replays with new contents: a graph that kept what it saw while
    being made, instead of reading its buffers, gives the other step's answer.
    """

    def __init__(self, shape: GraphShape, device: str, dtype: torch.dtype) -> None:
        self.shape = shape
        self.device = device
        scenario = shape.scenario(device, dtype)
        self.inputs: StepInputs = make_step_inputs(scenario)
        self.scenario = self.inputs.scenario
        other = make_step_inputs(replace(scenario, seed=scenario.seed + 1))
        for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping"):
            mine, theirs = (
                getattr(self.inputs.step.metadata, name),
                getattr(other.step.metadata, name),
            )
            if not torch.equal(mine, theirs):
                raise RuntimeError(f"the alternate step's {name} differs from the step's")
        self.args = self.inputs.forward_args(0)  # the buffers every run reads
        self.contents = {
            "checked": self._contents(self.inputs),
            "other": self._contents(other),
        }
        self.pristine_bits = snapshot(self.inputs.caches)
        slots = self.inputs.step.metadata.slot_mapping.tolist()
        self.expected_writes = {s for s in slots if s != -1}

    @staticmethod
    def _contents(inputs: StepInputs) -> list[torch.Tensor]:
        tensors = [t for c in inputs.caches for t in (c.key, c.value)]
        return [t.clone() for t in (*tensors, *inputs.forward_args(0))]

    def load(self, which: str = "checked") -> None:
        """Cache (as built: new tokens' slots unwritten) and inputs of ``which``, in place."""
        targets = [t for c in self.inputs.caches for t in (c.key, c.value)] + list(self.args)
        for target, source in zip(targets, self.contents[which], strict=True):
            target.copy_(source)

    def restore(self) -> None:
        self.load("checked")

    def forward_args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.args

    def prepared(self, entry: BackendEntry) -> Any:
        """A new instance, bound to the cache and prepared in graph mode."""
        kwargs: dict[str, Any] = {"validate": False} if accepts_validate(entry.cls) else {}
        backend = backend_for(entry, self.scenario, **kwargs)
        backend.bind_kv_caches(self.inputs.caches)
        backend.prepare(self.inputs.step.metadata, graph_mode=True)
        return backend

    def check_output(self, output: object) -> tuple[str | None, Comparison | None]:
        """``(problem, comparison)``: ``problem`` is ``None`` when it passes the oracle."""
        query, shape = self.inputs.queries[0], self.inputs.output_shape(0)
        if not isinstance(output, torch.Tensor):
            return f"forward returned {type(output).__name__}, not a tensor", None
        if tuple(output.shape) != shape or output.dtype != query.dtype:
            return (
                f"forward returned {tuple(output.shape)} {output.dtype}, "
                f"expected {shape} {query.dtype}",
                None,
            )
        (comparison,) = check_outputs(self.inputs, [output])
        if comparison.passed:
            return None, comparison
        return f"vs float64 oracle: {comparison.describe()}", comparison

    def write_problem(self) -> str | None:
        """What the last run wrote wrong: a new token left unwritten, or a stray slot."""
        (changed,) = changed_slots(self.inputs.caches, self.pristine_bits)
        missing = sorted(self.expected_writes - changed)
        stray = sorted(changed - self.expected_writes)
        parts = []
        if missing:
            parts.append(f"{len(missing)} new tokens' slots not written (first: {missing[:4]})")
        if stray:
            parts.append(f"{len(stray)} slots outside slot_mapping written (first: {stray[:4]})")
        return "; ".join(parts) or None

    def real_rows(self) -> torch.Tensor:
        return self.inputs.reference(0)[0].checked
