"""The graph-mode check: what runs without a GPU (argument handling, eager checks, reporting).

Capture, replay and the sync-debug check need CUDA; on the CPU the same
comparisons run with a second instance's eager ``forward`` standing in for
the replay, so everything but those two calls is exercised here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from harness.core.registry import BackendEntry
from harness.gpu import graph_check
from harness.gpu.graph_check import FAIL, PASS, SKIP, main, run
from harness.gpu.graph_steps import SHAPES, GraphShape
from reference_backends import ReferenceBackend, SdpaBackend
from tests.fixtures import bench_backends as fx

# the production-ish shapes' structure (decode + padding, mixed with extend), at test size
TINY = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "page_size": 4}
SMALL = (
    GraphShape("decode", (37, 16, 9), (1, 1, 1), pad_rows=2, **TINY),
    GraphShape("mixed", (21, 30, 8), (1, 7, 8), pad_rows=2, pad_query_len=3, **TINY),
)


def entry(cls: type, name: str | None = None) -> BackendEntry:
    return BackendEntry(name or cls.__name__, cls, "test")


def check(cls: type, dtype: torch.dtype = torch.float32):
    (result,) = run([entry(cls)], device="cpu", dtype=dtype, shapes=SMALL, echo=False)
    return result


class PaddedRowsNaN(SdpaBackend):
    """Correct, with NaN in the padded rows' outputs: those rows are never checked."""

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_idx: int
    ) -> torch.Tensor:
        out = super().forward(query, key, value, layer_idx).clone()
        assert self._step is not None
        slots = torch.tensor(self._step.checked.slots)
        real = torch.tensor(self._step.checked.seq_lens)
        starts = self._step.checked.query_start
        for row, length in enumerate(real.tolist()):
            if length == 0:
                out[starts[row] : starts[row + 1]] = float("nan")
        assert (slots[-1] == -1).item()
        return out


class WritesStraySlot(SdpaBackend):
    """Correct output, but also writes the pool's last page (no row owns it)."""

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_idx: int
    ) -> torch.Tensor:
        out = super().forward(query, key, value, layer_idx)
        self._caches[layer_idx].key[-1, 0] = 0
        return out


class Memoizes(SdpaBackend):
    """Returns its first call's output ever after: right once, stale on new contents."""

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_idx: int
    ) -> torch.Tensor:
        if not hasattr(self, "first"):
            self.first = super().forward(query, key, value, layer_idx)
        return self.first


class SecondInstanceDiffers(SdpaBackend):
    """Every instance after the first adds one rounding's worth of noise: within the bound."""

    made = 0

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        SecondInstanceDiffers.made += 1
        self.nudge = SecondInstanceDiffers.made > 1

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_idx: int
    ) -> torch.Tensor:
        out = super().forward(query, key, value, layer_idx)
        return out * (1 + 2e-7) if self.nudge else out


@pytest.mark.parametrize("cls", [SdpaBackend, ReferenceBackend])
def test_correct_backends_pass_on_cpu(cls):
    result = check(cls)
    assert result.status == PASS, result.reason
    assert len(result.shapes) == 2
    for shape in result.shapes:
        assert shape.eager["passed"]
        assert shape.replay["passed"]
        assert shape.replay_max_abs_diff == 0.0
        assert any(note.startswith("cpu:") for note in shape.notes)
    assert "no sync check, no capture" in result.reason


def test_padded_rows_are_not_checked():
    assert check(PaddedRowsNaN).status == PASS


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (fx.ScaledOutputBackend, "vs float64 oracle"),
        (fx.SkipsCacheWriteBackend, "not written"),
        (WritesStraySlot, "outside slot_mapping written"),
        (fx.WrongShapeBackend, "forward returned"),
        (fx.RejectsBackend, "constructing or preparing"),
        (Memoizes, "replay vs float64 oracle"),
    ],
)
def test_a_wrong_backend_fails_and_says_why(cls, expected):
    result = check(cls)
    assert result.status == FAIL
    assert expected in result.reason
    assert result.line().startswith(f"FAIL {cls.__name__}: ")


def test_a_replay_that_differs_within_the_bound_is_a_note_not_a_failure():
    SecondInstanceDiffers.made = 0
    result = check(SecondInstanceDiffers)
    assert result.status == PASS, result.reason
    assert any("not bit-identical" in n for s in result.shapes for n in s.notes)


def test_a_backend_without_graph_mode_is_skipped():
    result = check(fx.NoGraphModeBackend)
    assert result.status == SKIP
    assert "graph_mode" in result.reason


def test_a_dtype_outside_the_claim_is_skipped():
    result = check(fx.Bf16OnlyBackend, dtype=torch.float32)
    assert result.status == SKIP
    assert "dtype" in result.reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_cuda_it_exits_2_and_says_so(capsys):
    assert main(["--backend", "sdpa"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err
    assert "--device cpu" in err


def test_cpu_dry_run_writes_the_summary(tmp_path, capsys):
    path = tmp_path / "graph.json"
    code = main(
        ["--device", "cpu", "--backend", "sdpa", "--backend", "no-such", "--json", str(path)]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "SKIP no-such: not registered" in out
    assert "PASS sdpa: 2 shapes" in out
    data = json.loads(path.read_text())
    assert data["exit_code"] == 0
    assert data["dtype"] == "bfloat16"
    assert [b["status"] for b in data["backends"]] == [SKIP, PASS]
    assert [s["name"] for s in data["shapes"]] == [s.name for s in SHAPES]
    assert data["shapes"][0]["pad_rows"] > 0
    sdpa = data["backends"][1]
    assert all(s["status"] == PASS and s["replay"]["passed"] for s in sdpa["shapes"])


def test_nothing_checked_is_a_failure(tmp_path, capsys):
    assert main(["--device", "cpu", "--backend", "no-such"]) == 1
    assert "nothing could be checked" in capsys.readouterr().out


def test_an_unloadable_spec_is_skipped_with_its_error():
    entries, skipped = graph_check.resolve(["tests/fixtures/broken_backend.py:Nope"])
    assert entries == []
    (result,) = skipped
    assert result.status == SKIP
    assert "cannot be loaded" in result.reason
    assert "exploded" in result.reason


def test_production_shapes_are_graph_mode_bf16_at_production_heads():
    for shape in SHAPES:
        scenario = shape.scenario("cpu", torch.bfloat16)
        assert scenario.graph_mode
        assert (scenario.num_heads, scenario.num_kv_heads, scenario.head_dim) == (32, 8, 128)
        assert scenario.page_size == 16
    mixed = SHAPES[1]
    assert any(1 < q < n for q, n in zip(mixed.query_lens, mixed.context_lens, strict=True))
