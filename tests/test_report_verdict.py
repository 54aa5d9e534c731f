"""The report leads with its answer: the verdict first, rows that say nothing collapsed, and
figures built as small multiples whose every panel has a readable scale."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from harness.report import build_report
from harness.report.figure_style import log_ticks
from harness.report.inputs import ConformanceCase, ConformanceRun, Inputs, load_inputs
from harness.report.perf_figures import ratio_plot, roofline_plot
from harness.report.stats import analyse
from harness.report.summary_md import render_summary
from harness.report.verdict import verdict_of
from tests.test_report_build import bench_data, only_decode, write_json

DATA = Path(__file__).parent / "data" / "report"
BENCH = DATA / "bench.json"
HOSTILE = "<script>alert(1)</script>"
FLAG = "measurement error: compute at 220% of its ceiling"
REASON = "runs interpreted on cpu: its time says nothing, not timed"


def unsupported(data: dict, backend: str) -> dict:
    """Every case of ``backend`` as a backend declares one it cannot run."""
    data = copy.deepcopy(data)
    for case in data["cases"]:
        if case["backend"] == backend:
            case.update(status="UNSUPPORTED", error=REASON, oracle=None, forward=None)
            case.update(prepare=None, metrics=None, flags=[])
    return data


def flagged(data: dict) -> dict:
    """One case flagged as the bench flags a rate above its ceiling; a warning on the run."""
    data = copy.deepcopy(data)
    case = next(c for c in data["cases"] if c["backend"] == "sdpa" and c["case"] == "ctx=1024")
    case["flags"] = [FLAG]
    data["timing"]["warnings"] = ["the clock stepped back once"]
    return data


def failing_conformance(tmp_path: Path) -> Path:
    xml = tmp_path / "conform.xml"
    xml.write_text(
        '<testsuites><testsuite name="s">'
        '<testcase name="test_outputs_match_oracle[good]"/>'
        '<testcase name="test_outputs_match_oracle[broken]">'
        '<failure message="max error 3.1 at token 2"/></testcase>'
        '<testcase name="test_rejects[broken]"/>'
        "</testsuite></testsuites>"
    )
    return xml


def section(page: str, name: str) -> str:
    start = page.index(f'<section id="{name}">')
    return page[start : page.index("</section>", start)]


# -- order: verdict, figures, ..., inputs --------------------------------------------------


def test_page_leads_with_the_verdict_and_ends_with_the_inputs(tmp_path):
    out = tmp_path / "r"
    build_report([DATA], out)
    page = (out / "index.html").read_text()
    order = [page.index(f'<section id="{name}">') for name in ("verdict", "figures", "run-1")]
    order += [page.index(f'<section id="{name}">') for name in ("conformance", "inputs")]
    assert order == sorted(order)
    assert page.index('<section id="verdict">') < page.index("<img data-figure")
    assert page.index("<h4>Environment</h4>") > page.index('<section id="inputs">')
    verdict = section(page, "verdict")
    assert "PASSED: 2 of 2 backends conform; 12 cases timed; no measurement flag" in verdict
    assert re.search(
        r"<td>sdpa</td><td class=\"num\">6/6</td><td class=\"num\">[\d.]+x \(", verdict
    )


def test_summary_leads_with_the_verdict(tmp_path):
    out = tmp_path / "r"
    build_report([DATA], out)
    summary = (out / "summary.md").read_text()
    heads = [summary.index(h) for h in ("### Verdict", "### Conformance", "### Performance")]
    assert heads == sorted(heads)
    assert heads[-1] < summary.index("### Inputs")
    verdict = summary[heads[0] : heads[1]]
    assert "**PASSED: 2 of 2 backends conform; 12 cases timed; no measurement flag**" in verdict
    assert "| reference | passed | 36/36 | 0 | 0 |" in verdict
    assert "Flags: none" in verdict


# -- what fails and what is flagged appears in the verdict ----------------------------------


def test_a_failing_conformance_backend_leads_the_verdict_with_a_link(tmp_path):
    out = tmp_path / "r"
    build_report([BENCH, failing_conformance(tmp_path)], out)
    page = (out / "index.html").read_text()
    verdict = section(page, "verdict")
    assert "FAILED: conformance failed for broken;" in verdict
    assert '<tr class="failed"><td>broken</td><td class="verdict-failed">FAILED</td>' in verdict
    assert '<a href="#failure-1">1 failed test(s)</a>' in verdict
    assert '<li id="failure-1"><strong>broken</strong> · test_outputs_match_oracle' in page
    assert '<td>good</td><td class="verdict-passed">PASSED</td>' in verdict
    summary = (out / "summary.md").read_text()
    assert summary.index("**FAILED: conformance failed for broken;") < summary.index("### Perf")
    assert "| broken | FAILED | 1/2 | 1 | 0 |" in summary


def test_failure_links_follow_the_listing_order_across_backends():
    run = ConformanceRun(
        path=Path("c.xml"),
        cases=[
            ConformanceCase("a", "t1", "passed"),
            ConformanceCase("b", "t1", "failed", "b first"),
            ConformanceCase("a", "t2", "failed", "a second"),
            ConformanceCase("b", "t2", "failed", "b third"),
        ],
        examples={},
    )
    verdict = verdict_of(Inputs(bench=[], conformance=[run, run]), [])
    assert [(line.backend, line.failures) for line in verdict.conformance] == [
        ("a (c.xml)", (1,)),
        ("b (c.xml)", (0, 2)),
        ("a (c.xml)", (4,)),
        ("b (c.xml)", (3, 5)),
    ]
    assert [f.message for f in verdict.failures[:3]] == ["b first", "a second", "b third"]


def test_a_flagged_case_and_a_run_warning_appear_in_the_verdict(tmp_path):
    out = tmp_path / "r"
    build_report([write_json(tmp_path / "f.json", flagged(bench_data()))], out)
    verdict = section((out / "index.html").read_text(), "verdict")
    assert "<h3>Flags (2)</h3>" in verdict
    assert "; 2 measurement flags" in verdict  # in the headline, though nothing failed
    assert (
        '<tr class="failed"><td>decode-sweep</td><td>ctx=1024</td><td>sdpa</td>'
        f"<td>{FLAG}</td></tr>"
    ) in verdict
    assert "<td>(run)</td><td>-</td><td>-</td><td>timing.warnings: the clock stepped" in verdict
    summary = (out / "summary.md").read_text()
    flags = summary[: summary.index("### Performance")]
    assert "Flags: **2**" in flags
    assert f"- decode-sweep / ctx=1024 / sdpa: {FLAG}" in flags


def test_a_partial_run_is_flagged():
    inputs = load_inputs([BENCH])
    inputs.bench[0].record.partial = True
    verdict = verdict_of(inputs, analyse(inputs.bench))
    assert [f.text for f in verdict.flags] == ["partial run: it stopped before its last case"]


# -- rows that say nothing are collapsed ----------------------------------------------------


def test_unsupported_cases_collapse_into_one_line_per_backend(tmp_path):
    out = tmp_path / "r"
    build_report([write_json(tmp_path / "u.json", unsupported(bench_data(), "reference"))], out)
    page = (out / "index.html").read_text()
    assert "<td>UNSUPPORTED</td>" not in page
    assert f"<li>reference: 6 cases unsupported ({REASON})</li>" in section(page, "run-1")
    cases = section(page, "run-1")
    assert cases.count("<tr><td>decode-sweep</td>") == 3 * 2  # the peer and sdpa, 3 cases each
    verdict = section(page, "verdict")
    assert "0/6</td>" in verdict
    assert f"6 unsupported ({REASON})" in verdict
    summary = (out / "summary.md").read_text()
    assert "UNSUPPORTED" not in summary
    assert f"- reference: 6 cases unsupported ({REASON})" in summary
    table = [line for line in summary.splitlines() if line.startswith("| workload / case")]
    assert table == ["| workload / case | contiguous-sdpa (time) | sdpa |"]  # no empty column


def test_interval_cells_are_compact_and_do_not_wrap(tmp_path):
    out = tmp_path / "r"
    build_report([BENCH], out)
    page = (out / "index.html").read_text()
    assert re.search(r"td\.num \{[^}]*white-space: nowrap", page)
    cells = re.findall(r'<td class="num">(\d+\.\d\dx \[[^<]*\])</td>', page)
    assert cells
    assert all(re.fullmatch(r"\d+\.\d\dx \[\d+\.\d\d, \d+\.\d\d\]", c) for c in cells)


# -- figures: one panel per workload, a readable scale in each --------------------------------


def runs_of(*paths: Path):
    return analyse(load_inputs(paths).bench)


def visible_axes(figure):
    return [ax for ax in figure.axes if ax.get_visible()]


def test_ratio_figure_is_one_panel_per_workload():
    figure = ratio_plot(runs_of(BENCH))
    assert not isinstance(figure, str)
    axes = visible_axes(figure)
    assert [ax.get_title() for ax in axes] == ["decode-sweep@1", "dp-scaling@1"]
    decode = [t.get_text() for t in axes[0].get_xticklabels()]
    assert decode == ["ctx=512", "ctx=1024", "ctx=4096"]  # the panel's own cases, in order
    assert all(len(ax.get_lines()) >= 2 for ax in axes)  # the peer's line at 1x and a backend


def labelled_ticks(ax) -> list[str]:
    ax.figure.canvas.draw()
    low, high = ax.get_ylim()
    return [
        t.get_text()
        for t in ax.get_yticklabels()
        if t.get_text() and low <= t.get_position()[1] <= high
    ]


def test_a_single_workload_gets_several_ratio_ticks(tmp_path):
    path = write_json(tmp_path / "decode.json", only_decode(bench_data()))
    figure = ratio_plot(runs_of(path))
    assert not isinstance(figure, str)
    [ax] = visible_axes(figure)
    assert len(labelled_ticks(ax)) >= 2


def test_ratios_close_together_still_get_several_ticks(tmp_path):
    data = only_decode(bench_data())
    by_id = {c["id"]: c for c in data["cases"]}
    for case in data["cases"]:  # every backend as fast as its peer, give or take 2%
        if case["role"] == "backend":
            peer = by_id[case["peer"]]["forward"]["samples_ns"]
            case["forward"]["samples_ns"] = [int(s * 1.01) for s in peer]
    figure = ratio_plot(runs_of(write_json(tmp_path / "flat.json", data)))
    assert not isinstance(figure, str)
    [ax] = visible_axes(figure)
    assert len(labelled_ticks(ax)) >= 2


@pytest.mark.parametrize(
    ("low", "high"),
    [(0.95, 1.05), (0.99, 1.01), (0.5, 2.0), (0.8, 30.0), (0.001, 5000.0), (1.0, 1.3), (3.0, 3.5)],
)
def test_ratio_ticks_lie_in_range_and_are_few(low, high):
    ticks = log_ticks(low, high)
    assert 2 <= len(ticks) <= 8
    assert all(low <= t <= high for t in ticks)
    assert ticks == sorted(set(ticks))


def test_roofline_is_one_panel_per_workload_with_each_case_named():
    drawn = roofline_plot(runs_of(BENCH))
    assert not isinstance(drawn, str)
    figure, ceilings = drawn
    assert ceilings == 1
    axes = visible_axes(figure)
    assert [ax.get_title() for ax in axes] == ["decode-sweep@1", "dp-scaling@1"]
    legend = axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["ctx=512", "ctx=1024", "ctx=4096"]


def test_roofline_spreads_cases_of_one_intensity_apart():
    """Decode cases of every context share one intensity; each must be seen on its own."""
    drawn = roofline_plot(runs_of(BENCH))
    assert not isinstance(drawn, str)
    ax = visible_axes(drawn[0])[0]
    intensities = [c.intensity for c in runs_of(BENCH)[0].cases if c.kind == "decode"]
    assert max(intensities) / min(intensities) < 1.03  # one column, were they not spread
    xs = sorted({round(float(x), 6) for c in ax.collections for x, _ in c.get_offsets()})
    assert len(xs) == 3  # one x per case
    assert xs[-1] / xs[0] == pytest.approx(10**0.3, rel=0.05)  # side by side, a factor 2 apart


# -- escaping -------------------------------------------------------------------------------


def test_hostile_names_and_flags_are_text_in_the_verdict(tmp_path):
    data = flagged(bench_data())
    for case in data["cases"]:
        if case["backend"] == "sdpa":
            case["backend"] = HOSTILE
            case["flags"] = [f"flag {HOSTILE} | `x`"]
    data["timing"]["warnings"] = [HOSTILE]
    xml = failing_conformance(tmp_path)
    xml.write_text(xml.read_text().replace("[broken]", "[&lt;img src=x onerror=alert(1)&gt;]"))
    out = tmp_path / "r"
    build_report([write_json(tmp_path / "h.json", data), xml], out)
    verdict = section((out / "index.html").read_text(), "verdict")
    assert "<script" not in verdict
    assert "<img" not in verdict
    assert "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>" in verdict
    assert "flag &lt;script&gt;alert(1)&lt;/script&gt; | `x`" in verdict
    assert "conformance failed for &lt;img src=x onerror=alert(1)&gt;" in verdict
    summary = (out / "summary.md").read_text()
    assert "<script" not in summary
    assert "<img" not in summary
    assert "flag &lt;script&gt;alert(1)&lt;/script&gt; \\| \\`x\\`" in summary
    assert "**FAILED: conformance failed for &lt;img src=x onerror=alert(1)&gt;;" in summary


def test_summary_of_conformance_only_still_leads_with_the_verdict():
    run = ConformanceRun(
        path=Path("c.xml"), cases=[ConformanceCase("fast", "t", "passed")], examples={}
    )
    summary = render_summary("t", Inputs(bench=[], conformance=[run]), [])
    assert summary.index("### Verdict") < summary.index("### Conformance")
    assert "**PASSED: 1 of 1 backend conforms; no measurement flag**" in summary
    assert "### Performance" not in summary


def test_the_runs_own_flags_reach_the_verdict():
    """A bench run's top-level ``flags`` (a ceiling whose probes disagree) are run flags."""
    inputs = load_inputs([BENCH])
    inputs.bench[0].record.flags = ["ceiling spread: copy bandwidth 4.47 GB/s to 7.01 GB/s"]
    verdict = verdict_of(inputs, analyse(inputs.bench))
    assert [f.text for f in verdict.flags] == [
        "ceiling spread: copy bandwidth 4.47 GB/s to 7.01 GB/s"
    ]


def test_each_workload_shows_every_backend_and_the_peer_against_the_ceiling(tmp_path):
    """A row per workload, a column per backend: each one's share of the binding ceiling."""
    out = tmp_path / "r"
    build_report([DATA], out)
    runs = runs_of(DATA)
    verdict = verdict_of(load_inputs([DATA]), runs)
    workloads = list(dict.fromkeys(c.case.workload for c in runs[0].cases))
    assert len(workloads) >= 2
    assert [line.workload for line in verdict.by_workload] == sorted(
        (line.workload for line in verdict.by_workload), key=workloads.index
    )
    backends = {line.backend for line in verdict.by_workload}
    assert "contiguous-sdpa" in backends
    assert len(backends) >= 2
    for line in verdict.by_workload:
        own = [
            c.roofline_fraction
            for c in runs[0].cases
            if c.case.workload == line.workload and c.case.backend == line.backend and c.counts
        ]  # an unreliable case (two clusters of samples) is in no range
        assert line.roofline is not None
        assert line.roofline.low == min(own)
        assert line.roofline.high == max(own)
    page = section((out / "index.html").read_text(), "verdict")
    table = page[page.index("Against the machine, per workload") :]
    assert all(f"<td>{w}</td>" in table for w in workloads)
    summary = (out / "summary.md").read_text()
    assert "Against the machine (share of the binding ceiling), per workload:" in summary
    grid = summary[summary.index("per workload:") :]
    assert all(f"| {w} |" in grid for w in workloads)


def test_a_backend_bound_by_both_ceilings_says_so_with_counts(tmp_path):
    """Its decode cases outnumber its compute-bound ones; the most common bound alone
    would call the whole backend memory-bound."""
    data = bench_data()
    sdpa = [c for c in data["cases"] if c["backend"] == "sdpa" and c["metrics"]]
    sdpa[0]["metrics"]["flops"] = sdpa[0]["metrics"]["flops"] * 1e6  # past the matmul ceiling
    path = write_json(tmp_path / "mixed.json", data)
    runs = runs_of(path)
    own = [c.bound for c in runs[0].cases if c.case.backend == "sdpa" and c.valid]
    assert own.count("compute") == 1
    assert own.count("memory") == len(own) - 1
    lines = {line.backend: line for line in verdict_of(load_inputs([path]), runs).performance}
    assert lines["sdpa"].bound == f"memory {len(own) - 1}, compute 1"
    assert lines["reference"].bound == "memory"  # one bound: no counts
    out = tmp_path / "r"
    build_report([path], out)
    assert f"<td>memory {len(own) - 1}, compute 1</td>" in section(
        (out / "index.html").read_text(), "verdict"
    )
