"""Clocks that run short callbacks at deadlines: the shared timer thread, or a mock.

Scope timeouts and escalation graces need "call this later"; a
``threading.Timer`` each would cost a thread per scope, so the system clock
keeps one shared daemon thread. Callbacks run on that thread and must be
quick. One that raises (anything, ``BaseException`` included) is logged and
the thread carries on: a broken callback must never stop every later deadline
in the process.

A delay that is infinite or longer than ``threading.TIMEOUT_MAX`` (about 292
years) means "never": the handle is returned but nothing is scheduled, so no
wait can overflow.

``MockClock`` (after trio's) replaces the wall clock for tests: time moves only
when the test calls ``jump()``, and the callbacks that fall due run inside that
call, so a timeout test asserts order instead of racing the wall clock.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "MockClock", "SystemClock", "TimerHandle", "is_never"]

_log = logging.getLogger("wirecut.scope")


def is_never(delay: float) -> bool:
    """True for a delay that means "no deadline": infinite, or beyond any wait."""
    return math.isinf(delay) or delay >= threading.TIMEOUT_MAX


class TimerHandle:
    """A scheduled callback; ``cancel()`` is idempotent and safe from any thread."""

    __slots__ = ("_callback", "when")

    def __init__(self, when: float, callback: Callable[[], None] | None) -> None:
        self.when = when
        self._callback = callback

    def cancel(self) -> None:
        # Dropping the callback is enough: the clock skips it when it falls due.
        self._callback = None

    def _take(self) -> Callable[[], None] | None:
        callback, self._callback = self._callback, None
        return callback


class Clock(Protocol):
    """What a scope needs of a clock: the time, and "call this later"."""

    def now(self) -> float:
        """Seconds on this clock's monotonic scale."""
        ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback()`` once, ``delay`` seconds from now (never, for ``is_never``)."""
        ...


def _run_callback(handle: TimerHandle) -> None:
    callback = handle._take()
    if callback is None:
        return
    try:
        callback()
    except BaseException:
        # BaseException too: a KeyboardInterrupt raised by a cut inside a
        # timeout must not take the clock down with it.
        _log.exception("wirecut timer callback failed")


class _Queue:
    """A heap of handles ordered by deadline, then by scheduling order."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()

    def push(self, handle: TimerHandle) -> None:
        heapq.heappush(self._heap, (handle.when, next(self._seq), handle))

    def next_when(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> TimerHandle | None:
        if self._heap and self._heap[0][0] <= now:
            return heapq.heappop(self._heap)[2]
        return None


class SystemClock:
    """``time.monotonic`` and one shared daemon thread that runs the callbacks.

    Safe to call from any thread. The thread starts on first use (and again,
    should anything ever have ended it: timeouts must not stop for good).
    """

    def __init__(self) -> None:
        # Guards the queue and the thread's start; the condition wakes the
        # thread when an earlier deadline arrives.
        self._cond = threading.Condition(threading.Lock())
        self._queue = _Queue()
        self._thread: threading.Thread | None = None

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        if is_never(delay):
            return TimerHandle(math.inf, None)
        handle = TimerHandle(time.monotonic() + max(0.0, delay), callback)
        with self._cond:
            earliest = self._queue.next_when()
            self._queue.push(handle)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="wirecut-timers", daemon=True
                )
                self._thread.start()
            elif earliest is None or handle.when < earliest:
                # The thread sleeps until the earliest deadline: wake it only
                # for an earlier one. A burst of cancels schedules one
                # escalation each, and waking the thread for every one made
                # it fight the canceller for this lock and the GIL.
                self._cond.notify()
        return handle

    def _run(self) -> None:
        while True:
            with self._cond:
                while (handle := self._queue.pop_due(time.monotonic())) is None:
                    when = self._queue.next_when()
                    # Below TIMEOUT_MAX: call_later queues no endless delay.
                    self._cond.wait(None if when is None else when - time.monotonic())
            _run_callback(handle)


class MockClock:
    """A clock for tests that moves only when told to (trio's ``MockClock``).

    ``jump(seconds)`` moves time forward and runs, on the calling thread and
    before it returns, every callback that fell due, in deadline order
    (including the ones those callbacks schedule, if they fall due too). Give
    it to a scope with ``InterruptScope(clock=clock)``; its children share it.
    Safe to use from any thread.
    """

    def __init__(self, start: float = 0.0) -> None:
        # Guards the time and the queue; callbacks run outside it.
        self._lock = threading.Lock()
        self._now = start
        self._queue = _Queue()

    def now(self) -> float:
        with self._lock:
            return self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        if is_never(delay):
            return TimerHandle(math.inf, None)
        with self._lock:
            handle = TimerHandle(self._now + max(0.0, delay), callback)
            self._queue.push(handle)
        return handle

    def jump(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward and run every callback now due."""
        if math.isnan(seconds) or seconds < 0:
            raise ValueError(f"a clock only jumps forward, not by {seconds!r} seconds")
        with self._lock:
            self._now += seconds
        while True:
            with self._lock:
                handle = self._queue.pop_due(self._now)
            if handle is None:
                return
            _run_callback(handle)

    def __repr__(self) -> str:
        return f"<MockClock now={self._now!r}>"


SYSTEM_CLOCK = SystemClock()
