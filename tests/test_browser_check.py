"""The browser check of a generated report: hand-made pages, one fault each, in real Chromium."""

from __future__ import annotations

import base64
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.report.browser_check import (
    CheckResult,
    ChromiumSession,
    check_report,
    chromium_session,
    figure_count_problems,
    find_chromium,
    main,
    summary,
)

pytestmark = pytest.mark.integration  # real processes: `nox -s integration`

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _has_playwright() -> bool:
    """Playwright is an optional extra (`.[browser]`)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


needs_playwright = pytest.mark.skipif(
    not _has_playwright(), reason='needs playwright (pip install ".[browser]")'
)

needs_browser = pytest.mark.skipif(
    find_chromium() is None or not _has_playwright(),
    reason="needs a Chromium (apt-get install chromium, or nox -s browser) and "
    'playwright (pip install -c constraints.txt ".[browser]")',
)


def tiny_png(width: int = 4, height: int = 3) -> bytes:
    """A valid RGB PNG made by hand, so the pages need no plotting library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    rows = b"".join(b"\x00" + b"\x20\x60\xc0" * width for _ in range(height))
    chunks = [chunk(b"IHDR", header), chunk(b"IDAT", zlib.compress(rows)), chunk(b"IEND", b"")]
    return PNG_MAGIC + b"".join(chunks)


PNG_URI = "data:image/png;base64," + base64.b64encode(tiny_png()).decode("ascii")


def figure(name: str, src: str = PNG_URI, extra: str = "") -> str:
    """An <img> as the report generator writes a figure."""
    return f'<img data-figure="{name}" alt="{name}" src="{src}" {extra}>'


def write_page(folder: Path, body: str, *, declared: str | None = "2", head: str = "") -> Path:
    """A report folder with index.html; `declared` is the figures meta (None: no meta)."""
    meta = "" if declared is None else f'<meta name="attn-harness-figures" content="{declared}">'
    folder.mkdir(parents=True, exist_ok=True)
    index = folder / "index.html"
    index.write_text(
        f'<!doctype html><html><head><meta charset="utf-8">{meta}{head}'
        f"<title>report</title></head><body><h1>report</h1>{body}</body></html>",
        encoding="utf-8",
    )
    return index


GOOD_BODY = figure("latency") + figure("throughput")


@pytest.fixture(scope="module")
def session() -> Iterator[ChromiumSession]:
    """One Chromium for the module; each check still gets its own browser context."""
    with chromium_session() as launched:
        yield launched


def run_check(session: ChromiumSession, index: Path) -> CheckResult:
    """Check a page with the shared browser and a short time limit."""
    return check_report(index, timeout_s=20, session=session)


def problem_with(result: CheckResult, needle: str) -> str:
    """The problem line naming `needle` (there must be one)."""
    found = [problem for problem in result.problems if needle in problem]
    assert found, f"no problem mentions {needle!r}: {result.problems}"
    return found[0]


# ---------------------------------------------------------------- no browser needed


def test_png_fixture_is_a_png() -> None:
    assert tiny_png().startswith(PNG_MAGIC)


@pytest.mark.parametrize(
    ("declared", "shown", "needle"),
    [
        (None, 2, "no <meta"),
        ("0", 0, "declares 0 figures"),
        ("two", 2, "not a whole number"),
        ("3", 2, "2 figures shown"),
    ],
)
def test_figure_count_problems(declared: str | None, shown: int, needle: str) -> None:
    (problem,) = figure_count_problems(declared, shown)
    assert needle in problem


def test_figure_count_matches() -> None:
    assert figure_count_problems(" 2 ", 2) == []


def test_summary_lists_every_problem_on_its_own_line(tmp_path: Path) -> None:
    result = CheckResult(["console error: a", "page error: b"], 1, "150.0", tmp_path / "s.png")
    lines = summary(result).splitlines()
    assert lines[0].startswith("browser check: FAILED: 2 problems (chromium 150.0)")
    assert lines[1:] == ["  console error: a", "  page error: b"]


def test_missing_index_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "no report page at" in capsys.readouterr().err


@needs_playwright  # without it the check stops first, at the missing playwright
def test_no_chromium_exits_2_with_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_page(tmp_path, GOOD_BODY)
    monkeypatch.setenv("ATTN_HARNESS_CHROMIUM", str(tmp_path / "no-such-chromium"))
    monkeypatch.setenv("PATH", "")
    assert find_chromium() is None
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no Chromium found" in err
    assert "apt-get install chromium" in err
    assert "nox -s browser" in err


def test_chromium_env_wins_over_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "my-chrome"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("ATTN_HARNESS_CHROMIUM", str(fake))
    assert find_chromium() == str(fake)


def test_no_playwright_exits_2_with_pip_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_page(tmp_path, GOOD_BODY)
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)  # import now fails
    assert main([str(tmp_path)]) == 2
    assert 'pip install -c constraints.txt ".[browser]"' in capsys.readouterr().err


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The check in its own process: playwright's sync API does not nest in the session's."""
    return subprocess.run(
        [sys.executable, "-m", "harness.report.browser_check", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@needs_playwright
def test_browser_that_will_not_start_exits_2(tmp_path: Path) -> None:
    write_page(tmp_path, GOOD_BODY)
    done = run_cli(str(tmp_path), ATTN_HARNESS_CHROMIUM="true")  # exits at once, no protocol
    assert done.returncode == 2, done.stdout + done.stderr
    assert "browser check: cannot run: could not start" in done.stderr


# ---------------------------------------------------------------- real Chromium


@needs_browser
def test_good_page_passes_from_the_command_line(tmp_path: Path) -> None:
    """End to end, in its own process (playwright's sync API does not nest)."""
    index = write_page(tmp_path / "report", GOOD_BODY)
    done = run_cli(str(index.parent))
    assert done.returncode == 0, done.stdout + done.stderr
    screenshot = index.parent / "screenshot.png"
    assert done.stdout.startswith("browser check: OK: 2 figures, no console errors (chromium ")
    assert done.stdout.rstrip().endswith(f"screenshot {screenshot}")
    assert screenshot.read_bytes().startswith(PNG_MAGIC)


@needs_browser
def test_good_page_passes(session: ChromiumSession, tmp_path: Path) -> None:
    """Includes a lazy figure far below the fold: a reader scrolls to it, so it counts."""
    body = (
        GOOD_BODY + '<div style="height: 3000px"></div>' + figure("memory", extra='loading="lazy"')
    )
    index = write_page(tmp_path, body, declared="3")
    shot = tmp_path / "shots" / "page.png"
    result = check_report(index, shot, timeout_s=20, session=session)
    assert result.problems == []
    assert result.figures == 3
    assert result.browser_version[0].isdigit()
    assert result.screenshot == shot.resolve()
    assert shot.read_bytes().startswith(PNG_MAGIC)


@needs_browser
def test_console_error_fails(session: ChromiumSession, tmp_path: Path) -> None:
    index = write_page(tmp_path, GOOD_BODY + '<script>console.error("figure data lost")</script>')
    result = run_check(session, index)
    assert "console error: figure data lost (at index.html:1)" in result.problems
    assert (tmp_path / "screenshot.png").read_bytes().startswith(PNG_MAGIC)  # saved on failure


@needs_browser
def test_uncaught_exception_fails(session: ChromiumSession, tmp_path: Path) -> None:
    index = write_page(tmp_path, GOOD_BODY + '<script>throw new Error("plot crashed")</script>')
    result = run_check(session, index)
    assert "page error (uncaught exception): plot crashed" in result.problems


@needs_browser
def test_broken_image_fails(session: ChromiumSession, tmp_path: Path) -> None:
    index = write_page(tmp_path, figure("latency") + figure("throughput", src="missing.png"))
    result = run_check(session, index)
    problem = problem_with(result, "broken image")
    assert "figure throughput" in problem
    assert "missing.png" in problem


@needs_browser
def test_undecodable_image_fails(session: ChromiumSession, tmp_path: Path) -> None:
    """A data URI cut inside the PNG header decodes to nothing (a cut after it still shows)."""
    cut = PNG_URI[: len("data:image/png;base64,") + 20]
    index = write_page(tmp_path, figure("latency") + figure("throughput", src=cut))
    result = run_check(session, index)
    assert "figure throughput" in problem_with(result, "broken image")


@needs_browser
def test_figure_count_mismatch_fails(session: ChromiumSession, tmp_path: Path) -> None:
    index = write_page(tmp_path, GOOD_BODY, declared="3")
    result = run_check(session, index)
    assert result.figures == 2
    assert result.problems == [
        '2 figures shown (img[data-figure]) but <meta name="attn-harness-figures"> declares 3'
    ]


@needs_browser
def test_missing_meta_fails(session: ChromiumSession, tmp_path: Path) -> None:
    index = write_page(tmp_path, GOOD_BODY, declared=None)
    result = run_check(session, index)
    problem_with(result, 'no <meta name="attn-harness-figures">')


@needs_browser
def test_zero_figures_declared_fails(session: ChromiumSession, tmp_path: Path) -> None:
    index = write_page(tmp_path, "<p>nothing measured</p>", declared="0")
    result = run_check(session, index)
    problem_with(result, "declares 0 figures")


@needs_browser
def test_network_request_fails(session: ChromiumSession, tmp_path: Path) -> None:
    head = '<link rel="stylesheet" href="http://example.invalid/x.css">'
    index = write_page(tmp_path, GOOD_BODY, head=head)
    result = run_check(session, index)
    problem = problem_with(result, "network request")
    assert "GET http://example.invalid/x.css" in problem


@needs_browser
def test_checks_are_independent(session: ChromiumSession, tmp_path: Path) -> None:
    """A fault of one page must not leak into the next check with the same browser."""
    bad = write_page(tmp_path / "bad", GOOD_BODY + "<script>console.error('x')</script>")
    good = write_page(tmp_path / "good", GOOD_BODY)
    assert not run_check(session, bad).ok
    assert run_check(session, good).ok


SPIN = "while (true) {}"


@needs_browser
def test_page_that_never_loads_fails_within_the_time_limit(
    session: ChromiumSession, tmp_path: Path
) -> None:
    index = write_page(tmp_path, f"<script>{SPIN}</script>" + GOOD_BODY)
    result = check_report(index, timeout_s=1, session=session)
    problem_with(result, "page did not load within 1 s")


@needs_browser
def test_page_hanging_after_load_fails_within_the_time_limit(
    session: ChromiumSession, tmp_path: Path
) -> None:
    script = f'<script>addEventListener("load", () => setTimeout(() => {{ {SPIN} }}, 0))</script>'
    index = write_page(tmp_path, GOOD_BODY + script)
    result = check_report(index, timeout_s=1, session=session)
    problem_with(result, "page stopped responding after load")


# ---------------------------------------------------------------- a generated report, looked at

_LAYOUT_JS = """() => {
    const top = (id) => document.getElementById(id).getBoundingClientRect().top;
    const wrapped = Array.from(document.querySelectorAll('td.num')).filter((td) => {
        const line = parseFloat(getComputedStyle(td).lineHeight) || 16;
        return td.getBoundingClientRect().height > 2.2 * line;  // one line plus padding
    }).map((td) => td.textContent);
    const scales = Array.from(document.querySelectorAll('img[data-figure]')).map(
        (img) => [img.dataset.figure, img.getBoundingClientRect().width / img.naturalWidth]);
    return {
        order: ['verdict', 'figures', 'run-1', 'conformance', 'inputs'].map(top),
        firstFigure: document.querySelector('img[data-figure]').getBoundingClientRect().top,
        wrapped,
        scales,
        pageWidth: document.documentElement.scrollWidth,
    };
}"""


@needs_browser
def test_generated_report_reads_at_1280_px(session: ChromiumSession, tmp_path: Path) -> None:
    """The verdict above the figures above the inputs, no interval cell wrapping, and every
    figure shown at nearly its drawn size (its text as legible as drawn), at 1280 px."""
    from harness.report import build_report
    from harness.report.browser_check import VIEWPORT

    out = tmp_path / "report"
    build_report([REPO / "tests" / "data" / "report"], out)
    result = run_check(session, out / "index.html")
    assert result.problems == []
    context = session.browser.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        page.goto((out / "index.html").resolve().as_uri(), wait_until="load")
        layout = page.evaluate(_LAYOUT_JS)
    finally:
        context.close()
    assert layout["order"] == sorted(layout["order"])
    assert layout["order"][0] < layout["firstFigure"]
    assert layout["wrapped"] == []
    assert layout["pageWidth"] <= VIEWPORT["width"]  # no sideways scrolling
    assert len(layout["scales"]) == 6
    for name, scale in layout["scales"]:
        assert scale >= 0.8, f"{name} shown at {scale:.0%} of its size"
