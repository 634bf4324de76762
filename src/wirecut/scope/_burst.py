"""``cancel_burst``: while a canceller cuts scope after scope, the threads it woke wait their turn.

CPython runs one thread's Python at a time. A canceller that cuts many scopes
one after another (an event loop reading 64 cancel frames) competes for the
GIL with every thread a socket just woke: the workers its first cuts woke,
which unwind, and each stream still running, which reads its next token. At
64 streams the console's loop read the other 63 frames 3.3 ms after its
first cut, though they were in its socket already: it was waiting for its
turn (docs/architecture.md, "A burst of cancels, measured").

While a canceller holds the burst, a scoped read that returned waits before
its thread goes on with what it read, so that the cuts go first. A reader
whose scope was cancelled by the time the burst began goes on at once: a
lone cancel costs its own command nothing. Waiting is bounded twice: at most
``bound`` seconds a read, and not at all once a burst is older than
``longest`` (a canceller that never let go slows reads down for a moment, it
never stops them).

The process has one, ``cancel_burst``: the GIL is the process's. Stdlib only;
safe from any thread.
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wirecut.scope._interrupt_scope import InterruptScope

__all__ = ["CancelBurst", "cancel_burst"]


class CancelBurst:
    """Held by cancellers while they cut; scoped reads wait until no canceller holds it."""

    def __init__(self, *, bound: float = 0.02, longest: float = 0.25) -> None:
        #: The most one read waits for a burst to end, in seconds.
        self.bound = bound
        #: A burst older than this (seconds) holds no read back any more.
        self.longest = longest
        self._lock = threading.Lock()
        self._holders: set[object] = set()
        self._over = threading.Event()
        self._over.set()
        self._began_at = -math.inf
        #: Bursts begun, and reads that waited for one, since the process started.
        self.begun = 0
        self.reads_held = 0
        #: Threads waiting for the burst to end, now.
        self.waiting = 0

    @property
    def under_way(self) -> bool:
        return not self._over.is_set()

    def hold(self, owner: object) -> None:
        """``owner`` is cutting: the burst is under way until every holder has released it.

        Call it after the burst's first cut: the scopes cancelled by then are
        not held back. Holding again is a no-op.
        """
        with self._lock:
            if not self._holders:
                self._began_at = time.monotonic()
                self.begun += 1
                self._over.clear()
            self._holders.add(owner)

    def release(self, owner: object) -> None:
        """``owner`` stopped cutting (a no-op if it did not hold the burst)."""
        with self._lock:
            self._holders.discard(owner)
            if not self._holders:
                self._over.set()

    def hold_back(self, scope: InterruptScope | None) -> None:
        """Called by a thread that a read has just returned to: wait while a burst is under way.

        Not at all if ``scope`` was cancelled by the time the burst began,
        and at most ``bound`` seconds.
        """
        if self._over.is_set():
            return
        began_at = self._began_at
        if time.monotonic() - began_at > self.longest:
            return
        cancelled_at = None if scope is None else scope.cancelled_at
        if cancelled_at is not None and cancelled_at <= began_at:
            return
        with self._lock:
            self.waiting += 1
            self.reads_held += 1
        try:
            self._over.wait(self.bound)
        finally:
            with self._lock:
                self.waiting -= 1


#: The process's burst (there is one GIL to take turns at).
cancel_burst = CancelBurst()
