"""matplotlib (``report``) and rich (``live``) are optional: without them, what needs
them says how to install them, and what does not need them works."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pytest

from harness.cli.bench import Progress
from harness.cli.main import EXIT_USAGE, main
from harness.conformance.progress import LiveLine, PlainProgress, progress_display

RESULTS = Path(__file__).resolve().parents[1] / "reports" / "compiled-cpu-2026-12-04" / "bench.json"


def _without(monkeypatch: pytest.MonkeyPatch, *missing: str) -> None:
    """``importlib.util.find_spec`` as on a machine where ``missing`` is not installed."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object, **kwargs: object) -> object:
        if name.split(".")[0] in missing:
            return None
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_report_without_matplotlib_is_a_usage_error_naming_the_extra(monkeypatch, tmp_path, capsys):
    _without(monkeypatch, "matplotlib")
    out = tmp_path / "report"
    code = main(["report", str(RESULTS), "--out", str(out)])
    assert code == EXIT_USAGE
    assert "pip install 'attn-harness[report]'" in capsys.readouterr().err
    assert not out.exists()


def test_the_main_job_without_matplotlib_stops_before_it_starts(monkeypatch, tmp_path, capsys):
    _without(monkeypatch, "matplotlib")
    out = tmp_path / "run"
    code = main(["run", "--backend", "sdpa", "--out", str(out)])
    assert code == EXIT_USAGE
    assert "attn-harness[report]" in capsys.readouterr().err
    assert not out.exists()  # nothing made, no worker started


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_without_rich_a_terminal_gets_plain_lines(monkeypatch):
    live = progress_display("sdpa", quiet=False)
    live.stop()
    assert isinstance(live, LiveLine)
    _without(monkeypatch, "rich")
    plain = progress_display("sdpa", quiet=False)
    plain.stop()
    assert isinstance(plain, PlainProgress)
    terminal = _Terminal()
    bar = Progress(enabled=True, stream=terminal)
    bar(1, 3, "decode")
    bar.close()
    assert terminal.getvalue() == "[1/3] decode\n"
    assert "rich.progress" not in sys.modules or bar._bar is None
