"""Workloads: named, versioned, both sizes, the batch kinds they promise, deterministic inputs."""

from __future__ import annotations

import math
import zlib
from dataclasses import replace

import pytest
import torch

from harness.bench.workloads import (
    DEFAULT_WORKLOADS,
    SIZES,
    CaseSpec,
    get_workload,
    list_workloads,
)
from harness.core.kv_pages import dp_page_range
from harness.numerics.scenario import make_step_inputs

SWEEP_KINDS = {"decode", "prefill", "extend", "mixed", "dp-scaling"}
KINDS = SWEEP_KINDS | {"targets"}  # the speed targets' cases run only when named
TINY = CaseSpec(
    "tiny", (9, 5, 7), (1, 5, 3), num_heads=4, num_kv_heads=2, head_dim=8, page_size=4, seed=11
)


def test_every_workload_is_named_versioned_and_sized_for_both_devices():
    assert {w.kind for w in list_workloads()} == KINDS
    for w in list_workloads():
        assert w.version >= 1
        assert w.key == f"{w.name}@{w.version}"
        for size in SIZES:
            names = [c.name for c in w.cases(size)]
            assert names, (w.name, size)
            assert len(set(names)) == len(names)


def test_the_default_run_covers_every_kind_of_workload_once():
    """``attn-harness bench`` with no ``--workload`` must not silently skip a batch kind."""
    assert len(set(DEFAULT_WORKLOADS)) == len(DEFAULT_WORKLOADS)
    assert {get_workload(name).kind for name in DEFAULT_WORKLOADS} == SWEEP_KINDS


def test_gpu_sizes_are_bf16_and_larger():
    for w in list_workloads():
        assert {c.dtype for c in w.gpu} == {"bfloat16"}
        assert {c.dtype for c in w.cpu} == {"float32"}
        assert sum(c.work().flops for c in w.gpu) > sum(c.work().flops for c in w.cpu)


@pytest.mark.parametrize("size", SIZES)
def test_batch_kinds_are_what_their_names_promise(size):
    def rows(name):
        return [
            list(zip(c.query_lens, c.context_lens, strict=True))
            for c in get_workload(name).cases(size)
        ]

    assert all(q == 1 for case in rows("decode-sweep") for q, _ in case)
    assert all(q == n for case in rows("prefill-sweep") for q, n in case)
    assert all(1 < q < n for case in rows("extend") for q, n in case)
    for case in rows("mixed"):
        assert len(set(case)) > 1  # ragged: rows of different shapes in one batch
    kinds = {(q == 1, q == n) for case in rows("mixed") for q, n in case}
    assert {(True, False), (False, True), (False, False)} <= kinds  # decode, prompt, chunk
    contexts = [c.context_lens[0] for c in get_workload("decode-sweep").cases(size)]
    assert contexts == sorted(contexts)
    assert len(set(contexts)) >= 4


@pytest.mark.parametrize("size", SIZES)
def test_dp_scaling_covers_dp_1_to_8_and_fits_each_rank(size):
    cases = get_workload("dp-scaling").cases(size)
    assert [c.dp_size for c in cases] == list(range(1, 9))
    global_batch = len(cases[0].context_lens)
    for c in cases:
        assert c.dp_rank == c.dp_size - 1
        assert len(c.context_lens) == math.ceil(global_batch / c.dp_size)
        assert c.layout == "per_rank"


def test_every_case_fits_its_ranks_page_range():
    for w in list_workloads():
        for size in SIZES:
            for c in w.cases(size):
                own = dp_page_range(c.total_pages, c.dp_size, c.dp_rank)
                needed = sum(math.ceil(n / c.page_size) for n in c.context_lens)
                assert len(own) >= needed, (w.name, c.name)


def test_seeds_are_stable_and_distinct():
    """Seeds come from the workload's and the case's names (crc32), not from ``hash()`` or a
    global generator: the same in every process, run and version, so inputs can be rebuilt."""
    for size in SIZES:
        seeds = [c.seed for w in list_workloads() for c in w.cases(size)]
        assert len(set(seeds)) == len(seeds), size
    for w in list_workloads():
        for c in w.cpu + w.gpu:
            assert c.seed == zlib.crc32(f"{w.name}/{c.name}".encode()) & 0x7FFFFFFF, c.name
    # pinned: a change here changes every case's inputs, and every workload's version must go up
    assert get_workload("decode-sweep").cpu[0].seed == 959_908_233


def test_inputs_are_deterministic_from_the_seed_and_never_zero():
    a, b = make_step_inputs(TINY.scenario()), make_step_inputs(TINY.scenario())
    for x, y in zip(
        (a.queries[0], a.keys[0], a.values[0]), (b.queries[0], b.keys[0], b.values[0]), strict=True
    ):
        assert torch.equal(x, y)
        assert x.abs().min() > 0
    other = make_step_inputs(replace(TINY, seed=12).scenario())
    assert not torch.equal(a.queries[0], other.queries[0])


def test_case_spec_builds_a_one_layer_scenario_and_round_trips():
    s = TINY.scenario("cpu")
    assert (s.num_layers, s.dtype, s.seed) == (1, torch.float32, 11)
    assert s.context_lens == TINY.context_lens
    assert CaseSpec.from_json(TINY.to_json()) == TINY
    assert TINY.num_tokens == 9
    assert TINY.work().num_tokens == 9


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(dtype="float64"), "dtype"),
        (dict(query_lens=(1, 5)), "match"),
        (dict(query_lens=(1, 6, 3)), "query_len"),
        (dict(layout="sideways"), "sideways"),
    ],
)
def test_bad_case_specs_are_rejected(change, message):
    with pytest.raises(ValueError, match=message):
        replace(TINY, **change)


def test_unknown_workload_lists_the_known_ones():
    with pytest.raises(KeyError, match="decode-sweep"):
        get_workload("nope")
