"""DP coordination, planted faults and the seeded per-rank schedule: no processes needed."""

from __future__ import annotations

import pytest
import torch

from harness.dist.coordination import (
    CountReport,
    DPMetadataError,
    captured_size,
    group_counts,
    pad_step,
)
from harness.dist.faults import Fault, PlantedFault, corrupt, strike
from harness.dist.schedule import DistSetup, RankSchedule, idle


@pytest.mark.parametrize(
    ("tokens", "size"),
    [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (16, 16), (17, 32), (33, 48), (100, 112)],
)
def test_captured_size_is_1_2_4_8_then_multiples_of_16(tokens: int, size: int) -> None:
    assert captured_size(tokens) == size


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_captured_size_refuses_what_is_not_a_positive_int(bad: object) -> None:
    with pytest.raises(ValueError, match="num_tokens"):
        captured_size(bad)  # type: ignore[arg-type]


def honest(counts: list[int]) -> list[CountReport]:
    return [CountReport.honest(r, len(counts), n) for r, n in enumerate(counts)]


def test_group_counts_sums_every_rank_own_entry() -> None:
    assert group_counts(honest([3, 0, 7]), 3, step=1) == [3, 0, 7]


def test_group_counts_ignores_the_order_reports_arrive_in() -> None:
    assert group_counts(list(reversed(honest([3, 0, 7]))), 3, step=1) == [3, 0, 7]


@pytest.mark.parametrize(
    ("report", "message"),
    [
        (CountReport(1, (0, 4, 0, 0), 4), "has 4 entries, expected one per rank \\(dp_size=3\\)"),
        (CountReport(1, (0, -2, 0), 4), "negative token count -2 for rank 1"),
        (CountReport(1, (5, 4, 0), 4), "sets the count of rank 0"),
        (CountReport(1, (0, 9, 0), 4), "claims 9 tokens but its batch holds 4 \\(more"),
        (CountReport(1, (0, 1, 0), 4), "claims 1 tokens but its batch holds 4 \\(fewer"),
    ],
)
def test_bad_metadata_names_the_rank_and_the_step(report: CountReport, message: str) -> None:
    reports = honest([2, 4, 1])
    reports[1] = report
    with pytest.raises(DPMetadataError, match=f"step 5: bad DP metadata from rank 1: .*{message}"):
        group_counts(reports, 3, step=5)


def test_every_rank_gets_the_same_error_from_the_same_reports() -> None:
    reports = honest([2, 4, 1])
    reports[2] = CountReport(2, (0, 0, -1), 1)
    messages = set()
    for _rank in range(3):  # each rank validates the same gathered list
        with pytest.raises(DPMetadataError) as caught:
            group_counts(list(reports), 3, step=2)
        messages.add(str(caught.value))
    assert len(messages) == 1


def test_a_missing_report_is_refused() -> None:
    with pytest.raises(DPMetadataError, match="reports came from ranks \\[0, 2\\]"):
        group_counts([honest([1, 1, 1])[0], honest([1, 1, 1])[2]], 3, step=1)


def test_padding_reaches_the_group_maximum_in_eager_mode() -> None:
    step = pad_step([3, 0, 7], rank=0, graph=False)
    assert (step.padded_tokens, step.padding, step.graph_mode) == (7, 4, True)
    largest = pad_step([3, 0, 7], rank=2, graph=False)
    assert (largest.padding, largest.graph_mode) == (0, False)  # nothing padded: plain eager


def test_graph_mode_pads_every_rank_to_one_captured_size() -> None:
    steps = [pad_step([3, 0, 17], rank=r, graph=True) for r in range(3)]
    assert {s.padded_tokens for s in steps} == {32}
    assert [s.padding for s in steps] == [29, 32, 15]  # the idle rank runs a dummy batch
    assert all(s.graph_mode for s in steps)


def test_a_group_with_no_tokens_skips_the_step() -> None:
    assert pad_step([0, 0], rank=1, graph=True).skipped


def test_a_backend_without_padding_runs_its_own_batch() -> None:
    step = pad_step([3, 0, 7], rank=1, graph=False, can_pad=False)
    assert (step.padded_tokens, step.padding, step.graph_mode) == (0, 0, False)
    assert not step.skipped  # the idle rank runs nothing but still joins the step


def test_faults_parse_and_refuse_bad_text() -> None:
    assert Fault.parse("hang@2:3") == Fault("hang", 2, 3)
    for bad in ("hang", "hang@2", "explode@1:1", "raise@a:1"):
        with pytest.raises(ValueError, match="KIND@RANK:STEP"):
            Fault.parse(bad)


def test_faults_strike_only_their_rank_and_step() -> None:
    faults = [Fault("raise", 1, 2)]
    strike(faults, 0, 2)
    strike(faults, 1, 1)
    with pytest.raises(PlantedFault, match="raise@1:2"):
        strike(faults, 1, 2)


def test_metadata_faults_break_the_check_they_target() -> None:
    base = CountReport.honest(1, 3, 4)
    for kind, message in (
        ("count-length", "4 entries"),
        ("negative-count", "negative"),
        ("overclaim", "claims 5"),
    ):
        reports = honest([2, 4, 1])
        reports[1] = corrupt([Fault(kind, 1, 3)], base, 3)
        with pytest.raises(DPMetadataError, match=message):
            group_counts(reports, 3, step=3)
    assert corrupt([Fault("overclaim", 1, 3)], base, 2) == base


def _trace(schedule: RankSchedule, steps: int, padding: int = 2) -> list[tuple[object, ...]]:
    trace = []
    for step in range(steps):
        tokens = schedule.plan(step)
        built = schedule.build(step, padding)
        rows = (
            None
            if built.step is None
            else [(r.seq_id, r.seq_len, r.pages) for r in built.step.rows]
        )
        first = None if built.step is None else built.queries[0].flatten()[:4].tolist()
        trace.append((tokens, rows, first))
    return trace


def test_a_rank_schedule_replays_exactly_from_the_seed() -> None:
    setup = DistSetup(dp_size=3, steps=12, seed=5)
    assert _trace(RankSchedule(setup, 1), 12) == _trace(
        RankSchedule(setup, 1, keep_history=True), 12
    )
    assert _trace(RankSchedule(setup, 1), 12) != _trace(RankSchedule(setup, 2), 12)


def test_a_schedule_covers_idle_steps_chunked_prefill_decode_and_page_reuse() -> None:
    setup = DistSetup(dp_size=2, steps=40, seed=0)
    schedule = RankSchedule(setup, 1)
    idle_steps, chunked, decodes, pages_seen = 0, 0, 0, []
    for step in range(40):
        tokens = schedule.plan(step)
        idle_steps += idle(setup, 1, step)
        built = schedule.build(step, 0)
        if built.step is None:
            assert tokens == 0
            continue
        for row in built.step.rows:
            chunked += 1 < row.query_len < row.seq_len
            decodes += row.query_len == 1 and row.seq_len > 1
            pages_seen += list(row.pages)
    pool = range(setup.pages_per_rank, 2 * setup.pages_per_rank)
    assert idle_steps
    assert chunked
    assert decodes
    assert set(pages_seen) <= set(pool)  # rank 1 only ever holds its own range
    assert len(pages_seen) > len(set(pages_seen))  # pages freed by finished sequences come back


def test_padding_rows_write_nothing_and_carry_no_history() -> None:
    setup = DistSetup(dp_size=2, seed=1)
    schedule = RankSchedule(setup, 0, keep_history=True)
    schedule.plan(0)
    built = schedule.build(0, 3)
    assert built.step is not None
    padding = [r for r in built.step.rows if r.seq_id is None]
    assert len(padding) == 3
    assert all(r.query_len == 1 for r in padding)
    assert built.step.metadata.slot_mapping[-3:].tolist() == [-1, -1, -1]
    assert built.sequences[0][-3:] == [None, None, None]
    assert built.queries[0].shape[0] == built.real_tokens + 3
    assert torch.isfinite(built.queries[0]).all()


def test_one_token_padding_rows_read_the_rank_padding_page() -> None:
    from harness import Capabilities
    from harness.core.kv_pages import PoolLayout, dp_page_range
    from harness.dist.claims import fit_claim
    from harness.dist.schedule import rank_caches

    setup = fit_claim(DistSetup(dp_size=2, seed=1), Capabilities(padding_convention="one-token"))
    assert setup.padding_convention == "one-token"
    assert setup.pages_per_rank == DistSetup(dp_size=2).pages_per_rank + 1
    schedule = RankSchedule(setup, 1, keep_history=True)
    schedule.plan(0)
    built = schedule.build(0, 2)
    assert built.step is not None
    padding_page = dp_page_range(setup.total_pages, 2, 1).start
    rows = built.step.rows[-2:]
    assert [(r.seq_id, r.seq_len, r.query_len, r.pages) for r in rows] == [
        (None, 1, 1, (padding_page,))
    ] * 2
    assert built.step.metadata.slot_mapping[-2:].tolist() == [-1, -1]
    assert all(padding_page not in r.pages for r in built.step.rows[:-2])
    for layout in PoolLayout:
        cache = rank_caches(setup, 1, layout)[0]
        local = padding_page - cache.page_offset
        assert (cache.key[local] == 0).all()
        assert cache.key[local + 1].isnan().all()


def test_setup_refuses_bad_geometry() -> None:
    with pytest.raises(ValueError, match="num_heads"):
        DistSetup(dp_size=2, num_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match="dp_size"):
        DistSetup(dp_size=0)
    with pytest.raises(ValueError, match="dtype"):
        DistSetup(dp_size=1, dtype="float8")


def test_the_run_moves_inside_a_narrow_claim_instead_of_refusing_it() -> None:
    from harness import Capabilities
    from harness.dist.claims import fit_claim

    setup = DistSetup(dp_size=2)
    dtypes = (torch.float32,)
    assert fit_claim(setup, Capabilities(dtypes=dtypes, devices=("cpu",))) == setup
    narrow = Capabilities(dtypes=dtypes, devices=("cpu",), page_sizes=(8, 64), head_dims=(128, 64))
    fitted = fit_claim(setup, narrow)
    assert (fitted.page_size, fitted.head_dim) == (8, 64)


def test_any_seed_draws_a_schedule() -> None:
    """A huge seed still draws: batches inside the rank's pages, the same ones twice."""
    setup = DistSetup(dp_size=2, seed=10**12)
    drawn = []
    for _ in range(2):
        schedule = RankSchedule(setup, 1)
        steps = []
        for step in range(4):
            tokens = schedule.plan(step)
            built = schedule.build(step, 1)
            assert built.real_tokens == tokens >= 0
            assert built.step is not None  # one padding row at least
            assert len(built.queries) == setup.num_layers
            assert built.queries[0].shape[0] == tokens + 1  # the padding row's one token
            pages = built.step.metadata.block_table
            owned = schedule.pool.rank_range(1)
            assert all(p in owned for p in pages[pages >= 0].tolist())
            steps.append((tokens, built.query_lens, built.queries[0].clone()))
        drawn.append(steps)
    for (t1, q1, x1), (t2, q2, x2) in zip(*drawn, strict=True):
        assert (t1, q1) == (t2, q2)
        assert torch.equal(x1, x2)
