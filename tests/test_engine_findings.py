"""tools/engine_findings.py: an engine kernel's CI run may fail only for recorded findings."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.engine_findings import main

WINDOW = "scenario: dp 0/1 shared, float32, H=4 KV=2 D=8 page=2, rows (q/L) [1/10], window=2"
STATEFUL = "rank 0, step 3: max error 3.3\ngeometry: dp 0/1 shared, rows (q/L) [1/5], window=1"
PLAIN = "scenario: dp 0/1 shared, float32, H=4 KV=2 D=8 page=2, rows (q/L) [1/10]"


def junit(tmp_path: Path, *cases: tuple[str, str, str]) -> Path:
    """A JUnit report: each case is (test name, outcome tag or "", report text)."""
    body = "".join(
        f'<testcase classname="suites.conformance" name="{name}">'
        + (f'<{tag} message="layer 0: max error 6.1">{text}</{tag}>' if tag else "")
        + "</testcase>"
        for name, tag, text in cases
    )
    path = tmp_path / "run.xml"
    path.write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")
    return path


VLLM_ALIBI = (
    "scenario: dp 0/2 per_rank, float32, rows (q/L) [3/16], window=64 sinks=[0.9] alibi=[-0.06]"
)


def test_failures_with_the_recorded_evidence_pass(tmp_path, capsys):
    report = junit(
        tmp_path,
        ("test_outputs_match_oracle[sglang-triton-float32]", "failure", WINDOW),
        ("test_stateful_steps[sglang-triton]", "failure", STATEFUL),
        ("test_canary[sglang-triton]", "", ""),
        ("test_every_rank_matches_oracle[vllm-triton]", "failure", VLLM_ALIBI),
    )
    assert main([str(report)]) == 0
    out = capsys.readouterr().out
    assert "2 failure(s): test_outputs_match_oracle[sglang-triton-float32]" in out
    assert "1 failure(s): test_every_rank_matches_oracle[vllm-triton]" in out
    assert "each a finding docs/engines.md records" in out


@pytest.mark.parametrize(
    ("name", "tag", "text"),
    [
        ("test_outputs_match_oracle[sglang-triton-float32]", "failure", PLAIN),  # no window
        ("test_outputs_match_oracle[vllm-triton-float32]", "failure", WINDOW),  # not its finding
        ("test_outputs_match_oracle[vllm-triton-float32]", "failure", f"{PLAIN} alibi=[1]"),
        ("test_canary[sglang-triton]", "error", WINDOW),  # an error is never a finding
    ],
)
def test_anything_else_fails_and_is_named(tmp_path, capsys, name, tag, text):
    assert main([str(junit(tmp_path, (name, tag, text)))]) == 1
    assert name in capsys.readouterr().err


def test_a_finding_not_reproduced_is_said_and_a_missing_report_is_a_usage_error(tmp_path, capsys):
    assert main([str(junit(tmp_path, ("test_canary[sglang-triton]", "", "")))]) == 0
    assert "not reproduced" in capsys.readouterr().out
    assert main([str(tmp_path / "absent.xml")]) == 2


def test_a_promised_value_never_checked_fails_though_every_test_passed(tmp_path, capsys):
    report = junit(tmp_path, ("test_canary[vllm-cpu]", "", ""))
    text = report.read_text().replace(
        "<testsuite>",
        '<testsuite><properties><property name="coverage[vllm-cpu].never_checked" '
        'value="tokens: 16385-65536"/></properties>',
    )
    report.write_text(text)
    assert main([str(report)]) == 1
    assert "coverage[vllm-cpu]: tokens: 16385-65536" in capsys.readouterr().err
