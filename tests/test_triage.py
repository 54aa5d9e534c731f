"""Failure triage: grouping failures by cause, and naming what separates them from passes."""

from __future__ import annotations

import io
import random
import re
import subprocess
import time
from collections import Counter
from dataclasses import replace

import pytest
import torch

from harness.conformance.progress import PlainProgress, eta_text, progress_line
from harness.conformance.report import (
    FailureEntry,
    failure_lines,
    grouped_failure_lines,
    printed_replay,
    shell_lines,
)
from harness.conformance.triage import (
    TriageLog,
    cause_line,
    chance_of,
    count_bucket,
    example_key,
    explain,
    group_failures,
    group_json,
    index_bucket,
    triage_labels,
)
from harness.core.variants import AttentionVariant
from harness.numerics.scenario import Scenario

BASE = Scenario()


def _random_step(rng: random.Random, **fixed: object) -> Scenario:
    """A step with every other dimension drawn at random, so only ``fixed`` is shared."""
    page = rng.choice([1, 3, 4, 16])
    rows = rng.randint(1, 3)
    contexts = tuple(rng.randint(2, 40) for _ in range(rows))
    step = replace(
        BASE,
        dtype=rng.choice([torch.float32, torch.float16, torch.bfloat16]),
        page_size=page,
        head_dim=rng.choice([8, 13, 64]),
        context_lens=contexts,
        query_lens=tuple(rng.randint(2, c) for c in contexts),
        causal=True,
        noncontiguous=rng.random() < 0.5,
    )
    return replace(step, **fixed)  # type: ignore[arg-type]


def _decode(step: Scenario) -> Scenario:
    return replace(step, query_lens=tuple(1 for _ in step.context_lens))


def _log(held: list[Scenario], failed: list[Scenario], test: str = "test_x") -> TriageLog:
    log = TriageLog()
    for s in held:
        log.held("b", test, [s])
    for s in failed:
        log.failed("b", test, [s])
    return log


def test_a_bug_in_multi_token_queries_is_named_by_its_query_dimension():
    rng = random.Random(0)
    decodes = [_decode(_random_step(rng)) for _ in range(30)]
    multi = [_random_step(rng) for _ in range(20)]
    log = _log(decodes, multi)
    cause = explain(log.tests("b")["test_x"].failed, log.tests("b")["test_x"].held)
    assert cause is not None
    assert cause.dimension in {"query", "batch"}
    distinct = len({example_key([s]) for s in decodes})  # examples alike in every label: one
    assert cause.held_outside == distinct
    assert cause.held_inside == 0
    assert cause.failed == len({example_key([s]) for s in multi})
    line = cause_line(group_failures("b", [_failure("test_x")], log)[0])
    assert "every example with" in line
    assert f"({distinct})" in line


def test_failures_spread_at_random_name_no_dimension():
    """The Fisher tail keeps a chance split of a few examples from being called a cause."""
    rng = random.Random(1)
    steps = [_random_step(rng) for _ in range(40)]
    failed = [s for i, s in enumerate(steps) if i % 5 == 0]
    held = [s for i, s in enumerate(steps) if i % 5]
    log = _log(held, failed)
    evidence = log.tests("b")["test_x"]
    assert explain(evidence.failed, evidence.held) is None


def test_two_conditions_when_one_leaves_held_examples_inside():
    """A causal-mask bug: non-causal decodes hold, causal multi-token rows fail."""
    rng = random.Random(2)
    held = [_decode(_random_step(rng)) for _ in range(15)]
    held += [_random_step(rng, causal=False) for _ in range(15)]
    failed = [_random_step(rng) for _ in range(20)]
    log = _log(held, failed)
    evidence = log.tests("b")["test_x"]
    cause = explain(evidence.failed, evidence.held)
    assert cause is not None
    assert cause.within is not None
    assert {cause.dimension, cause.within.dimension} & {"query", "batch"}
    assert "mask" in {cause.dimension, cause.within.dimension}
    assert cause.held_inside == 0
    data = group_json(group_failures("b", [_failure("test_x")], log)[0])
    assert set(data["dimensions"]) == {cause.dimension, cause.within.dimension}


def test_a_rank_of_a_group_is_not_blamed_for_the_rank_that_failed():
    """Examples of several ranks carry every rank's label; the cover takes only the labels
    that predict failure."""
    rng = random.Random(3)
    held = [_random_step(rng, head_dim=8) for _ in range(20)]
    failed = [[_random_step(rng, head_dim=64), _random_step(rng, head_dim=8)] for _ in range(10)]
    log = TriageLog()
    for s in held:
        log.held("b", "t", [s])
    for pair in failed:
        log.failed("b", "t", pair)
    cause = explain(log.tests("b")["t"].failed, log.tests("b")["t"].held)
    assert cause is not None
    assert cause.dimension == "head_dim"
    assert cause.failing == ("64",)


def test_only_failures_of_one_symptom_pool_their_evidence():
    rng = random.Random(4)
    log = TriageLog()
    for test in ("test_a", "test_b"):
        for _ in range(10):
            log.held("b", test, [_decode(_random_step(rng))])
            log.failed("b", test, [_random_step(rng)])
    log.failed("b", "test_inputs", [_random_step(rng)])
    failures = [
        _failure("test_a", "layer 0: max error 1 (EXCEEDS bound 0.1, 10x)"),
        _failure("test_b", "layer 0: max error 2 (EXCEEDS bound 0.1, 20x)"),
        _failure("test_inputs", "forward modified its query in place"),
    ]
    groups = group_failures("b", failures, log)
    assert [len(g.failures) for g in groups] == [2, 1]
    assert groups[0].cause is not None
    alone = groups[1]
    assert alone.property_only == "test_inputs"
    assert alone.every_example_failed
    assert "every example of it failed" in cause_line(alone)
    assert "20 examples of the other properties held" in cause_line(alone)


def _failure(
    test: str, detail: str = "layer 0: EXCEEDS bound", scenario: str = "dp 0/1"
) -> FailureEntry:
    return FailureEntry("b", test, detail, scenario, f"attn-harness conform --replay {test}@6:AAAA")


def test_a_group_prints_one_entry_and_names_the_rest(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    rng = random.Random(5)
    log = TriageLog()
    names = [f"test_{c}" for c in "abcde"]
    for test in names:
        for _ in range(8):
            log.held("b", test, [_decode(_random_step(rng))])
            log.failed("b", test, [_random_step(rng)])
    failures = [_failure(n, scenario="dp 0/1 " + "x" * i) for i, n in enumerate(names)]
    (group,) = group_failures("b", failures, log)
    lines = grouped_failure_lines(group, every_failure=False)
    assert lines[0].startswith("CAUSE  b · 5 failures, all with ")
    assert sum(line.startswith("FAILED ") for line in lines) == 1
    assert "FAILED b · test_a: " in "\n".join(lines)  # the simplest scenario represents them
    assert "4 more failures like it: test_b, test_c, test_d and 1 more (-v lists each)" in " ".join(
        line.strip() for line in lines
    )
    assert max(len(line) for line in lines) <= 80
    every = grouped_failure_lines(group, every_failure=True)
    assert sum(line.startswith("FAILED ") for line in every) == 5


def test_example_labels_include_the_triage_dimensions():
    key = dict(example_key([replace(BASE, num_layers=1, scale=0.3, context_lens=(5, 9))]))
    assert key["layers"] == {"1"}
    assert key["scale"] == {"other"}
    assert key["last_page"] == {"ends mid-page"}
    assert key["sequence_pages"] == {"2+"}
    assert dict(example_key([BASE]))["scale"] == {"1/sqrt(head dim)"}
    windowed = replace(BASE, variant=AttentionVariant(sliding_window=4))
    assert dict(example_key([windowed]))["variant"] == {"window"}


def test_the_fisher_tail_matches_a_hand_count():
    """2 failing inside of 2 inside, 8 examples in all: 1 / C(8, 2)."""
    rng = random.Random(6)
    log = _log([_random_step(rng, head_dim=8) for _ in range(6)], [])
    for _ in range(2):
        log.failed("b", "test_x", [_random_step(rng, head_dim=64)])
    evidence = log.tests("b")["test_x"]
    from harness.conformance.triage import _along

    cause = _along(evidence.failed, evidence.held, "head_dim")
    assert cause is not None
    assert chance_of(cause) == pytest.approx(1 / 28)
    assert explain(evidence.failed, evidence.held) is None  # too little to name a cause


# -- entries that fit the terminal, replays that paste back ------------------------------


def test_a_long_replay_is_cut_into_lines_the_shell_joins_back():
    blob = "AXicJU67DQJRDLPfvePghIQEtPw6xAh0zlXULMIINGzCNEzAEvSICgcUJXJiO0mcH2J0R1UHnE0md=="
    command = f"attn-harness conform --backend my/file.py:Mine --replay 'test_x[my]@6.1:{blob}'"
    lines = shell_lines(command, 50)
    assert max(len(line) for line in lines) <= 50
    echoed = subprocess.run(
        ["bash", "-c", "printf '%s\\n' " + "\n".join(lines).removeprefix("attn-harness ")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert echoed == [
        "conform",
        "--backend",
        "my/file.py:Mine",
        "--replay",
        f"test_x[my]@6.1:{blob}",
    ]
    printed = "\n".join(["       replay:", *lines])
    assert printed_replay(printed)[-1] == f"test_x[my]@6.1:{blob}"


def test_an_entry_fits_columns_and_a_log_keeps_whole_lines(monkeypatch):
    failure = FailureEntry(
        "suites.mutants.backends:TopLeftCausal",
        "test_outputs_match_oracle[suites.mutants.backends:TopLeftCausal-float16]",
        "layer 0: max error 7.900e+00 at token 0, head 0 (EXCEEDS bound 1.818e-05, 434581.87x)",
        "dp 0/1 shared, float32, H=1 KV=1 D=64 page=1 pages=63 layers=1 scale=0.125",
        "attn-harness conform --backend suites.mutants.backends:TopLeftCausal --replay "
        "'test_outputs_match_oracle[suites.mutants.backends:TopLeftCausal-float16]@6.1:AXic'",
    )
    monkeypatch.setenv("COLUMNS", "80")
    narrow = failure_lines(failure)
    assert max(len(line) for line in narrow) <= 80
    monkeypatch.delenv("COLUMNS")
    whole = failure_lines(failure)  # stdout is not a terminal under pytest
    assert len(whole) == 3
    assert whole[2] == f"       replay:   {failure.replay}"
    assert printed_replay("\n".join(narrow)) == printed_replay("\n".join(whole))


# -- progress without a terminal ---------------------------------------------------------


def test_plain_progress_prints_tests_done_and_an_estimate():
    stream = io.StringIO()
    progress = PlainProgress("reference", every_s=0.05, stream=stream)
    progress.start_test(13, 49, "test_outputs_match_oracle[reference-float32]")  # past a quarter
    deadline = time.monotonic() + 5
    while "tests done" not in stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.02)
    progress.stop()
    line = stream.getvalue().splitlines()[-1]
    assert re.search(r"reference: 13/49 tests done, about \d+ s left", line), line
    assert "(now test_outputs_match_oracle[reference-float32])" in line


def test_plain_progress_fits_a_width_when_asked():
    stream = io.StringIO()
    progress = PlainProgress("a-backend-with-a-long-name", every_s=60, stream=stream, width=40)
    progress.start_test(2, 3, "test_outputs_match_oracle[bfloat16]")
    progress.print_line()
    progress.stop()
    lines = stream.getvalue().splitlines()
    assert len(lines) > 1
    assert max(len(line) for line in lines) <= 40
    assert "2/3 tests done" in " ".join(lines)


def test_the_estimate_is_the_rate_so_far():
    assert progress_line(120, "x", 12, 48) == "[  120 s] x: 12/48 tests done, about 6 min left"
    assert progress_line(5, "x", 0, 48) == "[    5 s] x: 0/48 tests done"
    assert eta_text(42) == "about 40 s left"
    assert Counter(eta_text(s) for s in (1, 2, 3)) == Counter({"about 5 s left": 3})


def test_copies_of_one_failing_example_are_one_piece_of_evidence():
    """Shrinking tries one failing example over and over; twenty copies prove nothing more."""
    rng = random.Random(7)
    one = _random_step(rng, head_dim=64)
    log = _log([_random_step(rng, head_dim=8) for _ in range(6)], [one] * 20)
    evidence = log.tests("b")["test_x"]
    assert sum(evidence.failed.values()) == 20
    assert explain(evidence.failed, evidence.held) is None


def test_one_variant_is_named_whatever_it_is_combined_with():
    """A soft-cap bug fails soft-cap alone and soft-cap with a window or sinks alike."""
    rng = random.Random(8)
    capped = [
        AttentionVariant(logits_soft_cap=30.0),
        AttentionVariant(logits_soft_cap=30.0, sliding_window=4),
        AttentionVariant(logits_soft_cap=50.0, sinks=(0.5,) * 4),
    ]
    others = [
        AttentionVariant(),
        AttentionVariant(sliding_window=4),
        AttentionVariant(sinks=(0.5,) * 4),
    ]
    log = _log(
        [_random_step(rng, variant=rng.choice(others)) for _ in range(25)],
        [_random_step(rng, variant=rng.choice(capped)) for _ in range(25)],
    )
    evidence = log.tests("b")["test_x"]
    cause = explain(evidence.failed, evidence.held)
    assert cause is not None
    assert (cause.dimension, cause.failing) == ("soft_cap", ("on",))


def test_counts_and_indices_are_bucketed_at_powers_of_two():
    """A kernel that packs 8 query heads, or keeps a rank in 3 bits, breaks just past a
    power of two: each bucket ends (counts) or starts (indices) on one."""
    assert [count_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [
        "1", "2", "3-4", "3-4", "5-8", "5-8", "9-16", "9-16", "17-32",
    ]  # fmt: skip
    assert [index_bucket(i) for i in (0, 1, 2, 3, 4, 7, 8, 15, 16)] == [
        "0", "1", "2-3", "2-3", "4-7", "4-7", "8-15", "8-15", "16-31",
    ]  # fmt: skip
    labels = triage_labels(replace(BASE, num_heads=16, num_kv_heads=1, dp_size=9, dp_rank=8))
    assert labels["group"] == "9-16"
    assert labels["rank_index"] == "8-15"


def test_a_wide_gqa_group_is_named_by_the_group_size():
    rng = random.Random(7)
    held = [_random_step(rng, num_heads=h, num_kv_heads=1) for h in (1, 2, 4, 8) for _ in range(6)]
    failed = [_random_step(rng, num_heads=16, num_kv_heads=1) for _ in range(8)]
    evidence = _log(held, failed).tests("b")["test_x"]
    cause = explain(evidence.failed, evidence.held)
    assert cause is not None
    assert (cause.dimension, cause.failing) == ("group", ("9-16",))
