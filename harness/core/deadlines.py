"""Wall-clock deadlines for one benchmark case or one conformance example.

A backend that hangs on a production shape must fail with that shape named,
never hang CI. SIGALRM interrupts Python-level work in the main thread; a
call stuck in one native kernel is interrupted when it returns.

A signal handler runs wherever the main thread is between two bytecodes,
and some of those places cannot propagate an exception: a ``gc`` callback
(run by a collection that any allocation can start), a ``__del__``, a
``weakref.finalize`` callback. An exception raised there is not seen by the
code under the deadline; Python reports it as "unraisable" (pytest turns
that into a ``PytestUnraisableExceptionWarning``) and carries on. So the
handler looks at the interrupted stack first: inside such a callback it
does not raise, but re-arms the timer to fire again a moment later, after
the callback has returned, and raises there. The same holds inside a
``shielded()`` section (a CUDA graph capture), which must finish whole.
"""

from __future__ import annotations

import contextlib
import gc
import signal
import threading
import weakref
from collections.abc import Callable, Iterator
from types import CodeType, FrameType

# Re-fire period once the deadline has passed, until the block exits: an alarm
# landing in code that swallows exceptions (``except BaseException: pass``)
# would otherwise lose the deadline.
REFIRE_S = 0.1
# How soon to try again after an alarm landed where it must not raise.
RETRY_S = 0.005


class CaseTimeout(BaseException):
    """A case overran its deadline (a ``BaseException``, so ``except Exception`` keeps out)."""


def _code_of(fn: object) -> CodeType | None:
    """The code object a callable runs (functions, bound methods, callable objects)."""
    method = next((vars(k)["__call__"] for k in type(fn).__mro__ if "__call__" in vars(k)), None)
    for candidate in (fn, getattr(fn, "__func__", None), method):
        code = getattr(candidate, "__code__", None)
        if isinstance(code, CodeType):
            return code
    return None


_FINALIZE_CODE = _code_of(weakref.finalize.__call__)


def in_unraisable_context(frame: FrameType | None) -> bool:
    """Whether ``frame`` or a caller is a gc callback, a ``__del__`` or a finalizer.

    An exception raised in any of them never reaches the code that called
    into them: the interpreter prints it as unraisable and continues.
    """
    callbacks: set[CodeType] = set()
    for callback in list(gc.callbacks):
        code = _code_of(callback)
        if code is not None:
            callbacks.add(code)
    while frame is not None:
        code = frame.f_code
        if code in callbacks or code is _FINALIZE_CODE or code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


_shield_depth = 0


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """A section a deadline must not interrupt: it fires just after the section instead.

    For work that must not be left half done, above all a CUDA graph capture:
    an exception raised inside ``torch.cuda.graph`` (or in its exit) leaves the
    stream in capture mode and the device unusable for every later case. The
    section still counts against the deadline, and the step's own time limit
    still bounds it.
    """
    global _shield_depth
    _shield_depth += 1
    try:
        yield
    finally:
        _shield_depth -= 1


def _expire_handler(
    seconds: float, active: Callable[[], bool]
) -> Callable[[int, FrameType | None], None]:
    def expire(signum: int, frame: FrameType | None) -> None:
        if not active():  # a late alarm after the block ended: nothing to interrupt
            return
        if _shield_depth or in_unraisable_context(frame):
            # raising here would be lost (and reported as unraisable): try again just
            # after the callback returns, at a point where the exception propagates
            signal.setitimer(signal.ITIMER_REAL, RETRY_S, REFIRE_S)
            return
        raise CaseTimeout(f"exceeded the case deadline of {seconds:g} s")

    return expire


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Raise ``CaseTimeout`` in the block after ``seconds`` (main thread with SIGALRM only).

    A Python-level hang is interrupted; a call stuck inside one native
    kernel is interrupted when it returns. The exception is never raised
    inside a gc callback, ``__del__`` or finalizer, where it would be lost,
    but at the next point that propagates it (a few milliseconds later).
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
    state = {"active": True}
    previous = signal.signal(signal.SIGALRM, _expire_handler(seconds, lambda: state["active"]))
    signal.setitimer(signal.ITIMER_REAL, seconds, min(REFIRE_S, seconds))
    try:
        yield
    finally:
        state["active"] = False  # an alarm already pending must not raise in here
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
