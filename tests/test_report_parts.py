"""The report's parts on their own: escaping helpers, the conformance matrix, failure listings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.report.figure_style import _text
from harness.report.figures import FIGURE_NAMES, SkippedFigure, conformance_matrix
from harness.report.figures import make_figures as draw
from harness.report.inputs import ConformanceCase, ConformanceRun, Inputs
from harness.report.page import render_page
from harness.report.summary_md import md, render_summary

REPO = Path(__file__).resolve().parents[1]


def conformance_run(name: str = "c.xml") -> ConformanceRun:
    return ConformanceRun(
        path=Path(name),
        cases=[
            ConformanceCase("fast", "test_matches_oracle", "passed"),
            ConformanceCase("fast", "test_rejects", "passed"),
            ConformanceCase("fast", "test_rejects", "failed", "accepted dp_rank=-1\nat line 3"),
            ConformanceCase("fast", "test_rejects", "passed"),
            ConformanceCase("slow", "test_matches_oracle", "unsupported", "outside the claim"),
            ConformanceCase("slow", "test_rejects", "passed"),
        ],
        examples={"fast": {"test_matches_oracle": 40}},
        profile="ci",
    )


def test_md_escapes_what_breaks_a_table_or_becomes_html():
    assert md("a|b`c<d>\n&e *f* [g](h) $x$") == (r"a\|b\`c&lt;d&gt; &amp;e \*f\* \[g\](h) \$x\$")


def test_text_for_matplotlib_is_literal():
    assert _text("$\\alpha$") == r"\$\alpha\$"  # no mathtext
    assert _text("_private") == " _private"  # a leading _ would hide the legend entry
    assert _text("x" * 200).endswith("…")
    assert len(_text("x" * 200)) == 60


def test_conformance_matrix_cells():
    tests, columns, cells = conformance_matrix([conformance_run()])
    assert tests == ["test_matches_oracle", "test_rejects"]
    assert columns == ["fast", "slow"]
    assert cells["test_matches_oracle", 0].text == "40 ex"
    assert (cells["test_rejects", 0].outcome, cells["test_rejects", 0].text) == (
        "failed",
        "failed 1/3",
    )
    assert cells["test_matches_oracle", 1].outcome == "unsupported"
    assert cells["test_rejects", 1].text == "1 case"


def test_conformance_matrix_of_two_runs_names_the_files():
    _, columns, _ = conformance_matrix([conformance_run("a.xml"), conformance_run("b.xml")])
    assert columns == ["fast (a.xml)", "slow (a.xml)", "fast (b.xml)", "slow (b.xml)"]


def test_nothing_given_skips_every_figure_with_a_reason():
    outcomes = draw([], [])
    assert [o.name for o in outcomes] == list(FIGURE_NAMES)
    assert all(isinstance(o, SkippedFigure) and o.reason for o in outcomes)


def test_failures_are_listed_with_their_messages():
    run = conformance_run()
    inputs = Inputs(bench=[], conformance=[run])
    summary = render_summary("t", inputs, [])
    assert "- c.xml (fast, slow, profile ci): 4 passed, 1 failed, 1 unsupported" in summary
    assert "  - FAILED fast · test\\_rejects: accepted dp\\_rank=-1 at line 3" in summary
    page = render_page("t", inputs, [], draw([], [run]))
    assert "<h4>Failures (1)</h4>" in page
    assert "<pre>accepted dp_rank=-1\nat line 3</pre>" in page
    assert '<tr class="failed"><td>fast</td><td class="num">3</td><td class="num">1</td>' in page


def test_building_loads_no_pyplot_and_keeps_the_backend(tmp_path):
    """The report draws on its own canvases: pyplot's global state is never touched."""
    source, out = str(REPO / "tests/data/report/conform.xml"), str(tmp_path / "r")
    code = (
        "import sys, matplotlib; before = matplotlib.rcParams._get('backend'); "
        "from harness.report import build_report; "
        f"build_report([{source!r}], {out!r}); "
        "print('matplotlib.pyplot' in sys.modules, matplotlib.rcParams._get('backend') == before)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert result.stdout.split() == ["False", "True"]
