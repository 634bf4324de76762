"""Inference slots and the FIFO queue in front of them, like llama.cpp's.

``SlotPool.acquire`` and ``release`` run on the server's event loop only.
``snapshot`` may be called from any thread (it is what ``GET /slots`` and
``SimulatorServer.slots()`` return).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["Slot", "SlotPool"]


@dataclass(slots=True)
class Slot:
    """One inference slot. Mutated on the event loop under the pool's lock."""

    id: int
    is_processing: bool = False
    # Tokens decoded by the current task, or by the last one once idle
    # (llama.cpp keeps the last count until the slot is reused).
    n_decoded: int = 0
    request_id: str | None = None
    # The current (or last) prompt's size and how much of it was processed,
    # under llama.cpp's /slots names.
    n_prompt_tokens: int = 0
    n_prompt_tokens_processed: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "is_processing": self.is_processing,
            "n_decoded": self.n_decoded,
            "request_id": self.request_id,
            "n_prompt_tokens": self.n_prompt_tokens,
            "n_prompt_tokens_processed": self.n_prompt_tokens_processed,
        }


class SlotPool:
    """A fixed number of slots; a request waits in FIFO order for a free one.

    A freed slot is handed straight to the oldest waiter, so a newcomer can
    never overtake the queue. A waiter that gives up (its client left, or the
    server shuts down) is taken out of the queue and never gets a slot.
    """

    def __init__(self, n_slots: int) -> None:
        self._slots = [Slot(id=i) for i in range(n_slots)]
        self._free: deque[Slot] = deque(self._slots)
        self._waiters: deque[asyncio.Future[Slot]] = deque()
        # Guards slot fields against a torn read by snapshot() in another thread.
        self._lock = threading.Lock()
        self._closed = False

    @property
    def queue_length(self) -> int:
        """Requests waiting for a slot right now (event-loop thread only)."""
        return len(self._waiters)

    def try_acquire(self, request_id: str) -> Slot | None:
        """Take a free slot at once if nobody is queued, else None."""
        if self._closed or self._waiters or not self._free:
            return None
        return self._assign(self._free.popleft(), request_id)

    async def acquire(self, request_id: str, give_up: asyncio.Event) -> Slot | None:
        """Wait in the queue for a slot; return None if ``give_up`` is set first.

        Call ``try_acquire`` first: this always queues. Returns None too when
        the pool is closed. If the calling task is cancelled, the request
        leaves the queue, and a slot handed to it meanwhile is released.
        """
        if self._closed:
            return None
        waiter: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        gave_up = asyncio.ensure_future(give_up.wait())
        either: set[asyncio.Future[Any]] = {waiter, gave_up}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self._abandon(waiter)
            raise
        finally:
            gave_up.cancel()
        # A client that left loses its turn even if a slot arrived in the same
        # instant: the slot goes on to the next waiter (llama.cpp #13262).
        if not give_up.is_set() and waiter.done() and not waiter.cancelled():
            if waiter.exception() is None:
                return self._assign(waiter.result(), request_id)
        self._abandon(waiter)
        return None

    def release(self, slot: Slot) -> None:
        """Free ``slot``: hand it to the oldest waiter still waiting, or keep it free."""
        with self._lock:
            slot.is_processing = False
            slot.request_id = None
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self._free.append(slot)

    def close(self) -> None:
        """Refuse new work and turn every queued request away (server shutdown)."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectionAbortedError("simulator shutting down"))
                # Nobody may await it any more; mark the exception as seen.
                waiter.exception()

    def set_decoded(self, slot: Slot, n_decoded: int) -> None:
        with self._lock:
            slot.n_decoded = n_decoded

    def set_prompt(self, slot: Slot, processed: int, total: int) -> None:
        with self._lock:
            slot.n_prompt_tokens = total
            slot.n_prompt_tokens_processed = processed

    def snapshot(self) -> list[dict[str, object]]:
        """Each slot as ``Slot.to_json()`` gives it; any thread."""
        with self._lock:
            return [slot.to_json() for slot in self._slots]

    def _assign(self, slot: Slot, request_id: str) -> Slot:
        with self._lock:
            slot.is_processing = True
            slot.n_decoded = 0
            slot.n_prompt_tokens = slot.n_prompt_tokens_processed = 0
            slot.request_id = request_id
        return slot

    def _abandon(self, waiter: asyncio.Future[Slot]) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            # Handed a slot in the same instant the request gave up: pass it on.
            self.release(waiter.result())
        else:
            waiter.cancel()
