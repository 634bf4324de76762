"""``EagerSender``: ASGI messages sent from a plain callback, without a task per message.

A relayed stream is mostly small pieces, each arriving in the upstream
connection's read callback. Awaiting the client's ``send`` there would need
a task woken per piece; but ``send`` almost never waits: uvicorn writes the
piece to the transport and returns, and waits only while the client's
connection is paused (it does not read). So ``push`` runs the ``send``
coroutine at once, and only when it really waits does a task take it over
(``on_blocked`` is told, to stop reading the upstream; ``on_free`` once the
backlog went out). Messages pushed meanwhile wait their turn, in order.

Event loop only.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any

from starlette.types import Message, Send

__all__ = ["EagerSender"]


class _Yield:
    """Awaitable that hands a future a coroutine yielded back to the task that drives it."""

    __slots__ = ("future",)

    def __init__(self, future: Any) -> None:
        self.future = future

    def __await__(self) -> Generator[Any, None, None]:
        yield self.future


class EagerSender:
    """Sends messages to ``send`` at once when it does not wait; see the module docstring."""

    def __init__(
        self, send: Send, on_blocked: Callable[[], None], on_free: Callable[[], None]
    ) -> None:
        self._send = send
        self._on_blocked = on_blocked
        self._on_free = on_free
        self._backlog: deque[Message] = deque()
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        #: What a send raised (the client's connection broke): nothing more is sent.
        self.error: BaseException | None = None

    def push(self, message: Message) -> None:
        """Send ``message``, now if ``send`` takes it without waiting, else after the backlog."""
        if self.error is not None:
            return
        if self._task is not None:
            self._backlog.append(message)
            return
        awaitable = self._send(message)
        if not isinstance(awaitable, Coroutine):
            self._take_over(None, None, awaitable)  # Not ours to step.
            return
        try:
            waited_on = awaitable.send(None)
        except StopIteration:
            return
        except BaseException as exc:
            self.error = exc
            return
        self._take_over(awaitable, waited_on, None)

    def _take_over(
        self,
        coro: Coroutine[Any, Any, Any] | None,
        waited_on: Any,
        other: Awaitable[None] | None,
    ) -> None:
        self._idle.clear()
        self._on_blocked()
        task = asyncio.ensure_future(self._finish(coro, waited_on, other))
        task.add_done_callback(functools.partial(self._finished, coro))
        self._task = task

    def _finished(self, coro: Coroutine[Any, Any, Any] | None, task: asyncio.Task[None]) -> None:
        self._task = None
        self._idle.set()
        if task.cancelled():
            if coro is not None:
                coro.close()  # Also when the task was cancelled before it ever ran.
            return
        error = task.exception()
        if error is not None:
            self.error = error
            return
        self._on_free()

    async def drain(self) -> None:
        """Until every pushed message was sent (or a send failed)."""
        await self._idle.wait()

    def close(self) -> None:
        """Drop the backlog and stop a send that waits. Idempotent."""
        self._backlog.clear()
        if self._task is not None:
            self._task.cancel()

    async def _finish(
        self,
        coro: Coroutine[Any, Any, Any] | None,
        waited_on: Any,
        other: Awaitable[None] | None,
    ) -> None:
        """Step ``coro`` on from where it waits (or await ``other``), then the backlog."""
        if other is not None:
            await other
        while coro is not None:
            await _Yield(waited_on)
            try:
                waited_on = coro.send(None)
            except StopIteration:
                break
        while self._backlog:
            await self._send(self._backlog.popleft())
