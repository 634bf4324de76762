"""``Channel``: pieces of a response from the thread that reads the upstream to the event loop.

One producer thread puts, one task on the loop takes. A put while the loop
has not yet woken for the previous one adds to the batch without a second
wakeup: at many streams a token costs one ``call_soon_threadsafe`` (a write
to the loop's self-pipe) at most, often less.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

__all__ = ["HEAD", "Channel"]

#: The first piece of a streamed answer: the upstream answered 200 with an
#: event stream, so the client's response headers may go out.
HEAD = b""


class Channel:
    """A thread -> event-loop queue of byte pieces, with batched wakeups.

    ``put`` and ``close`` from any thread; ``get`` from one task on ``loop``.
    Pieces put after ``close`` are dropped.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # Guards the pieces and the flags between the producer and the loop.
        self._lock = threading.Lock()
        self._pieces: deque[bytes] = deque()
        self._closed = False
        self._wake_pending = False
        self._waiter: asyncio.Future[None] | None = None

    def put(self, piece: bytes) -> None:
        with self._lock:
            if self._closed:
                return
            self._pieces.append(piece)
            if self._wake_pending:
                return
            self._wake_pending = True
        self._wake_soon()

    def close(self) -> None:
        """No more pieces; ``get`` returns None once the last were taken. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._wake_pending:
                return
            self._wake_pending = True
        self._wake_soon()

    async def get(self) -> list[bytes] | None:
        """Every piece put so far (waiting for one), or None once closed and drained."""
        while True:
            with self._lock:
                if self._pieces:
                    pieces = list(self._pieces)
                    self._pieces.clear()
                    return pieces
                if self._closed:
                    return None
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _wake_soon(self) -> None:
        # Thread-safe from the loop's own thread too (the worker's done
        # callback closes the channel there).
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:
            pass  # The loop is closed: nobody is left to read.

    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
