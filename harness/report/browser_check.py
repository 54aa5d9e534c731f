"""Open a generated report in a real headless Chromium and fail on what a reader would see broken.

A report is only useful if it renders: a figure whose base64 is truncated, a script that
throws, or a stylesheet fetched from a CDN (which an air-gapped machine cannot reach) all
pass a check on the HTML text but show a broken page. This drives the system's Chromium
through playwright (nothing is downloaded) and lists every such problem, one per line.

    python -m harness.report.browser_check REPORT_DIR_OR_INDEX_HTML
        [--screenshot FILE] [--timeout S]

Exit status: 0 the page is clean, 1 problems found, 2 the check could not run (no page,
no Chromium, no playwright).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from harness.core.arg_types import positive_float

if TYPE_CHECKING:
    from playwright.sync_api import (
        Browser,
        ConsoleMessage,
        Page,
        Request,
        Route,
        ViewportSize,
        WebSocket,
    )
    from playwright.sync_api import Error as PlaywrightError

CHROMIUM_ENV = "ATTN_HARNESS_CHROMIUM"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
# What works on a closed-network machine, as root: no sandbox (root), no GPU, and none of
# Chromium's own background traffic (updates, sync, QUIC probes). Playwright adds --headless.
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
FIGURES_META = "attn-harness-figures"
# Schemes that cannot reach the network: a self-contained page may use only these.
LOCAL_SCHEMES = frozenset({"file", "data", "blob", "about"})
VIEWPORT: ViewportSize = {"width": 1280, "height": 900}
MAX_DETAIL = 160  # characters of a URL or message kept in a problem line (data URIs are long)

INSTALL_CHROMIUM_HINT = (
    "install it with `apt-get install chromium` (or run `nox -s browser`, which installs it), "
    f"or point ${CHROMIUM_ENV} at a Chromium or Chrome binary"
)
INSTALL_PLAYWRIGHT_HINT = (
    'the playwright package is not installed: pip install -c constraints.txt ".[browser]" '
    "(it drives the system's Chromium; no browser is downloaded)"
)


class CheckUnusable(Exception):
    """The check cannot run at all: exit 2, which is not a verdict on the report."""


@dataclass
class CheckResult:
    """What the browser saw: an empty `problems` means the report renders cleanly."""

    problems: list[str]
    figures: int
    browser_version: str
    screenshot: Path

    @property
    def ok(self) -> bool:
        """A report passes only with no problem at all."""
        return not self.problems


@dataclass(frozen=True)
class ChromiumSession:
    """A launched Chromium, so several checks (the tests) pay for one start only."""

    browser: Browser
    version: str


def find_chromium() -> str | None:
    """The Chromium to drive: $ATTN_HARNESS_CHROMIUM when set (authoritative), else PATH."""
    chosen = os.environ.get(CHROMIUM_ENV)
    if chosen:
        return shutil.which(chosen)
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _no_chromium_message() -> str:
    """Say what was looked for, so the fix is obvious."""
    chosen = os.environ.get(CHROMIUM_ENV)
    if chosen:
        looked = f"${CHROMIUM_ENV}={chosen} is not an executable"
    else:
        looked = f"${CHROMIUM_ENV} is unset and none of {', '.join(CHROMIUM_NAMES)} is on PATH"
    return f"no Chromium found ({looked}): {INSTALL_CHROMIUM_HINT}"


def _sync_playwright() -> Callable[[], Any]:
    """Import playwright only when a check runs: it is an optional extra."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        raise CheckUnusable(INSTALL_PLAYWRIGHT_HINT) from exc
    return sync_playwright


@contextmanager
def chromium_session(launch_timeout_s: float = 60.0) -> Iterator[ChromiumSession]:
    """Launch the system Chromium headless; playwright gives it a fresh temporary profile.

    `launch` (not a persistent context) lets every check get its own browser context, so
    checks sharing a session stay independent; playwright creates the user-data-dir
    itself and removes it on close.
    """
    sync_playwright = _sync_playwright()
    executable = find_chromium()
    if executable is None:
        raise CheckUnusable(_no_chromium_message())
    from playwright.sync_api import Error as PlaywrightError

    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(
                executable_path=executable,
                headless=True,
                args=list(CHROMIUM_ARGS),
                timeout=launch_timeout_s * 1000,
            )
        except PlaywrightError as exc:
            raise CheckUnusable(f"could not start {executable}: {exc.message}") from exc
        try:
            yield ChromiumSession(browser=browser, version=browser.version)
        finally:
            browser.close()


def resolve_index(report: Path) -> Path:
    """Accept the report folder or its index.html; a missing page makes the check unusable."""
    index = report / "index.html" if report.is_dir() else report
    if not index.is_file():
        raise CheckUnusable(f"no report page at {index}")
    return index.resolve()


def check_report(
    index_html: Path,
    screenshot: Path | None = None,
    *,
    timeout_s: float = 60.0,
    session: ChromiumSession | None = None,
) -> CheckResult:
    """Open the report in Chromium and list every problem; saves a full-page screenshot.

    Raises CheckUnusable when the page, Chromium or playwright is missing. Pass `session`
    to reuse a launched browser (each check still gets a fresh browser context).
    """
    index = resolve_index(index_html)
    shot = (index.parent / "screenshot.png" if screenshot is None else screenshot).resolve()
    if session is not None:
        return _check_guarded(session, index, shot, timeout_s)
    with chromium_session() as own:
        return _check_guarded(own, index, shot, timeout_s)


def _check_guarded(
    session: ChromiumSession, index: Path, shot: Path, timeout_s: float
) -> CheckResult:
    """A browser that dies mid-check gives no verdict on the report: make it unusable."""
    from playwright.sync_api import Error as PlaywrightError

    try:
        return _check_in(session, index, shot, timeout_s)
    except PlaywrightError as exc:
        raise CheckUnusable(f"the browser failed during the check: {_short(exc.message)}") from exc


def _check_in(session: ChromiumSession, index: Path, shot: Path, timeout_s: float) -> CheckResult:
    """One check in a fresh context: no cache, storage or cookies from an earlier check."""
    context = session.browser.new_context(viewport=VIEWPORT, service_workers="block")
    try:
        context.route(_is_remote, _block)
        page = context.new_page()
        events = _PageEvents()
        events.attach(page)
        figures, problems = _inspect(page, index, timeout_s)
        problems += _save_screenshot(page, shot, timeout_s)
        page.wait_for_timeout(0)  # a round trip (to the driver, so it cannot hang): flush events
    finally:
        context.close()
    return CheckResult(events.problems + problems, figures, session.version, shot)


def _inspect(page: Page, index: Path, timeout_s: float) -> tuple[int, list[str]]:
    """Load the page, then check images and figures; returns (figures shown, problems)."""
    from playwright.sync_api import Error as PlaywrightError

    deadline = _Deadline(time.monotonic() + timeout_s)
    load_problem = _load(page, index, timeout_s)
    if load_problem:
        return 0, [load_problem]
    try:
        problems = _wait_for_images(page, deadline)
        problems += _broken_images(page, deadline)
        figures, figure_problems = _figure_problems(page, deadline)
    except PlaywrightError as exc:  # a script spinning after `load` hangs every evaluation
        return 0, [f"page stopped responding after load: {_short(exc.message)}"]
    return figures, problems + figure_problems


@dataclass(frozen=True)
class _Deadline:
    """The one time limit shared by the load and the checks after it."""

    at: float

    def ms(self) -> int:
        """Milliseconds left, at least one second so a late step still gets a fair try."""
        return round(max(self.at - time.monotonic(), 1.0) * 1000)


def _evaluate(page: Page, script: str, deadline: _Deadline) -> Any:
    """Run a script in the page with a time limit (plain `page.evaluate` has none)."""
    return page.locator(":root").evaluate(script, timeout=deadline.ms())


def _load(page: Page, index: Path, timeout_s: float) -> str | None:
    """Navigate and wait for `load`; a timeout is a problem of the report, not of the check."""
    from playwright.sync_api import Error as PlaywrightError

    try:
        page.goto(index.as_uri(), wait_until="load", timeout=timeout_s * 1000)
    except PlaywrightError as exc:
        return f"page did not load within {timeout_s:g} s: {_short(exc.message)}"
    return None


# Lazy images below the fold load only when scrolled to; a reader scrolls, so load them now.
_EAGER_IMAGES_JS = """() => {
    for (const img of document.images) if (img.loading === 'lazy') img.loading = 'eager';
}"""
_IMAGES_DONE_JS = "() => Array.from(document.images).every((img) => img.complete)"


def _wait_for_images(page: Page, deadline: _Deadline) -> list[str]:
    """Images added by scripts may still be decoding after `load`: wait for them."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    _evaluate(page, _EAGER_IMAGES_JS, deadline)
    try:
        page.wait_for_function(_IMAGES_DONE_JS, timeout=deadline.ms())
    except PlaywrightTimeout:
        return ["images still loading when the time limit ran out"]
    return []


_BROKEN_IMAGES_JS = """() => Array.from(document.images)
    .filter((img) => img.naturalWidth === 0)
    .map((img) => img.dataset.figure !== undefined
        ? `figure ${img.dataset.figure} (src ${img.getAttribute('src') ?? 'missing'})`
        : `src ${img.getAttribute('src') ?? 'missing'}`)"""


def _broken_images(page: Page, deadline: _Deadline) -> list[str]:
    """An image with naturalWidth 0 after loading did not decode: the reader sees a hole."""
    broken: list[str] = _evaluate(page, _BROKEN_IMAGES_JS, deadline)
    return [f"broken image (naturalWidth 0): {_short(what)}" for what in broken]


_FIGURES_JS = f"""() => ({{
    declared:
        document.querySelector('meta[name="{FIGURES_META}"]')?.getAttribute('content') ?? null,
    shown: document.querySelectorAll('img[data-figure]').length,
}})"""


def _figure_problems(page: Page, deadline: _Deadline) -> tuple[int, list[str]]:
    """The page states how many figures it must show; a dropped figure is a failure."""
    counts: dict[str, Any] = _evaluate(page, _FIGURES_JS, deadline)
    shown = int(counts["shown"])
    return shown, figure_count_problems(counts["declared"], shown)


def figure_count_problems(declared: str | None, shown: int) -> list[str]:
    """Compare the meta's figure count with the img[data-figure] elements on the page."""
    meta = f'<meta name="{FIGURES_META}">'
    if declared is None:
        return [f"no {meta}: the page must declare how many figures it shows ({shown} shown)"]
    try:
        expected = int(declared.strip())
    except ValueError:
        return [f"{meta} content {declared!r} is not a whole number"]
    if expected <= 0:
        return [f"{meta} declares {expected} figures: a report must show at least one"]
    if expected != shown:
        return [f"{shown} figures shown (img[data-figure]) but {meta} declares {expected}"]
    return []


def _save_screenshot(page: Page, shot: Path, timeout_s: float) -> list[str]:
    """Save the full page even when problems were found: it shows what went wrong."""
    from playwright.sync_api import Error as PlaywrightError

    try:
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=shot, full_page=True, timeout=timeout_s * 1000)
    except (PlaywrightError, OSError) as exc:
        return [f"screenshot {shot} not saved: {_short(str(exc))}"]
    return []


@dataclass
class _PageEvents:
    """Collects what the page reports while it loads, in the order it happened."""

    problems: list[str] = field(default_factory=list)

    def attach(self, page: Page) -> None:
        """Subscribe before navigating, so nothing during the load is missed."""
        page.on("console", self.on_console)
        page.on("pageerror", self.on_page_error)
        page.on("request", self.on_request)
        page.on("requestfailed", self.on_request_failed)
        page.on("websocket", self.on_websocket)

    def on_console(self, message: ConsoleMessage) -> None:
        """console.error, and Chromium's own errors (a failed resource load) land here."""
        if message.type == "error":
            self.problems.append(f"console error: {_short(message.text)}{_where(message)}")

    def on_page_error(self, error: PlaywrightError) -> None:
        """An uncaught exception: some script of the report did not finish."""
        self.problems.append(f"page error (uncaught exception): {_short(error.message)}")

    def on_request(self, request: Request) -> None:
        """The report must be self-contained: any network fetch is a failure (and blocked)."""
        if not _is_local(request.url):
            self.problems.append(
                f"network request (the report must be self-contained): "
                f"{request.method} {_short(request.url)}"
            )

    def on_request_failed(self, request: Request) -> None:
        """A local resource that did not load; remote ones are reported as requests already."""
        if _is_local(request.url):
            self.problems.append(f"request failed: {_short(request.url)} ({request.failure})")

    def on_websocket(self, socket: WebSocket) -> None:
        """A websocket is network traffic too, and `route` does not block it."""
        self.problems.append(f"network websocket (must be self-contained): {_short(socket.url)}")


def _is_local(url: str) -> bool:
    """True for URLs that cannot leave the machine (file:, data:, blob:, about:)."""
    return urlsplit(url).scheme.lower() in LOCAL_SCHEMES


def _is_remote(url: str) -> bool:
    """The route predicate: which requests to block before they reach the network."""
    return not _is_local(url)


def _block(route: Route) -> None:
    """Abort a remote request: the check must send nothing, even on a networked machine."""
    route.abort("blockedbyclient")


def _where(message: ConsoleMessage) -> str:
    """Where a console message came from (1-based line), if the browser says."""
    location = message.location
    url = location.get("url") or ""
    if not url:
        return ""
    line = int(location.get("lineNumber", 0)) + 1
    return f" (at {_short(Path(urlsplit(url).path).name or url)}:{line})"


def _one_line(text: str) -> str:
    """Problems are listed one per line: fold any newline in a message."""
    return " ".join(text.split())


def _short(text: str) -> str:
    """One line, cut to MAX_DETAIL characters: a data URI would fill the terminal."""
    flat = _one_line(text)
    return flat if len(flat) <= MAX_DETAIL else flat[: MAX_DETAIL - 3] + "..."


def summary(result: CheckResult) -> str:
    """The printed verdict: one OK line, or FAILED and every problem on its own line."""
    browser = f"(chromium {result.browser_version})"
    if result.ok:
        return (
            f"browser check: OK: {result.figures} figures, no console errors {browser}; "
            f"screenshot {result.screenshot}"
        )
    count = len(result.problems)
    head = (
        f"browser check: FAILED: {count} problem{'s' if count != 1 else ''} {browser}; "
        f"screenshot {result.screenshot}"
    )
    return "\n".join([head, *(f"  {problem}" for problem in result.problems)])


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line of `python -m harness.report.browser_check`."""
    parser = argparse.ArgumentParser(
        prog="python -m harness.report.browser_check",
        description="Open a generated report in headless Chromium and fail on what renders broken.",
    )
    parser.add_argument("report", type=Path, help="the report folder, or its index.html")
    parser.add_argument(
        "--screenshot",
        type=Path,
        default=None,
        help="where to save the full-page screenshot (default: screenshot.png by index.html)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=60.0,
        help="seconds allowed for the page to load (default 60)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 clean, 1 problems found, 2 the check could not run."""
    args = _parse_args(argv)
    try:
        result = check_report(args.report, args.screenshot, timeout_s=args.timeout)
    except CheckUnusable as exc:
        print(f"browser check: cannot run: {exc}", file=sys.stderr)
        return 2
    print(summary(result))
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
