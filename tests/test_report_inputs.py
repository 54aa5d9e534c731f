"""Loading a report's inputs: each kind read right, each bad input one ReportError naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.report.inputs import (
    ConformanceCase,
    ReportError,
    load_inputs,
    load_junit,
)
from harness.results.store import save_results

DATA = Path(__file__).parent / "data" / "report"
BENCH = DATA / "bench.json"


def copy_bench(folder: Path, name: str = "bench.json", **changes: object) -> Path:
    """The sample results file, with top-level fields changed, saved under ``folder``."""
    data = json.loads(BENCH.read_text())
    for key, value in changes.items():
        if key == "sha":
            data["environment"]["git"]["sha"] = value
        else:
            data[key] = value
    target = folder / name
    target.write_text(json.dumps(data))
    return target


def junit(tmp_path: Path, body: str, name: str = "c.xml") -> Path:
    path = tmp_path / name
    path.write_text(
        f'<?xml version="1.0"?><testsuites><testsuite name="t">{body}</testsuite></testsuites>'
    )
    return path


def test_folder_of_samples_loads_every_kind_with_its_coverage():
    inputs = load_inputs([DATA])
    assert [b.path.name for b in inputs.bench] == ["bench.json"]
    assert inputs.bench[0].label == "cpu 2026-12-01 50585f2"
    assert len(inputs.bench[0].record.cases) == 18
    [conform] = inputs.conformance
    assert conform.path.name == "conform.xml"
    assert conform.profile == "ci"
    assert conform.created == "2026-12-01T00:11:42.412160+00:00"
    assert conform.examples["reference"]["test_outputs_match_oracle"] == 102
    assert {c.backend for c in conform.cases} == {"reference", "sdpa"}
    assert ConformanceCase("sdpa", "test_stateful_steps", "passed") in conform.cases
    assert conform.failed() == []
    assert inputs.skipped == []


def test_junit_outcomes_messages_and_backend_from_parameters(tmp_path):
    body = (
        '<testcase name="test_a[my-backend]"><properties>'
        '<property name="backend" value="my-backend"/></properties></testcase>'
        '<testcase name="test_b[my-backend-float32]"><failure message="error 3.0 over bound">'
        "trace</failure></testcase>"
        '<testcase name="test_c[other-x=1]"><error message="crashed in setup"/></testcase>'
        '<testcase name="test_d[my-backend]"><skipped message="outside the claim"/></testcase>'
        '<testcase name="test_e[my-backend]"><failure>only text</failure></testcase>'
    )
    run = load_junit(junit(tmp_path, body))
    assert run.cases == [
        ConformanceCase("my-backend", "test_a", "passed"),
        ConformanceCase("my-backend", "test_b", "failed", "error 3.0 over bound"),
        ConformanceCase("other", "test_c", "failed", "crashed in setup"),
        ConformanceCase("my-backend", "test_d", "unsupported", "outside the claim"),
        ConformanceCase("my-backend", "test_e", "failed", "only text"),
    ]
    assert [c.test for c in run.failed()] == ["test_b", "test_c", "test_e"]
    assert run.examples == {}  # no coverage file beside it
    assert run.profile is None


def test_pytest_benchmark_json_is_converted(tmp_path):
    from tests.test_benchmark_json import document

    path = tmp_path / "pb.json"
    path.write_text(json.dumps(document()))
    [run] = load_inputs([path]).bench
    assert [c.backend for c in run.record.cases] == ["contiguous-sdpa", "sdpa", "reference"]
    assert run.record.tool["name"] == "pytest-benchmark (suites/benchmarks)"


def test_labels_are_unique_side_by_side(tmp_path):
    a = copy_bench(tmp_path, "a.json")
    b = copy_bench(tmp_path, "b.json", sha="1234567890abcdef")
    c = copy_bench(tmp_path, "c.json", created="2026-12-01T09:30:00+00:00")
    labels = [r.label for r in load_inputs([a, b, c]).bench]
    assert labels == [
        "cpu 2026-12-01 50585f2 00:12:34",
        "cpu 2026-12-01 1234567",
        "cpu 2026-12-01 50585f2 09:30:00",
    ]
    same = [r.label for r in load_inputs([a, copy_bench(tmp_path, "d.json")]).bench]
    assert same == [
        "cpu 2026-12-01 50585f2 00:12:34 (a.json)",
        "cpu 2026-12-01 50585f2 00:12:34 (d.json)",
    ]


def test_a_file_named_twice_is_one_run(tmp_path):
    inputs = load_inputs([DATA, BENCH])
    assert len(inputs.bench) == 1


def test_folder_passes_over_foreign_documents_but_a_named_one_is_refused(tmp_path):
    shutil.copy(BENCH, tmp_path / "bench-cuda.json")
    (tmp_path / "graph-check.json").write_text('{"checks": []}')
    (tmp_path / "notes.xml").write_text("<notes/>")
    inputs = load_inputs([tmp_path])
    assert len(inputs.bench) == 1
    assert len(inputs.skipped) == 2
    assert "graph-check.json" in inputs.skipped[0]
    with pytest.raises(ReportError, match=r"graph-check\.json: neither"):
        load_inputs([tmp_path / "graph-check.json"])


def _unknown_status(path: Path) -> None:
    data = json.loads(BENCH.read_text())
    data["cases"][1]["status"] = "SORT_OF_PASSED"
    path.write_text(json.dumps(data))


def _benchmark_unknown_status(path: Path) -> None:
    from tests.test_benchmark_json import document

    doc = document()
    doc["benchmarks"][0]["extra_info"]["attn_harness"]["record"]["status"] = "SORT_OF_PASSED"
    path.write_text(json.dumps(doc))


def _version_2(path: Path) -> None:
    data = json.loads(BENCH.read_text())
    data["schema_version"] = 2
    path.write_text(json.dumps(data))


BAD_FILES = [
    (
        "truncated.json",
        lambda p: p.write_text(BENCH.read_text()[:500]),
        "not valid JSON, or cut short",
    ),
    ("empty.json", lambda p: p.write_text(""), "not valid JSON"),
    ("text.json", lambda p: p.write_text("hello, world"), "not valid JSON"),
    ("binary.json", lambda p: p.write_bytes(b"\xff\xfe\x00\x81"), "not a text"),
    ("v2.json", _version_2, "schema_version 2 is not supported"),
    ("status.json", _unknown_status, "SORT_OF_PASSED"),
    ("pb-status.json", _benchmark_unknown_status, "SORT_OF_PASSED"),
    ("other.json", lambda p: p.write_text('{"foo": 1}'), "neither an attn-harness results file"),
    ("list.json", lambda p: p.write_text("[1, 2]"), "neither"),
    ("page.xml", lambda p: p.write_text("<html><body/></html>"), "not JUnit XML"),
    ("cut.xml", lambda p: p.write_text("<testsuites><testsuite>"), "not valid XML, or cut short"),
    ("nameless.xml", lambda p: p.write_text("<testsuite><testcase/></testsuite>"), "no name"),
]


@pytest.mark.parametrize(("name", "write", "message"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_each_bad_file_is_one_error_naming_it(tmp_path, name, write, message):
    path = tmp_path / name
    write(path)
    with pytest.raises(ReportError, match=message) as caught:
        load_inputs([path])
    assert str(path) in str(caught.value)


def test_examples_left_unchecked_are_read_and_a_bad_count_is_named(tmp_path):
    left = '<property name="not_checked" value="{}"/>'
    case = '<testcase name="test_a[b]"><properties>' + left + "</properties></testcase>"
    run = load_junit(junit(tmp_path, case.format("3")))
    assert run.cases == [ConformanceCase("b", "test_a", "passed", None, 3)]
    with pytest.raises(ReportError, match="not_checked is 'many', not a count"):
        load_junit(junit(tmp_path, case.format("many")))


def test_bad_coverage_beside_junit_is_named(tmp_path):
    xml = junit(tmp_path, '<testcase name="test_a[x]"/>')
    coverage = tmp_path / "c.coverage.json"
    coverage.write_text('{"backends": {"x": {"examples_by_test": {"test_a": "many"}}}}')
    with pytest.raises(ReportError, match="examples_by_test") as caught:
        load_inputs([xml])
    assert str(coverage) in str(caught.value)
    coverage.write_text('{"profile": "ci"')
    with pytest.raises(ReportError, match=r"c\.coverage\.json: not valid JSON"):
        load_inputs([xml])


def test_a_coverage_file_alone_is_refused(tmp_path):
    path = tmp_path / "x.coverage.json"
    shutil.copy(DATA / "conform.coverage.json", path)
    with pytest.raises(ReportError, match=r"x.coverage.json: .* name x.xml instead"):
        load_inputs([path])


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda tmp: [], "no input given"),
        (lambda tmp: [tmp / "missing.json"], "missing.json: no such file or folder"),
        (lambda tmp: [tmp], "holds no \\*.json or \\*.xml"),
    ],
    ids=["no-paths", "missing", "empty-folder"],
)
def test_unusable_path_sets(tmp_path, setup, message):
    with pytest.raises(ReportError, match=message):
        load_inputs(setup(tmp_path))


def test_folder_with_nothing_usable(tmp_path):
    (tmp_path / "graph-check.json").write_text("{}")
    with pytest.raises(ReportError, match="nothing to report on") as caught:
        load_inputs([tmp_path])
    assert str(tmp_path) in str(caught.value)


def test_schema_is_checked_for_converted_pytest_benchmark(tmp_path):
    """A converted document is held to the same schema as a results file."""
    from tests.test_benchmark_json import document

    doc = document()
    doc["benchmarks"][0]["extra_info"]["attn_harness"]["record"]["forward"]["samples_ns"] = [1]
    path = tmp_path / "pb.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ReportError, match=r"pb\.json"):
        load_inputs([path])


def test_saved_results_round_trip_through_the_loader(tmp_path):
    """Whatever save_results writes, the report reads (the two share one schema)."""
    from tests.test_results import run

    path = save_results(run(), tmp_path / "r.json")
    [loaded] = load_inputs([path]).bench
    assert loaded.label == "cpu 2026-01-01 abc"
