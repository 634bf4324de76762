"""One shared daemon thread that runs short callbacks at deadlines.

Scope timeouts, escalation graces and process kill graces all need "call this
later"; a ``threading.Timer`` each would cost a thread per scope. Callbacks run
on the timer thread and must be quick and must not raise (an exception is
logged and the thread carries on).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["TimerHandle", "call_later"]

_log = logging.getLogger("wirecut.scope")


class TimerHandle:
    """A scheduled callback; ``cancel()`` is idempotent and safe from any thread."""

    __slots__ = ("_callback", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self._callback: Callable[[], None] | None = callback

    def cancel(self) -> None:
        # Dropping the callback is enough: the timer thread skips it.
        self._callback = None


class _TimerThread:
    def __init__(self) -> None:
        # Guards the heap and the thread's start; the condition wakes the
        # thread when an earlier deadline arrives.
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle(time.monotonic() + max(0.0, delay), callback)
        with self._cond:
            heapq.heappush(self._heap, (handle.when, next(self._seq), handle))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="wirecut-timers", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return handle

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                _, _, handle = heapq.heappop(self._heap)
            callback, handle._callback = handle._callback, None
            if callback is not None:
                try:
                    callback()
                except Exception:
                    # One broken callback must not stop every later deadline.
                    _log.exception("wirecut timer callback failed")


_timers = _TimerThread()


def call_later(delay: float, callback: Callable[[], None]) -> TimerHandle:
    """Run ``callback()`` on the shared timer thread after ``delay`` seconds."""
    return _timers.call_later(delay, callback)
