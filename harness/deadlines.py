"""Wall-clock deadlines for one benchmark case or one conformance example.

A backend that hangs on a production shape must fail with that shape named,
never hang CI. SIGALRM interrupts Python-level work in the main thread; a
call stuck in one native kernel is interrupted when it returns.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class CaseTimeout(BaseException):
    """A case overran its deadline (a ``BaseException``, so ``except Exception`` keeps out)."""


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Raise ``CaseTimeout`` in the block after ``seconds`` (main thread with SIGALRM only).

    A Python-level hang is interrupted; a call stuck inside one native
    kernel is interrupted when it returns.
    """
    usable = (
        seconds is not None
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return
    assert seconds is not None

    def expire(signum: int, frame: object) -> None:
        raise CaseTimeout(f"exceeded the case deadline of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    # Re-fire until the block exits: an alarm landing in code that swallows exceptions
    # (a gc callback, a __del__) would otherwise lose the deadline.
    signal.setitimer(signal.ITIMER_REAL, seconds, min(0.1, seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
