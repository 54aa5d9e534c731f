"""The results file: round trip, atomic writes, and a strict loader with clear errors."""

from __future__ import annotations

import json
import os
from importlib.util import find_spec
from pathlib import Path

import pytest

from harness.bench.workloads import CaseSpec
from harness.results.store import (
    SCHEMA_VERSION,
    CaseRecord,
    ResultsError,
    RunRecord,
    TimingRecord,
    dumps,
    load_results,
    save_results,
    schema,
)

needs_jsonschema = pytest.mark.skipif(
    find_spec("jsonschema") is None, reason="field-level checks need jsonschema"
)
SPEC = CaseSpec("ctx=8", (8, 8), (1, 1), num_heads=4, num_kv_heads=2, head_dim=8, page_size=4)


def timing(samples=(1000, 1100, 1050, 990, 1200, 1010)) -> TimingRecord:
    return TimingRecord(
        samples_ns=list(samples),
        warmup_ns=[5000],
        clock="perf_counter_ns",
        threads=2,
        stop_reason="converged",
    )


METRICS = {
    "tokens": 2,
    "flops": 1024,
    "bytes": 4096,
    "arithmetic_intensity": 0.25,
    "median_s": 1.03e-6,
    "tokens_per_s": 1.9e6,
    "tflops": 1e-3,
    "gbps": 4.0,
    "bandwidth_fraction": 0.1,
    "compute_fraction": 0.01,
    "roofline_fraction": 0.1,
    "bound": "memory",
    "ceiling_source": "measured",
    "ratio_to_peer": 1.2,
    "ratio_to_peer_ci": [1.1, 1.3],
}


def case(backend="sdpa", status="PASSED", **kw) -> CaseRecord:
    fields = dict(
        id=f"tiny@1/ctx=8/{backend}",
        role="backend",
        backend=backend,
        workload="tiny",
        workload_version=1,
        case="ctx=8",
        spec=SPEC.to_json(),
        status=status,
        backend_class="reference_backends.sdpa.SdpaBackend",
        oracle={"passed": True, "worst_ratio": 0.01, "detail": "max error ..."},
        forward=timing(),
        prepare=timing(),
        peer="tiny@1/ctx=8/contiguous-sdpa",
        metrics=dict(METRICS),
    )
    fields.update(kw)
    return CaseRecord(**fields)


def run(*cases: CaseRecord) -> RunRecord:
    return RunRecord(
        created="2026-01-01T00:00:00+00:00",
        tool={"name": "attn-harness bench", "version": "0.1.0", "command": ["bench"]},
        environment={
            "python": "3.11.9",
            "torch": "2.13.0+cpu",
            "triton": None,
            "device": "cpu",
            "device_name": "AMD EPYC",
            "driver": None,
            "cpu_model": "AMD EPYC",
            "threads": 2,
            "git": {"sha": "abc", "dirty": False},
        },
        ceilings={"used": None, "measured": None, "datasheet": None},
        timing={
            "device": "cpu",
            "clock": "perf_counter_ns",
            "threads": 2,
            "cold_cache": True,
            "config": {},
            "overhead": timing().to_json(),
        },
        workloads=[{"name": "tiny", "version": 1, "size": "cpu"}],
        cases=list(cases) or [case()],
    )


def test_round_trip(tmp_path):
    record = run(
        case(),
        case("bad", "INCORRECT_NUMERICAL", metrics=None, flags=["timed, but failing"]),
        case("gone", "RUNTIME_ERROR", forward=None, prepare=None, metrics=None, error="boom"),
    )
    path = save_results(record, tmp_path / "r.json")
    loaded = load_results(path)
    assert loaded.to_json() == record.to_json()
    assert loaded.case("tiny@1/ctx=8/bad").status == "INCORRECT_NUMERICAL"
    assert loaded.cases[0].forward.samples_ns == [1000, 1100, 1050, 990, 1200, 1010]
    assert [c.valid for c in loaded.cases] == [True, False, False]


def test_stored_summaries_are_informational_and_recomputed(tmp_path):
    path = save_results(run(), tmp_path / "r.json")
    data = json.loads(path.read_text())
    data["cases"][0]["forward"]["median_ns"] = 1.0  # a stale or doctored summary
    path.write_text(json.dumps(data))
    assert load_results(path).cases[0].forward.summary().median == 1030


def test_non_finite_numbers_become_null():
    text = dumps(
        run(
            case(
                oracle={"passed": False, "worst_ratio": float("inf"), "detail": "NaN"},
                status="INCORRECT_NUMERICAL",
                metrics=None,
            )
        )
    )
    assert json.loads(text)["cases"][0]["oracle"]["worst_ratio"] is None


def test_failed_serialisation_writes_nothing(tmp_path):
    target = tmp_path / "r.json"
    bad = run(case(spec={"dtype": object()}))
    with pytest.raises(ResultsError, match="serialise"):
        save_results(bad, target)
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    save_results(run(), target)
    before = target.read_text()

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="space"):
        save_results(run(case("other")), target)
    assert target.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


@needs_jsonschema
def test_a_record_the_loader_would_reject_is_never_written(tmp_path):
    too_few = case(forward=timing((1, 2, 3)))  # PASSED needs at least five samples
    with pytest.raises(ResultsError, match="samples_ns"):
        save_results(run(too_few), tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


def _write(tmp_path: Path, data) -> Path:
    path = tmp_path / "in.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _valid() -> dict:
    return json.loads(dumps(run()))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d.update(schema_version=SCHEMA_VERSION + 1),
            "schema_version 2 is not supported",
        ),
        (lambda d: d.update(schema_version="1"), "schema_version '1' is not supported"),
        (lambda d: d.update(schema="something-else"), "not an attn-harness results file"),
        pytest.param(
            lambda d: d.pop("environment"),
            "'environment' is a required property",
            marks=needs_jsonschema,
        ),
        pytest.param(
            lambda d: d["cases"][0].pop("status"),
            r"cases\[0\]: 'status' is a required",
            marks=needs_jsonschema,
        ),
        pytest.param(
            lambda d: d["cases"][0].update(status="FINE"),
            r"cases\[0\]\.status: 'FINE' is not one",
            marks=needs_jsonschema,
        ),
        pytest.param(
            lambda d: d["cases"][0]["forward"].update(samples_ns=[1, 2]),
            r"cases\[0\]\.forward\.samples_ns",
            marks=needs_jsonschema,
        ),
        pytest.param(
            lambda d: d["environment"].pop("git"),
            r"environment: 'git' is a required",
            marks=needs_jsonschema,
        ),
        pytest.param(
            lambda d: d["cases"][0]["metrics"].pop("flops"),
            "'flops' is a required",
            marks=needs_jsonschema,
        ),
    ],
)
def test_loader_rejects_wrong_files_with_a_clear_message(tmp_path, mutate, message):
    data = _valid()
    mutate(data)
    with pytest.raises(ResultsError, match=message):
        load_results(_write(tmp_path, data))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"schema": "attn-harness/results", ', r"not valid JSON \(line 1"),
        ("[1, 2]", "expected a JSON object, got list"),
        ("", "not valid JSON"),
    ],
)
def test_loader_rejects_malformed_json(tmp_path, content, message):
    with pytest.raises(ResultsError, match=message):
        load_results(_write(tmp_path, content))


def test_loader_rejects_missing_and_binary_files(tmp_path):
    with pytest.raises(ResultsError, match="cannot read"):
        load_results(tmp_path / "missing.json")
    binary = tmp_path / "b.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ResultsError, match="UTF-8"):
        load_results(binary)


def test_loader_without_jsonschema_still_rejects_missing_fields(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_jsonschema(name, *args, **kw):
        if name == "jsonschema":
            raise ImportError(name)
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_jsonschema)
    data = _valid()
    data["cases"][0].pop("spec")
    with pytest.raises(ResultsError, match="missing field 'spec'"):
        load_results(_write(tmp_path, data))


def test_schema_file_is_a_valid_json_schema():
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(schema())
    assert schema()["properties"]["schema_version"]["const"] == SCHEMA_VERSION


def test_unwritable_reason_allows_a_folder_the_write_makes(tmp_path):
    """``--junitxml out/conform.xml`` with no ``out/`` yet is a path the write can make."""
    from harness.core.atomic_file import unwritable_reason, write_atomically

    assert unwritable_reason(tmp_path / "new.json") is None
    assert unwritable_reason(tmp_path / "no" / "such" / "r.json") is None
    assert "is a directory" in unwritable_reason(tmp_path)
    assert list(tmp_path.iterdir()) == []  # the probe cleaned up after itself, made no folder
    (tmp_path / "a-file").write_text("x")
    assert "a-file is not a directory" in unwritable_reason(tmp_path / "a-file" / "sub" / "r.json")
    write_atomically(tmp_path / "no" / "such" / "r.json", "{}")
    assert (tmp_path / "no" / "such" / "r.json").read_text() == "{}"


def test_unknown_status_is_refused_in_memory():
    with pytest.raises(ValueError, match="status"):
        case(status="MAYBE")


def test_a_partial_run_says_so_and_a_finished_one_is_unchanged(tmp_path):
    finished = run(case())
    assert "partial" not in json.loads(dumps(finished))  # older readers see the same file
    cut = run(case())
    cut.partial = True
    path = save_results(cut, tmp_path / "cut.json")
    assert json.loads(path.read_text())["partial"] is True
    assert load_results(path).partial
    assert not load_results(save_results(finished, tmp_path / "done.json")).partial
