"""``Admission``: the provider's admission line (``AdmissionLine``) on the proxy's event loop.

llama.cpp starts queued requests whose client already left (docs/architecture.md,
fact 11): only a queue in front of it, that admits no more than its slots,
keeps dead work off the engine. The line's bookkeeping (who is in flight, who
waits in which order, who gets a freed place) is
``wirecut.provider._admission.AdmissionLine``, the same one ``SlotGate``
wraps for threads; here each waiter is a future of the loop. A request
waits until a slot is free; one whose client leaves (or that is cancelled,
or times out) while it waits leaves the line and never reaches the upstream.

Event loop only.
"""

from __future__ import annotations

import asyncio
from typing import Any

from wirecut.provider import AdmissionHost

__all__ = ["Admission"]


class Admission(AdmissionHost[asyncio.Future[None]]):
    """An ``AdmissionLine`` of ``slots`` places (None: unlimited) whose waiters are futures.

    A freed place goes straight to the oldest waiter, so a newcomer never
    overtakes the queue; a waiter that gives up leaves the queue, and a place
    handed to it meanwhile goes to the next one.
    """

    async def enter(self, give_up: asyncio.Event) -> bool:
        """Take a place (waiting in line for one); False if ``give_up`` was set first.

        A True return must be paired with one ``leave()``. If the calling
        task is cancelled while it waits, it leaves the line and a place
        handed to it meanwhile is passed on.
        """
        if give_up.is_set():
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._line.try_enter(waiter):
            return True
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
            return True  # Handed a place by leave() or resize(); in_flight counts it.
        self._withdraw(waiter)
        return False

    def _withdraw(self, waiter: asyncio.Future[None]) -> None:
        if self._line.withdraw(waiter):
            waiter.cancel()
        else:
            self.leave()  # It was handed a place it will not use: pass it on.

    def resize(self, slots: int | None) -> None:
        """Change the number of places (None: unlimited); more places admit waiters at once.

        Fewer places take none back: the requests in flight run on, and no
        waiter is admitted until in flight falls under the new number.
        """
        _wake(self._line.resize(slots))

    def leave(self) -> None:
        """Give a place back: to the oldest waiter, or to the pool."""
        _wake(self._line.leave())


def _wake(admitted: list[asyncio.Future[None]]) -> None:
    for waiter in admitted:
        waiter.set_result(None)  # Its place; the line counts it in flight.
