"""Child processes stop as a whole tree, and their progress is read from the structured
lines they write (``harness.processes``)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from harness.processes.progress_file import PROGRESS_ENV, Progress, read_progress
from harness.processes.supervisor import Child, run

PYTHON = sys.executable


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes: it runs nothing
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def _with_grandchild(tmp_path: Path, handle_sigint: str = "") -> list[str]:
    """A child that starts a sleeping grandchild, writes its pid, then sleeps."""
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time, signal\n"
        f"{handle_sigint}\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(g.pid))\n"
        "time.sleep(60)\n"
    )
    return [PYTHON, "-c", code]


def _grandchild(tmp_path: Path) -> int:
    pid_file = tmp_path / "grandchild.pid"
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline, "the child never started its grandchild"
        time.sleep(0.05)
    return int(pid_file.read_text())


def test_stopping_a_child_stops_what_it_started(tmp_path):
    child = Child(_with_grandchild(tmp_path))
    grandchild = _grandchild(tmp_path)
    assert child.stop() == -signal.SIGKILL
    assert not child.group_alive()
    assert not _alive(grandchild)


def test_a_run_past_its_limit_is_interrupted_then_killed_with_its_tree(tmp_path):
    ignores = "signal.signal(signal.SIGINT, signal.SIG_IGN)"
    started = time.monotonic()
    done = run(_with_grandchild(tmp_path, ignores), timeout_s=2.0, grace_s=0.5)
    assert done.timed_out
    assert done.code == -signal.SIGKILL  # it ignored SIGINT, so SIGKILL ended it
    assert time.monotonic() - started < 20
    assert not _alive(_grandchild(tmp_path))


def test_an_interrupted_child_can_say_goodbye(tmp_path):
    code = (
        "import time\n"
        "try:\n    time.sleep(60)\n"
        "except KeyboardInterrupt:\n    raise SystemExit(7)\n"
    )
    done = run([PYTHON, "-c", code], timeout_s=1.0, interruptible=True)
    assert (done.code, done.timed_out) == (7, True)


def test_a_child_that_ends_on_its_own_keeps_its_status():
    done = run([PYTHON, "-c", "raise SystemExit(3)"], timeout_s=30)
    assert (done.code, done.timed_out) == (3, False)


def test_leaving_the_block_stops_the_child(tmp_path):
    with Child(_with_grandchild(tmp_path)) as child:
        grandchild = _grandchild(tmp_path)
    assert child.poll() is not None
    assert not _alive(grandchild)


def test_progress_is_the_last_whole_line_the_child_wrote(tmp_path):
    path = tmp_path / "progress.jsonl"
    code = (
        "from harness.processes.progress_file import report_progress\n"
        "report_progress(1, 4, label='a')\n"
        "report_progress(2, 4, left_s=30.0, label='b')\n"
    )
    child = Child([PYTHON, "-c", code], progress=path)
    assert child.wait(60) == 0
    assert child.progress() == Progress(2, 4, 30.0, "b")
    with path.open("a") as handle:
        handle.write('{"done": 3, "tot')  # a line still being written is not read
    assert read_progress(path) == Progress(2, 4, 30.0, "b")
    assert read_progress(tmp_path / "none.jsonl") is None


def test_a_child_not_asked_for_progress_writes_none(tmp_path, monkeypatch):
    """Without a file of its own, a child never writes into its parent's."""
    parents = tmp_path / "parents.jsonl"
    monkeypatch.setenv(PROGRESS_ENV, str(parents))
    code = "from harness.processes.progress_file import report_progress; report_progress(1, 2)"
    child = Child([PYTHON, "-c", code])
    assert child.wait(60) == 0
    assert child.progress() is None
    assert not parents.exists()
