"""The table ``attn-harness bench`` prints: width, headers, flags legend, untimed failures.

Records are built by hand (no run), so each test shows exactly what a
reader of the table sees for a given results file, old ones included.
"""

from __future__ import annotations

import re
from typing import Any

from harness.bench.peer import PEER_NAME
from harness.bench.table import BACKEND_WIDTH, WIDTH, render, short_backend_names
from harness.bench.workloads import CaseSpec
from harness.results.store import CaseRecord, RunRecord, TimingRecord

FILE_SPEC = "/home/someone/projects/attention/kernels/paged_backends.py:HalfPrecisionPagedBackend"
LONG_CASE = "6 decode@1024 + chunk 256/768 + prompt 128"
SPEC = CaseSpec(LONG_CASE, (1024,) * 6 + (768, 128), (1,) * 6 + (256, 128))
MEASUREMENT_ERROR = "measurement error: bandwidth at 400% of its ceiling (above 100% is impossible)"


def timing(*samples: int) -> TimingRecord:
    return TimingRecord(
        samples_ns=list(samples or (4_000_000, 4_100_000, 3_900_000, 4_050_000, 3_950_000)),
        warmup_ns=[],
        clock="perf_counter_ns",
        threads=1,
        stop_reason="converged",
    )


def metrics(**kw: Any) -> dict[str, Any]:
    base = {
        "tokens_per_s": 97_500.0,
        "roofline_fraction": 0.18,
        "bound": "memory",
        "ratio_to_peer": 1.26,
        "ratio_to_peer_ci": [1.22, 1.31],
    }
    return {**base, **kw}


def record_of(backend: str, status: str = "PASSED", **kw: Any) -> CaseRecord:
    fields: dict[str, Any] = dict(
        id=f"mixed@1/{LONG_CASE}::{backend}",
        role="peer" if backend == PEER_NAME else "backend",
        backend=backend,
        workload="mixed",
        workload_version=1,
        case=LONG_CASE,
        spec=SPEC.to_json(),
        status=status,
    )
    if status == "PASSED" and backend == PEER_NAME:
        fields.update(forward=timing(), metrics=metrics(ratio_to_peer=None, ratio_to_peer_ci=None))
    elif status == "PASSED":
        fields.update(forward=timing(), metrics=metrics())
        fields["prepare"] = timing(70_000, 71_000, 69_000, 70_500, 70_200)
    fields.update(kw)
    return CaseRecord(**fields)


def run_of(*cases: CaseRecord) -> RunRecord:
    return RunRecord(
        created="2024-01-01T00:00:00+00:00",
        tool={"name": "attn-harness bench", "version": "0.1.0"},
        environment={},
        ceilings={"used": None, "measured": None, "datasheet": None},
        timing={"clock": "perf_counter_ns", "threads": 1, "cold_cache": True, "overhead": None},
        workloads=[{"name": "mixed", "version": 1, "size": "cpu", "description": "ragged"}],
        cases=list(cases),
    )


def table_lines(text: str) -> list[str]:
    """The table itself: the lines before the first blank one."""
    return text.split("\n\n")[0].splitlines()


def unwrapped(text: str) -> str:
    """The lines below the table as one line each (they are wrapped with a 4-space indent)."""
    return text.replace("\n    ", " ")


def cells(text: str, backend_label: str) -> list[str]:
    """The cells of the row of ``backend_label`` (cells are separated by 2+ spaces)."""
    for line in text.splitlines():
        if line.strip().startswith(backend_label + "  "):
            return re.split(r" {2,}", line.strip())
    raise AssertionError(f"no row for {backend_label!r} in\n{text}")


def test_a_long_run_fits_about_110_columns_and_shows_no_double_slash() -> None:
    text = render(
        run_of(
            record_of(PEER_NAME),
            record_of("sdpa", flags=[MEASUREMENT_ERROR]),
            record_of(
                FILE_SPEC,
                "INCORRECT_NUMERICAL",
                error="vs float64 oracle: max error 1.2e-02 at token 2, head 7 " * 4,
            ),
        )
    )
    assert max(len(line) for line in text.splitlines()) <= 120, text
    assert max(len(line) for line in table_lines(text)) <= WIDTH + 10, text
    assert "//" not in text
    assert LONG_CASE in text  # the case, whole, on its own line
    assert FILE_SPEC in text  # the full spec, on a legend line below the table


def test_every_column_has_a_header_and_flags_are_explained() -> None:
    text = render(run_of(record_of(PEER_NAME), record_of("sdpa", flags=[MEASUREMENT_ERROR])))
    header = text.splitlines()[0]
    columns = re.split(r" {2,}", header.strip())
    assert len(columns) == len(cells(text, "sdpa"))  # one header per column, none blank
    assert "!" not in header
    assert "flags" in columns
    assert cells(text, "sdpa")[-1] == "[1]"
    legend = [line for line in text.splitlines() if line.startswith("flags:")]
    assert len(legend) == 1
    assert f"[1] sdpa on mixed@1 {LONG_CASE}: {MEASUREMENT_ERROR}" in unwrapped(text)


def test_no_flags_legend_without_flags() -> None:
    text = render(run_of(record_of(PEER_NAME), record_of("sdpa")))
    assert not any(line.startswith("flags:") for line in text.splitlines())
    assert "[1]" not in text


def test_passed_row_shows_times_rates_and_the_ratio() -> None:
    text = render(run_of(record_of(PEER_NAME), record_of("sdpa")))
    row = cells(text, "sdpa")
    assert row[:3] == ["sdpa", "PASSED", "4 ms"]
    assert row[3].startswith("±")
    assert row[4:] == ["70.2 us", "97.5k", "18% mem", "1.26x [1.22-1.31]"]
    assert cells(text, PEER_NAME)[-1] == "-"  # the peer has no ratio to itself


def test_a_failed_case_shows_its_status_and_no_time_even_with_old_samples() -> None:
    """Files from before failures went untimed still hold samples: never shown as a time."""
    old = record_of(
        "wrong",
        "INCORRECT_NUMERICAL",
        error="vs float64 oracle: max error 1.2e-02",
        forward=timing(1_000, 1_100, 1_050, 990, 1_200),
        prepare=timing(),
    )
    text = render(run_of(record_of(PEER_NAME), old))
    row = cells(text, "wrong")
    assert row[1] == "INCORRECT_NUMERICAL"
    assert set(row[2:]) == {"-"}
    (line,) = [line for line in table_lines(text) if "wrong" in line]
    assert "(" not in line  # no time in parentheses: it was never a result
    assert len(table_lines(text)) == 6  # header, rule, workload, case, two rows
    assert f"INCORRECT_NUMERICAL: wrong on mixed@1 {LONG_CASE}: vs float64" in unwrapped(text)


def test_long_specs_are_shortened_to_something_distinct() -> None:
    names = [
        "sdpa",
        FILE_SPEC,
        "/elsewhere/paged_backends.py:HalfPrecisionPagedBackend",  # same file and class names
        "some_vendor.kernels.attention_backends:Fast",
    ]
    shown = short_backend_names(names)
    assert shown["sdpa"] == "sdpa"
    assert shown["some_vendor.kernels.attention_backends:Fast"] == "attention_backends:Fast"
    # two specs that shorten alike are both shown in full rather than confused
    assert shown[FILE_SPEC] == FILE_SPEC
    alone = short_backend_names([FILE_SPEC])[FILE_SPEC]
    assert alone == "HalfPrecisionPagedBackend"
    assert len(alone) <= BACKEND_WIDTH


def test_a_shortened_backend_is_named_in_full_below_the_table() -> None:
    text = render(run_of(record_of(PEER_NAME), record_of(FILE_SPEC)))
    assert cells(text, "HalfPrecisionPagedBackend")[1] == "PASSED"
    assert f"backend HalfPrecisionPagedBackend is {FILE_SPEC}" in unwrapped(text)
