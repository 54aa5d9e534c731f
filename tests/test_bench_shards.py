"""Sharded sweeps: ``bench --shard K/N``'s share, and the shards' files merged into the whole's.

The shares are checked as a property over the registered workloads (pure
planning, nothing runs). The end to end runs the real command on two tiny
workloads, five samples a timing, one correct backend and one that fails its
check (so a failing status must survive the merge): the sweep whole, and as
shards 1/2 and 2/2, each once for the module; every merge test reads those
files afresh.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.bench.peer import PEER_NAME
from harness.bench.runner import BenchConfig
from harness.bench.sweep_plan import case_cost, planned, run_order, serving
from harness.bench.workloads import WORKLOADS, CaseSpec, Workload, list_workloads
from harness.cli.main import main
from harness.core.registry import BackendEntry
from harness.core.shards import Shard
from harness.gate import BaselineError, make_baseline
from harness.results.merge import MergeError, merge_result_files, merge_results
from harness.results.store import CaseRecord, RunRecord, load_results, save_results, schema
from reference_backends import ReferenceBackend, SdpaBackend
from reference_backends.reference import ReferenceMlaBackend

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bench_backends.py"
WRONG = f"{FIXTURES}:ScaledOutputBackend"


def tiny(name: str, contexts: tuple[int, ...], queries: tuple[int, ...], seed: int) -> CaseSpec:
    """A case of 4 heads of 16 (2 KV heads), pages of 4: microseconds a call."""
    return CaseSpec(
        name, contexts, queries, num_heads=4, num_kv_heads=2, head_dim=16, page_size=4, seed=seed
    )


MIXED_CASES = (
    tiny("decode", (9, 5, 13), (1, 1, 1), 1),
    tiny("prefill", (6, 3), (6, 3), 2),
    tiny("extend", (11, 8), (4, 8), 3),
    tiny("long", (40, 33), (1, 1), 4),
)
DECODE_CASES = (
    tiny("ctx=7", (7, 7), (1, 1), 5),
    tiny("ctx=21", (21, 21), (1, 1), 6),
)
MIXED = Workload("shards-mixed", 1, "mixed", "tests only", MIXED_CASES, MIXED_CASES)
DECODE = Workload("shards-decode", 2, "decode", "tests only", DECODE_CASES, DECODE_CASES)
QUICK = (
    *("--size", "cpu", "--no-probe", "--warm-cache", "--no-progress"),
    *("--min-samples", "5", "--max-samples", "5", "--budget", "0.01"),
)
SWEEP = ("--workload", MIXED.name, "--workload", DECODE.name, "--backend", "sdpa")


# -- the shares --------------------------------------------------------------------------

BACKENDS = [
    BackendEntry("sdpa", SdpaBackend, "test"),
    BackendEntry("reference", ReferenceBackend, "test"),
    BackendEntry("reference-mla", ReferenceMlaBackend, "test"),
]


@settings(max_examples=60, deadline=None)
@given(
    names=st.lists(st.sampled_from([w.name for w in list_workloads()]), min_size=1, unique=True),
    size=st.sampled_from(["cpu", "gpu"]),
    interleave=st.booleans(),
    count=st.integers(1, 4),
    backends=st.sampled_from([BACKENDS[:1], BACKENDS[1:], BACKENDS]),
)
def test_the_shards_of_a_sweep_partition_its_cases_in_run_order(
    names: list[str], size: str, interleave: bool, count: int, backends: list[BackendEntry]
) -> None:
    workloads = [WORKLOADS[name] for name in names]
    whole = BenchConfig(size=size, interleave=interleave)
    order = run_order(workloads, whole)
    places = [place for place, _, _ in order]
    shares = [
        [place for place, _, _ in planned(backends, workloads, whole_as(whole, k, count))]
        for k in range(1, count + 1)
    ]
    assert sorted(p for share in shares for p in share) == sorted(places)  # each case once
    for share in shares:  # in run order
        assert share == [p for p in places if p in share]
    again = [planned(backends, list(workloads), whole_as(whole, 1, count)) for _ in range(2)]
    assert again[0] == again[1] == planned(backends, workloads, whole_as(whole, 1, count))
    weights = {
        place: case_cost(spec, 1 + len(serving(backends, w)), whole.timing.budget_s)
        for place, w, spec in order
    }
    loads = [sum(weights[p] for p in share) for share in shares]
    assert max(loads) - min(loads) <= max(weights.values()) + 1e-9  # within one case


def whole_as(config: BenchConfig, index: int, count: int) -> BenchConfig:
    return BenchConfig(size=config.size, interleave=config.interleave, shard=Shard(index, count))


def test_one_shard_is_the_whole_sweep_and_a_case_costs_more_with_more_work() -> None:
    workloads = list_workloads()
    config = BenchConfig(size="gpu")
    assert planned(BACKENDS, workloads, whole_as(config, 1, 1)) == run_order(workloads, config)
    small, large = DECODE.cpu
    assert case_cost(small, 2, 1.0) < case_cost(large, 2, 1.0) < case_cost(large, 3, 1.0)


def test_the_heaviest_case_of_a_sweep_is_dealt_to_shard_1() -> None:
    """Shard 1 is never empty while there is a case: its file's ceilings head a merge."""
    config = BenchConfig(size="cpu", shard=Shard(1, 4))
    (place, _, spec), *_ = planned(BACKENDS, [MIXED], config)
    assert (place, spec.name) == (3, "long")


# -- the end to end ---------------------------------------------------------------------


@dataclass(frozen=True)
class Sweep:
    """The files of one sweep, run whole and as two shards, and what each command did."""

    whole: Path
    shards: tuple[Path, Path]
    codes: dict[str, int]
    printed: dict[str, str]


def bench(*argv: str) -> tuple[int, str]:
    """``attn-harness bench ARGV`` on the tiny workloads, in this process: exit code, stdout."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setitem(WORKLOADS, MIXED.name, MIXED)
        patch.setitem(WORKLOADS, DECODE.name, DECODE)
        code = main(["bench", *argv, *QUICK])
    return code, out.getvalue()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    folder = tmp_path_factory.mktemp("sweep")
    codes, printed = {}, {}
    for label, extra in (("whole", ()), ("1", ("--shard", "1/2")), ("2", ("--shard", "2/2"))):
        out = folder / f"{label}.json"
        codes[label], printed[label] = bench(*SWEEP, "--backend", WRONG, *extra, "--out", str(out))
    return Sweep(folder / "whole.json", (folder / "1.json", folder / "2.json"), codes, printed)


def test_each_shard_runs_its_share_and_says_so(sweep: Sweep) -> None:
    assert sweep.codes == {"whole": 1, "1": 1, "2": 1}  # the wrong backend fails everywhere
    whole = load_results(sweep.whole)
    assert whole.shard is None
    keys = list(dict.fromkeys(case_key_of(c) for c in whole.cases))
    ran = []
    for k, path in enumerate(sweep.shards, start=1):
        record = load_results(path)
        assert record.shard is not None
        assert record.shard == {
            "index": k,
            "count": 2,
            "cases": keys,
            "backends": ["sdpa", WRONG],
        }
        mine = list(dict.fromkeys(case_key_of(c) for c in record.cases))
        assert mine, f"shard {k}/2 ran nothing"
        assert f"shard {k}/2: {len(mine)} of the sweep's {len(keys)} cases" in sweep.printed[str(k)]
        ran += mine
    assert sorted(ran) == sorted(keys)


def case_key_of(record: CaseRecord) -> str:
    return f"{record.workload}@{record.workload_version}/{record.case}"


def test_the_merged_shards_are_the_whole_run(sweep: Sweep, tmp_path: Path) -> None:
    merged = merge_result_files(list(sweep.shards))
    path = save_results(merged, tmp_path / "merged.json")
    jsonschema.Draft202012Validator(schema()).validate(json.loads(path.read_text()))
    again, whole = load_results(path), load_results(sweep.whole)
    assert [c.id for c in again.cases] == [c.id for c in whole.cases]
    assert [c.status for c in again.cases] == [c.status for c in whole.cases]
    assert {c.backend for c in again.cases} == {PEER_NAME, "sdpa", WRONG}
    assert again.workloads == whole.workloads
    assert again.shard is None
    assert not again.partial
    assert [o["shard"] for o in again.merged_from or []] == [
        {"index": 1, "count": 2},
        {"index": 2, "count": 2},
    ]
    shards = [load_results(p) for p in sweep.shards]
    assert again.environment == shards[0].environment
    assert again.ceilings == shards[0].ceilings
    copied = {c.id: c.to_json() for s in shards for c in s.cases}  # each record as its shard's
    assert [c.to_json() for c in again.cases] == [copied[c.id] for c in again.cases]
    assert merge_results(shards[::-1]).cases == merge_results(shards).cases  # any order


def gate(candidate: Path, baseline: Path, junit: Path) -> tuple[int, dict[str, str]]:
    """The gate's exit code, and per case of its JUnit report what decided it: a failing
    status (``FAIL status``), a timing compared (``compared``: the verdict of two runs'
    microsecond timings is chance; a 90x stall of a peer was seen), or why it was not
    compared (``MISSING``, ``NEW``, ``UNCOMPARED``, ...)."""
    argv = ["gate", str(candidate), "--baseline", str(baseline), "--threshold", "9"]
    code = main([*argv, "--junitxml", str(junit)])
    decided = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        verdict = case.find("properties/property[@name='verdict']")
        failure = case.find("failure")
        kind = "" if verdict is None else verdict.get("value", "")
        if failure is not None and failure.get("message", "").startswith("status"):
            kind = "FAIL status"
        elif kind in ("PASS", "FAIL", "IMPROVED", "INCONCLUSIVE"):
            kind = "compared"
        decided[f"{case.get('classname')} {case.get('name')}"] = kind
    return code, decided


def test_the_gate_judges_the_merged_file_as_the_whole_run(sweep: Sweep, tmp_path: Path) -> None:
    merged = save_results(merge_result_files(list(sweep.shards)), tmp_path / "merged.json")
    whole = gate(sweep.whole, sweep.whole, tmp_path / "whole.xml")
    assert whole[0] == 1  # the wrong backend's status fails it
    kinds = sorted(set(whole[1].values()))
    assert kinds == ["FAIL status", "UNCOMPARED", "compared"], whole  # the peer: UNCOMPARED
    assert gate(merged, merged, tmp_path / "itself.xml") == whole
    assert gate(merged, sweep.whole, tmp_path / "merged.xml") == whole  # no MISSING, no NEW
    assert gate(sweep.whole, merged, tmp_path / "reverse.xml") == whole


def test_a_shard_dealt_no_case_writes_its_file_and_exits_0(tmp_path: Path) -> None:
    paths = [tmp_path / f"{k}.json" for k in (1, 2, 3)]
    runs = [
        bench("--workload", DECODE.name, "--backend", "sdpa", "--shard", f"{k}/3", "--out", str(p))
        for k, p in zip((1, 2, 3), paths, strict=True)
    ]
    assert [code for code, _ in runs] == [0, 0, 0]
    assert "shard 3/3: 0 of the sweep's 2 cases: no cases" in runs[2][1]
    empty = load_results(paths[2])
    assert empty.cases == []
    assert empty.shard is not None
    assert empty.shard["index"] == 3
    merged = merge_result_files(paths)
    assert [c.case for c in merged.cases] == ["ctx=7", "ctx=7", "ctx=21", "ctx=21"]
    assert [o["cases"] for o in merged.merged_from or []] == [1, 1, 0]


# -- what a merge refuses ---------------------------------------------------------------


def shards(sweep: Sweep) -> list[RunRecord]:
    return [load_results(p) for p in sweep.shards]


def test_a_missing_shard_is_named(sweep: Sweep) -> None:
    with pytest.raises(MergeError, match=r"shard 2/2 missing: a merge needs all 2"):
        merge_result_files([sweep.shards[0]])


def test_a_shard_given_twice_is_named_with_its_files(sweep: Sweep) -> None:
    first, second = sweep.shards
    with pytest.raises(MergeError, match=r"shard 1/2 given more than once") as raised:
        merge_result_files([first, second, first])
    assert str(raised.value).count(f"{first} (shard 1/2)") == 2


def test_shards_of_splits_into_different_counts_are_refused(sweep: Sweep) -> None:
    one, two = shards(sweep)
    assert two.shard is not None
    two.shard["count"] = 3
    with pytest.raises(MergeError, match=r"different counts \(2, 3\)"):
        merge_results([one, two])


def test_shards_of_different_workloads_are_another_sweep(sweep: Sweep) -> None:
    one, two = shards(sweep)
    assert two.shard is not None
    two.workloads = two.workloads[:1]
    two.shard["cases"] = [k for k in two.shard["cases"] if k.startswith(MIXED.name)]
    with pytest.raises(MergeError, match=r"shard 2/2\) is a shard of another sweep") as raised:
        merge_results([one, two], names=["a.json", "b.json"])
    message = str(raised.value)
    assert message.startswith("b.json (shard 2/2)")
    assert "cases: " in message
    assert "workloads: " in message
    assert "a.json (shard 1/2)" in message


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda r: r.timing["config"].update(max_samples=6), "timing.config"),
        (lambda r: r.tool.update(version="9.9"), "harness version"),
        (lambda r: r.environment["git"].update(sha="0" * 40), "git commit"),
        (lambda r: r.shard.update(backends=["sdpa"]), "backends"),
    ],
)
def test_shards_with_other_settings_are_another_sweep(
    sweep: Sweep, change: Callable[[RunRecord], None], named: str
) -> None:
    one, two = shards(sweep)
    change(two)
    with pytest.raises(MergeError, match=f"another sweep .*{named}: "):
        merge_results([one, two])


def test_a_partial_shard_is_refused(sweep: Sweep) -> None:
    one, two = shards(sweep)
    two.partial = True
    with pytest.raises(MergeError, match=r"b.json: shard 2/2 is partial .*run that shard again"):
        merge_results([one, two], names=["a.json", "b.json"])


def test_a_whole_run_or_a_merged_file_is_not_a_shard(sweep: Sweep, tmp_path: Path) -> None:
    with pytest.raises(MergeError, match=re.escape(f"{sweep.whole}: not a shard's results")):
        merge_result_files([sweep.whole, *sweep.shards])
    merged = save_results(merge_result_files(list(sweep.shards)), tmp_path / "merged.json")
    with pytest.raises(MergeError, match=r"merged.json: already merged from 2 shards"):
        merge_result_files([merged])


def test_a_case_in_two_shards_or_in_none_is_refused(sweep: Sweep) -> None:
    one, two = shards(sweep)
    doubled = copy.deepcopy(two)
    doubled.cases += one.cases[:1]
    with pytest.raises(MergeError, match=r"ran in two shards: results 1 \(shard 1/2\)"):
        merge_results([one, doubled])
    lost = copy.deepcopy(two)
    lost.cases = []
    with pytest.raises(MergeError, match=r"of the sweep's 6 cases ran in no shard"):
        merge_results([one, lost])


def test_shards_on_different_machines_are_merged_with_a_flag(sweep: Sweep) -> None:
    one, two = shards(sweep)
    two.environment["cpu_model"] = "Other CPU"
    merged = merge_results([one, two])
    (flag,) = [f for f in merged.flags if f.startswith("shards differ: ")]
    assert "2/2: cpu_model=Other CPU" in flag
    assert merged.environment == one.environment
    assert merged.merged_from is not None
    assert merged.merged_from[1]["environment"]["cpu_model"] == "Other CPU"


def test_a_baseline_pools_merged_sweeps_but_refuses_a_shard(sweep: Sweep) -> None:
    merged = merge_result_files(list(sweep.shards))
    assert len(make_baseline([merged, merged, merged]).runs) == 3
    with pytest.raises(BaselineError, match=r"run\(s\) 3 \(shard 1/2\) hold one shard"):
        make_baseline([merged, merged, shards(sweep)[0]])
