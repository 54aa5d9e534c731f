"""Exact FLOP and byte counts for hand-worked ragged batches; rates, roofline, ceilings."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.bench.ceilings import (
    Ceilings,
    ProbeRound,
    RunCeilings,
    datasheet_for,
    probe,
    run_ceilings,
    spread,
    spread_flags,
)
from harness.bench.metrics import AttentionWork, keys_seen, rates, roofline, work_of_rows

H, KV, D, FP32 = 4, 2, 8, 4


def work(rows, causal=True, element_bytes=FP32):
    return work_of_rows(
        rows, num_heads=H, num_kv_heads=KV, head_dim=D, element_bytes=element_bytes, causal=causal
    )


# -- keys seen, worked by hand -------------------------------------------------------


@pytest.mark.parametrize(
    ("q", "length", "causal", "expected"),
    [
        (1, 5, True, 5),  # decode: the one new token sees all 5
        (4, 4, True, 1 + 2 + 3 + 4),  # prefill: token p sees p + 1
        (3, 7, True, 5 + 6 + 7),  # extend: positions 4, 5, 6
        (3, 7, False, 3 * 7),  # non-causal: everything
        (4, 4, False, 16),
        (1, 5, False, 5),
    ],
)
def test_keys_seen_by_hand(q, length, causal, expected):
    assert keys_seen(q, length, causal) == expected


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 40), st.integers(0, 40), st.booleans())
def test_keys_seen_equals_the_visible_mask(q, extra, causal):
    length = q + extra
    positions = range(length - q, length)
    brute = sum(length if not causal else p + 1 for p in positions)
    assert keys_seen(q, length, causal) == brute


# -- whole batches, worked by hand (H=4, KV=2, D=8, fp32) --------------------------------
# Per token: Q and O are H*D*4 = 128 bytes each; new K+V are 2*KV*D*4 = 128 bytes.
# Per cached token read: K+V = 2*KV*D*4 = 128 bytes.  FLOPs per key seen: 4*H*D = 128.

CASES = {
    # name: rows (q, L), causal, keys seen, tokens, total context
    "decode": ([(1, 5), (1, 9)], True, 5 + 9, 2, 14),
    "prefill": ([(4, 4), (2, 2)], True, 10 + 3, 6, 6),
    "extend": ([(3, 7)], True, 18, 3, 7),
    "mixed": ([(1, 5), (4, 4), (3, 7)], True, 5 + 10 + 18, 8, 16),
    "mixed non-causal": ([(1, 5), (4, 4), (3, 7)], False, 5 + 16 + 21, 8, 16),
    "prefill non-causal": ([(4, 4), (2, 2)], False, 16 + 4, 6, 6),
}


@pytest.mark.parametrize("name", CASES)
def test_flops_and_bytes_of_ragged_batches(name):
    rows, causal, keys, tokens, context = CASES[name]
    w = work(rows, causal)
    assert w.keys_seen == keys
    assert w.num_tokens == tokens
    assert w.flops == 128 * keys
    assert w.query_bytes == 128 * tokens
    assert w.kv_read_bytes == 128 * context
    assert w.kv_write_bytes == 128 * tokens
    assert w.bytes == 128 * tokens * 3 + 128 * context


def test_mixed_batch_totals_spelled_out():
    w = work([(1, 5), (4, 4), (3, 7)])
    assert w.flops == 4 * 4 * 8 * 33 == 4224
    assert w.bytes == 1024 + 1024 + 2048 + 1024 == 5120
    assert w.arithmetic_intensity == pytest.approx(4224 / 5120)


def test_element_size_scales_bytes_not_flops():
    rows = [(1, 5), (4, 4)]
    assert work(rows, element_bytes=2).bytes * 2 == work(rows).bytes
    assert work(rows, element_bytes=2).flops == work(rows).flops


def test_mla_reads_one_latent_row_per_token_for_every_head():
    """DeepSeek's 512 + 64 under 16 heads, bf16, decode over 1000 and 24 keys: each cached
    token is one 576-entry latent row read once (no separate value row), each new token
    writes one; Q is 576 wide per head, O 512; a key seen costs 16 * (576 + 512) * 2 FLOPs."""
    w = AttentionWork(
        num_heads=16,
        num_kv_heads=1,
        head_dim=576,
        element_bytes=2,
        query_lens=(1, 1),
        seq_lens=(1000, 24),
        kv_lora_rank=512,
    )
    assert w.kv_bytes_per_token == 576 * 2
    assert w.kv_read_bytes == 1024 * 576 * 2
    assert w.kv_write_bytes == 2 * 576 * 2
    assert w.query_bytes == 2 * 16 * 576 * 2
    assert w.output_bytes == 2 * 16 * 512 * 2
    assert w.flops == 2 * 16 * (576 + 512) * 1024
    as_mha = AttentionWork(
        num_heads=16, num_kv_heads=1, head_dim=576, element_bytes=2,
        query_lens=(1, 1), seq_lens=(1000, 24),
    )  # fmt: skip
    assert as_mha.kv_read_bytes == 2 * w.kv_read_bytes  # K and V rows: what MLA does not read


def test_graph_mode_padding_rows_are_not_work():
    padded = AttentionWork(
        num_heads=H,
        num_kv_heads=KV,
        head_dim=D,
        element_bytes=FP32,
        query_lens=(1, 4, 2),
        seq_lens=(5, 4, 0),
    )
    assert padded.flops == work([(1, 5), (4, 4)]).flops
    assert padded.bytes == work([(1, 5), (4, 4)]).bytes


@pytest.mark.parametrize("rows", [[(5, 4)], [(-1, 3)]])
def test_impossible_rows_are_rejected(rows):
    with pytest.raises(ValueError, match="query_len"):
        work(rows)


# -- rates and roofline --------------------------------------------------------------


def test_rates():
    w = work([(1, 5), (4, 4), (3, 7)])
    r = rates(w, 2.0)
    assert r.tokens_per_s == 4
    assert r.flops_per_s == 2112
    assert r.tflops == 2112 / 1e12
    assert r.bytes_per_s == 2560
    assert r.gbps == 2560 / 1e9
    with pytest.raises(ValueError, match="seconds"):
        rates(w, 0.0)


def test_roofline_fractions_and_bound():
    w = work([(1, 5), (4, 4), (3, 7)])  # 4224 FLOPs, 5120 bytes in 1 s
    roof = roofline(w, 1.0, bandwidth=10_240.0, flops=42_240.0)
    assert roof.bandwidth_fraction == pytest.approx(0.5)
    assert roof.compute_fraction == pytest.approx(0.1)
    assert roof.roofline_fraction == pytest.approx(0.5)
    assert roof.bound == "memory"
    assert roof.flags == ()


def test_above_100_percent_of_a_ceiling_is_flagged_and_never_reported():
    w = work([(1, 5)])  # in 1 s: 2.2 times the bandwidth ceiling, a tenth of the compute one
    roof = roofline(w, 1.0, bandwidth=w.bytes / 2.2, flops=w.flops * 10.0)
    assert roof.bandwidth_fraction is None  # withheld, not 220%
    assert roof.withheld == ("bandwidth",)
    assert roof.compute_fraction == pytest.approx(0.1)  # the other ceiling still holds
    assert roof.roofline_fraction is None  # the larger of the two is unknown
    assert roof.bound is None
    assert len(roof.flags) == 1
    assert roof.flags[0].startswith("measurement error: bandwidth at 220% of its ceiling")


def test_unknown_ceilings_give_no_fractions():
    roof = roofline(work([(1, 5)]), 1.0, bandwidth=None, flops=None)
    assert roof.roofline_fraction is None
    assert roof.bound is None
    assert roof.flags == ()


# -- ceilings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "product", "bandwidth"),
    [
        ("NVIDIA H200", "H200 SXM", 4.8e12),
        ("NVIDIA H200 NVL", "H200 NVL", 4.8e12),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 3.35e12),
        ("NVIDIA H100 PCIe", "H100 PCIe", 2.0e12),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", 2.039e12),
    ],
)
def test_datasheet_fallback_is_labelled(name, product, bandwidth):
    sheet = datasheet_for(name)
    assert sheet is not None
    assert sheet.source == "datasheet"
    assert sheet.device_name == product
    assert sheet.memory_bandwidth == bandwidth
    assert sheet.flops_for("bfloat16") > sheet.flops_for("float32")
    assert "datasheet" in sheet.details["note"]


def test_unknown_device_has_no_datasheet():
    assert datasheet_for("AMD EPYC") is None


def test_probe_measures_copy_and_matmul_on_this_cpu():
    c = probe("cpu", dtypes=(torch.float32,))
    assert c.source == "measured"
    assert c.memory_bandwidth is not None
    assert c.memory_bandwidth > 1e8
    assert c.flops_for("float32") > 1e8
    assert c.details["copy"]["bytes"] > 0
    assert c.details["matmul_float32"]["n"] >= 256


def test_the_matmul_ceiling_is_the_best_of_every_gemm_path_torch_has():
    """MKL (``torch.matmul``) runs AVX2 kernels on AMD CPUs: oneDNN's GEMM is timed too."""
    c = probe("cpu", dtypes=(torch.float32,), copy=False)
    found = c.details["matmul_float32"]
    paths = found["paths"]
    assert "torch.matmul" in paths
    if torch.backends.mkldnn.is_available():
        assert "onednn" in paths
    rates = {name: p["flops"] for name, p in paths.items() if "flops" in p}
    assert found["path"] == max(rates, key=rates.__getitem__)
    assert c.flops_for("float32") == max(rates.values())


def test_run_ceilings_prefer_measured_and_round_trip():
    measured = Ceilings("measured", "x", 1e10, {"float32": 1e11})
    sheet = Ceilings("datasheet", "H200 SXM", 4.8e12, {"float32": 6.7e13})
    both = RunCeilings(measured, sheet)
    assert both.used is measured
    assert RunCeilings(None, sheet).used is sheet
    assert RunCeilings.from_json(both.to_json()) == both
    assert both.to_json()["used"] == "measured"
    assert run_ceilings("cpu", measure_probe=False).to_json() == {
        "used": None,
        "measured": None,
        "datasheet": None,
    }


# -- probe rounds: the best of each ceiling, every sample, the spread ------------------


def _round(when, at_s, bandwidth, fp32, **details):
    return ProbeRound(
        when, at_s, Ceilings("measured", "cpu", bandwidth, {"float32": fp32}, details)
    )


def test_probe_rounds_keep_each_ceilings_best_and_every_round():
    busy = _round("before", 0.0, 20e9, 36e9, copy={"samples_ns": [9, 8]})
    quiet = _round("after", 90.0, 18e9, 107e9, matmul_float32={"samples_ns": [3, 2], "n": 512})
    ceilings = run_ceilings("cpu", measure_probe=False).with_round(busy).with_round(quiet)
    assert ceilings.measured is not None
    assert ceilings.measured.memory_bandwidth == 20e9  # the first round's copy was the best
    assert ceilings.measured.flops_for("float32") == 107e9  # the second's matmul
    assert ceilings.measured.details["matmul_float32"] == {
        "samples_ns": [3, 2],
        "n": 512,
        "round": 1,
    }
    assert ceilings.measured.details["copy"]["round"] == 0
    spread = ceilings.spread()
    assert spread["matmul_float32"] == {
        "low": 36e9,
        "best": 107e9,
        "rounds": 2,
        "spread": pytest.approx(71 / 107),
    }
    assert spread["copy"]["spread"] == pytest.approx(0.1)
    data = ceilings.to_json()
    assert [r["when"] for r in data["probes"]] == ["before", "after"]
    assert data["probes"][1]["details"]["matmul_float32"]["samples_ns"] == [3, 2]
    assert RunCeilings.from_json(data).to_json() == data  # every round survives the file


def test_a_wide_spread_between_rounds_is_flagged_and_a_narrow_one_is_not():
    wide = spread([_round("before", 0, 20e9, 36e9), _round("after", 9, 21e9, 107e9)])
    flags = spread_flags(wide)
    assert flags == [
        "ceiling spread: float32 matmul 36 GFLOP/s to 107 GFLOP/s over 2 probes (66%); "
        "the machine was busy during some, the best is used"
    ]
    assert spread_flags(spread([_round("before", 0, 20e9, 36e9)])) == []  # one round: no spread
    assert spread_flags(wide, limit=0.7) == []


def test_a_probe_round_can_measure_only_the_ceilings_asked_for():
    c = probe("cpu", dtypes=(torch.float32,), copy=False)
    assert c.memory_bandwidth is None
    assert "copy" not in c.details
    assert len(c.details["matmul_float32"]["samples_ns"]) >= 5
