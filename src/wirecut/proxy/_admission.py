"""``Admission``: at most as many requests upstream as it has slots, the rest in a FIFO.

llama.cpp starts queued requests whose client already left (docs/architecture.md,
fact 11): only a queue in front of it, that admits no more than its slots,
keeps dead work off the engine. A request waits here until a slot is free;
one whose client leaves (or that is cancelled, or times out) while it waits
is taken out of the queue and never reaches the upstream.

Event loop only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

__all__ = ["Admission"]


class Admission:
    """A FIFO gate of ``slots`` places (None: unlimited).

    A freed place goes straight to the oldest waiter, so a newcomer never
    overtakes the queue; a waiter that gives up leaves the queue, and a place
    handed to it meanwhile goes to the next one.
    """

    def __init__(self, slots: int | None) -> None:
        if slots is not None and (isinstance(slots, bool) or slots < 1):
            raise ValueError(f"slots must be a whole number >= 1 or None, not {slots!r}")
        self.slots = slots
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def _free(self) -> bool:
        return self.slots is None or self.in_flight < self.slots

    async def enter(self, give_up: asyncio.Event) -> bool:
        """Take a place (waiting in line for one); False if ``give_up`` was set first.

        A True return must be paired with one ``leave()``. If the calling
        task is cancelled while it waits, it leaves the line and a place
        handed to it meanwhile is passed on.
        """
        if give_up.is_set():
            return False
        if not self._waiters and self._free():
            self.in_flight += 1
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        gave_up = asyncio.ensure_future(give_up.wait())
        either: set[asyncio.Future[Any]] = {waiter, gave_up}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self._withdraw(waiter)
            raise
        finally:
            gave_up.cancel()
        if waiter.done() and not give_up.is_set():
            return True  # Handed a place by leave(); in_flight already counts it.
        self._withdraw(waiter)
        return False

    def _withdraw(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done() and not waiter.cancelled():
            self.leave()  # It was handed a place it will not use: pass it on.
            return
        waiter.cancel()
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    def resize(self, slots: int | None) -> None:
        """Change the number of places (None: unlimited); more places admit waiters at once.

        Fewer places take none back: the requests in flight run on, and no
        waiter is admitted until in flight falls under the new number.
        """
        if slots is not None and (isinstance(slots, bool) or slots < 1):
            raise ValueError(f"slots must be a whole number >= 1 or None, not {slots!r}")
        self.slots = slots
        while self._waiters and self._free():
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)  # Its place; in_flight counts it.

    def leave(self) -> None:
        """Give a place back: to the oldest waiter, or to the pool."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # The place moves to it; in_flight stays.
                return
        self.in_flight -= 1
