"""Building a report: every figure, skipped ones with a note, escaping, atomic output, CLI codes."""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import matplotlib
import pytest

import harness.report as report
from harness.cli.report import add_report_command, main
from harness.report import ReportError, build_report
from harness.report.figures import FIGURE_NAMES
from harness.report.stats import run_stats
from harness.results.store import load_results

DATA = Path(__file__).parent / "data" / "report"
BENCH = DATA / "bench.json"
HOSTILE = "<script>alert(1)</script>"
QUOTES = "\"&'"
MATH = "$\\nocommand{$ | `tick` \n next"  # mathtext that cannot parse, table and code breakers


def bench_data() -> dict:
    return json.loads(BENCH.read_text())


def write_json(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def only_decode(data: dict) -> dict:
    """The sample run without its dp-scaling workload."""
    data = copy.deepcopy(data)
    data["workloads"] = [w for w in data["workloads"] if w["name"] == "decode-sweep"]
    data["cases"] = [c for c in data["cases"] if c["workload"] == "decode-sweep"]
    return data


def figure_imgs(page: str) -> list[str]:
    return re.findall(r'<img data-figure="([^"]+)"', page)


def meta_count(page: str) -> int:
    match = re.search(r'<meta name="attn-harness-figures" content="(\d+)">', page)
    assert match is not None
    return int(match.group(1))


class _Balance(HTMLParser):
    """Tag nesting as a browser would insist on: every non-void element closed in order."""

    VOID = frozenset({"meta", "img", "br", "hr", "link", "input", "col", "source", "wbr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.doctype = ""

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(f"unexpected </{tag}>")


def html_problems(page: str) -> list[str]:
    checker = _Balance()
    checker.feed(page)
    checker.close()
    problems = list(checker.errors) + [f"unclosed <{t}>" for t in checker.stack]
    if checker.doctype.lower() != "doctype html":
        problems.append(f"doctype {checker.doctype!r}")
    if not re.search(r'<head>\s*<meta charset="utf-8">', page):
        problems.append("no <meta charset> first in <head>")
    return problems


@pytest.fixture(scope="module")
def full_report(tmp_path_factory):
    """The sample run and conformance run, reported once through the command line."""
    out = tmp_path_factory.mktemp("full") / "report"
    rc_before = dict.copy(matplotlib.rcParams)  # dict.copy: reading 'backend' would resolve it
    code = main(["report", str(DATA), "--out", str(out), "--title", "Nightly"])
    assert code == 0
    assert dict.copy(matplotlib.rcParams) == rc_before
    return out


def test_full_input_draws_every_figure(full_report):
    page = (full_report / "index.html").read_text()
    assert figure_imgs(page) == list(FIGURE_NAMES)
    assert meta_count(page) == len(FIGURE_NAMES)
    assert "not drawn" not in page
    for name in FIGURE_NAMES:
        png = (full_report / "figures" / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        assert base64.b64encode(png).decode() in page  # the page embeds the same figure
        ET.fromstring((full_report / "figures" / f"{name}.svg").read_text())  # well-formed SVG
        assert f'href="figures/{name}.svg"' in page
    assert sorted(p.name for p in full_report.iterdir()) == ["figures", "index.html", "summary.md"]


def test_page_is_valid_self_contained_html(full_report):
    page = (full_report / "index.html").read_text()
    assert html_problems(page) == []
    assert "<title>Nightly</title>" in page
    assert "<script" not in page
    assert "<link" not in page
    assert re.search(r"(src|href)=\"(https?:)?//", page) is None  # nothing fetched
    assert re.findall(r'src="([a-z]+):', page) == ["data"] * len(FIGURE_NAMES)


def test_page_tables_show_environment_ceilings_cases_and_conformance(full_report):
    page = (full_report / "index.html").read_text()
    for text in (
        "AMD EPYC",  # cpu model
        "2.13.0+cpu",  # torch
        "50585f22754421421d8a4de2a09ee7ffd0308f73",  # git sha
        "15.28 GB/s",  # measured bandwidth ceiling
        "perf_counter_ns",  # timing setup
        "decode-sweep",
        "ctx=512",
        "x peer [CI]",
        "examples held",
    ):
        assert text in page, text
    cases = page[page.index('<section id="run-1">') :]
    assert cases.count("<tr><td>decode-sweep</td>") == 9  # the case rows (3 backends x 3)


def test_summary_md_lists_runs_cases_and_conformance(full_report):
    summary = (full_report / "summary.md").read_text()
    assert summary.startswith("## Nightly\n")
    assert "cpu 2026\\-12\\-01 50585f2" not in summary  # "-" needs no escape
    assert "**cpu 2026-12-01 50585f2**" in summary
    performance = summary[summary.index("### Performance") :]
    rows = [line for line in performance.splitlines() if line.startswith("| ")]
    assert len(rows) == 2 + 6  # header, rule, one per case (its three backends side by side)
    assert rows[0] == "| workload / case | contiguous-sdpa (time) | reference | sdpa |"
    assert (
        "conform.xml (reference, sdpa, profile ci): 72 passed, 0 failed, 0 unsupported" in summary
    )


def test_figure_without_data_is_skipped_with_a_note(tmp_path):
    path = write_json(tmp_path / "decode.json", only_decode(bench_data()))
    out = tmp_path / "report"
    build_report([path], out)
    page = (out / "index.html").read_text()
    drawn = [n for n in FIGURE_NAMES if n not in ("dp-scaling", "conformance")]
    assert figure_imgs(page) == drawn
    assert meta_count(page) == len(drawn)
    assert "not drawn: no passing case of a dp-scaling workload in the input" in page
    assert "not drawn: no conformance JUnit XML with test cases in the input" in page
    assert not (out / "figures" / "dp-scaling.png").exists()
    assert sorted(p.stem for p in (out / "figures").glob("*.svg")) == sorted(drawn)


def test_conformance_only_skips_every_benchmark_figure(tmp_path):
    out = tmp_path / "report"
    build_report([DATA / "conform.xml"], out)
    page = (out / "index.html").read_text()
    assert figure_imgs(page) == ["conformance"]
    assert page.count("not drawn: no benchmark results given") == 5


def test_two_runs_side_by_side(tmp_path):
    first = write_json(tmp_path / "a.json", only_decode(bench_data()))
    data = only_decode(bench_data())
    data["environment"]["git"]["sha"] = "abcdef0123456789"
    second = write_json(tmp_path / "b.json", data)
    out = tmp_path / "report"
    build_report([first, second], out)
    svg = (out / "figures" / "time-vs-context.svg").read_text()
    for label in ("sdpa @ cpu 2026-12-01 50585f2", "sdpa @ cpu 2026-12-01 abcdef0"):
        assert label in svg  # matplotlib writes each text as a comment beside its glyphs
    page = (out / "index.html").read_text()
    assert "Run 1: cpu 2026-12-01 50585f2" in page
    assert "Run 2: cpu 2026-12-01 abcdef0" in page
    summary = (out / "summary.md").read_text()
    assert summary.count("| 2 | decode-sweep@1 / ") == 3  # the second run's rows carry its number
    assert summary.count("| 1 | decode-sweep@1 / ") == 3


def hostile_inputs(tmp_path: Path) -> list[Path]:
    data = bench_data()
    for case in data["cases"]:
        if case["backend"] == "sdpa":
            case["backend"] = HOSTILE
            case["flags"] = [f"flag {HOSTILE}"]
        if case["workload"] == "decode-sweep":
            case["workload"] = QUOTES
        if case["workload"] == "dp-scaling":
            case["workload"] = MATH
    data["workloads"][0]["name"] = QUOTES
    data["workloads"][1]["name"] = MATH
    bench = write_json(tmp_path / "hostile.json", data)
    xml = tmp_path / "hostile.xml"
    xml.write_text(
        '<testsuites><testsuite name="s"><testcase name="test_x[b]"><properties>'
        '<property name="backend" value="&lt;script&gt;alert(1)&lt;/script&gt;"/></properties>'
        '<failure message="&lt;img src=x onerror=alert(1)&gt; | `x`"/></testcase>'
        "</testsuite></testsuites>"
    )
    return [bench, xml]


def test_hostile_names_are_text_everywhere(tmp_path):
    out = tmp_path / "report"
    build_report(hostile_inputs(tmp_path), out, title=f"title {HOSTILE}")
    page = (out / "index.html").read_text()
    assert "<script" not in page
    assert "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&quot;&amp;&#x27;" in page
    assert html_problems(page) == []
    assert figure_imgs(page) == list(FIGURE_NAMES)  # every figure drew despite the names
    expected = {f"{n}.{kind}" for n in FIGURE_NAMES for kind in ("png", "svg")}
    assert {p.name for p in (out / "figures").iterdir()} == expected
    for svg in (out / "figures").glob("*.svg"):
        assert "<script" not in svg.read_text()
    summary = (out / "summary.md").read_text()
    assert "<script" not in summary
    assert "<img" not in summary
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in summary


def test_markdown_table_keeps_its_columns_with_hostile_names(tmp_path):
    out = tmp_path / "report"
    build_report(hostile_inputs(tmp_path)[:1], out)
    lines = (out / "summary.md").read_text().splitlines()
    tables: list[list[str]] = [[]]  # runs of consecutive table lines
    for line in lines:
        if line.startswith("| "):
            tables[-1].append(line)
        elif tables[-1]:
            tables.append([])
    tables = [t for t in tables if t]
    for table in tables:  # an unescaped | in a name would add a column to its row only
        assert len({len(re.findall(r"(?<!\\)\|", line)) for line in table}) == 1, table
    performance = tables[-1]
    assert len(re.findall(r"(?<!\\)\|", performance[0])) == 5  # case, peer, two backends
    assert len(performance) == 2 + 6  # a newline in a name did not split a row
    assert all(line.count("`") == line.count("\\`") for line in lines)


def test_statistics_come_from_samples_not_stored_summaries(tmp_path, ratio_ci_by_hand):
    data = bench_data()
    backend = next(c for c in data["cases"] if c["backend"] == "sdpa")
    backend["metrics"]["ratio_to_peer"] = 999.0
    backend["metrics"]["ratio_to_peer_ci"] = [998.0, 1000.0]
    backend["forward"]["median_ns"] = 1
    path = write_json(tmp_path / "tampered.json", data)
    record = load_results(path)
    [stats] = [s for s in run_stats(record) if s.case.id == backend["id"]]
    mine = backend["forward"]["samples_ns"]
    peer = next(c for c in data["cases"] if c["id"] == backend["peer"])["forward"]["samples_ns"]
    # by hand: the mean of the 4th and 5th of the 8 sorted samples
    assert statistics.median(mine) == (4767610 + 4885565) / 2 == 4826587.5
    assert statistics.median(peer) == (3816872 + 3900276) / 2 == 3858574
    assert stats.ratio_peer == pytest.approx(4826587.5 / 3858574, rel=1e-12)  # 1.2509
    assert stats.median_s == pytest.approx(4826587.5e-9, rel=1e-12)
    low, high = stats.ratio_peer_ci
    assert low <= stats.ratio_peer <= high
    assert min(mine) / max(peer) <= low  # no resample's ratio lies beyond the extremes
    assert high <= max(mine) / min(peer)
    assert [low, high] == pytest.approx(ratio_ci_by_hand(mine, peer), rel=1e-12)
    out = tmp_path / "report"
    build_report([path], out)
    for text in ((out / "index.html").read_text(), (out / "summary.md").read_text()):
        assert "999.00x" not in text
        assert f"{stats.ratio_peer:.2f}x [{stats.ratio_peer_ci[0]:.2f}, " in text


def test_roofline_draws_datasheet_ceilings_dashed(tmp_path):
    data = only_decode(bench_data())
    data["ceilings"]["datasheet"] = {
        "source": "datasheet",
        "device_name": "AMD EPYC",
        "memory_bandwidth": 4.0e10,
        "matmul_flops": {"float32": 2.0e11},
    }
    out = tmp_path / "report"
    build_report([write_json(tmp_path / "d.json", data)], out)
    svg = (out / "figures" / "roofline.svg").read_text()
    assert "measured float32 roof" in svg
    assert "datasheet float32 roof" in svg
    assert "stroke-dasharray" in svg


# -- the output folder --------------------------------------------------------------------


def small_render(paths, title):
    """What _render returns, without matplotlib: the folder logic is what is under test."""
    return {"index.html": f"<p>{title}</p>".encode(), "figures/a.png": b"png", "summary.md": b""}


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(report, "_render", small_render)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_bad_input_leaves_nothing_at_out(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "attn-harness/results", "schema_version": 1')
    out = tmp_path / "report"
    with pytest.raises(ReportError, match=str(bad)):
        build_report([bad], out)
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_existing_report_is_replaced_once_the_new_one_is_complete(tmp_path, quick):
    out = tmp_path / "report"
    build_report([BENCH], out, title="first")
    (out / "screenshot.png").write_bytes(b"left by browser_check")
    build_report([BENCH], out, title="second")
    assert (out / "index.html").read_text() == "<p>second</p>"
    assert not (out / "screenshot.png").exists()  # the old folder went as a whole
    assert leftovers(tmp_path) == []


def test_failed_write_keeps_the_previous_report(tmp_path, quick, monkeypatch):
    out = tmp_path / "report"
    build_report([BENCH], out, title="first")

    def disk_full(folder: Path, files: dict) -> None:
        (folder / "index.html").write_text("partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "_write_folder", disk_full)
    with pytest.raises(ReportError, match="No space left on device"):
        build_report([BENCH], out, title="second")
    assert (out / "index.html").read_text() == "<p>first</p>"
    assert leftovers(tmp_path) == []


def test_failed_rename_puts_the_previous_report_back(tmp_path, quick, monkeypatch):
    out = tmp_path / "report"
    build_report([BENCH], out, title="first")
    real_rename = report.os.rename

    def refuse_new(src, dst):
        if str(src).endswith(".tmp"):
            raise OSError(13, "Permission denied")
        real_rename(src, dst)

    monkeypatch.setattr(report.os, "rename", refuse_new)
    with pytest.raises(ReportError, match="Permission denied"):
        build_report([BENCH], out, title="second")
    monkeypatch.undo()
    assert (out / "index.html").read_text() == "<p>first</p>"
    assert leftovers(tmp_path) == []


def test_folder_holding_other_files_is_not_replaced(tmp_path, quick):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ReportError, match="holds more than a report"):
        build_report([BENCH], out)
    assert (out / "notes.txt").read_text() == "keep me"


# -- the command line ---------------------------------------------------------------------


def run_cli(argv: list[str]) -> int:
    """Through a parser built as harness.cli.main builds it: add_report_command on subparsers."""
    parser = argparse.ArgumentParser(prog="attn-harness")
    add_report_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_cli_success_prints_where(tmp_path, quick, capsys):
    out = tmp_path / "new" / "r"  # a folder not there yet is made, as for every output
    assert run_cli(["report", str(BENCH), "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"report written to {out}/index.html\n"


@pytest.mark.parametrize(
    ("make_out", "message"),
    [
        (lambda tmp: tmp / "a-file" / "report", "a-file is not a directory"),
        (lambda tmp: tmp / "a-file", "exists and is not a folder"),
    ],
    ids=["parent-is-a-file", "out-is-a-file"],
)
def test_cli_unwritable_out_exits_2(tmp_path, quick, capsys, make_out, message):
    (tmp_path / "a-file").write_text("x")
    code = run_cli(["report", str(BENCH), "--out", str(make_out(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("attn-harness report: error: --out ")
    assert re.search(message, err)
    assert (tmp_path / "a-file").read_text() == "x"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes anywhere")
def test_cli_read_only_parent_exits_2(tmp_path, quick, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        assert run_cli(["report", str(BENCH), "--out", str(parent / "r")]) == 2
    finally:
        parent.chmod(0o755)
    assert "cannot write" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_cli_folder_nobody_can_write_in_exits_2(quick, capsys):
    """/proc refuses new folders even to root: an unwritable place wherever tests run."""
    assert run_cli(["report", str(BENCH), "--out", "/proc/attn-harness-report"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attn-harness report: error: --out /proc/attn-harness-report: cannot ")
    assert not Path("/proc/attn-harness-report").exists()


def test_cli_bad_input_exits_2_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "junk.xml"
    bad.write_text("<html/>")
    out = tmp_path / "r"
    assert run_cli(["report", str(bad), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    expected = "not JUnit XML (root element <html>, expected <testsuites> or <testsuite>)"
    assert captured.err == f"attn-harness report: error: {bad}: {expected}\n"
    assert not out.exists()


def test_cli_requires_out():
    with pytest.raises(SystemExit) as exit_info:
        run_cli(["report", str(BENCH)])
    assert exit_info.value.code == 2


def test_parser_loads_neither_torch_nor_matplotlib():
    code = (
        "import sys; import harness.cli.report as c; c.build_parser(); "
        "print(sorted(m for m in ('torch', 'matplotlib', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=DATA.parents[2],
    )
    assert result.stdout.strip() == "[]"
