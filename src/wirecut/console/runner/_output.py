"""A command's output: routed from ``print()`` by scope, capped, and coalesced into frames.

Routing. ``sys.stdout`` and ``sys.stderr`` are replaced once (``route_stdio``)
by writers that look up the command owning the *bound scope* (walking up
through child scopes: an agent turn, a ``scope.spawn()`` thread), and write to
that command's output; code with no command scope writes to the real stream.
The scope, not a ContextVar of our own, is the key because it is what already
crosses into every thread a command starts (docs/architecture.md, fact 5), so ``print()`` in a
command's tool thread reaches that command and never another. No
process-global ``redirect_stdout``: two commands print at once.

Coalescing. Worker threads append to an ``OutputBuffer``; the event loop
sends what accumulated a few milliseconds after the first write, merged per
stream, so a model streaming hundreds of tokens a second costs a few frames a
second. The buffers of one runner share one ``OutputFlusher``: one wake-up of
the loop and one timer per few milliseconds for all of them, not one per
command with something new (64 commands streaming 50 tokens a second each
woke the loop 3,200 times a second). ``close()`` (at the terminal frame)
flushes and then drops, and counts, everything written later: nothing
follows a command's ``complete``.

Both wake the loop through a ``LoopInbox``: what threads hand over while the
loop has not yet taken the last batch joins that batch, for no wake-up more.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TextIO, TypeVar

from wirecut.console.commands import Stream
from wirecut.scope import InterruptScope, current_scope

__all__ = [
    "LoopInbox",
    "OutputBuffer",
    "OutputFlusher",
    "bind_output",
    "call_soon",
    "route_stdio",
]

T = TypeVar("T")

#: Characters one command may output before the rest is cut (one notice says so).
OUTPUT_CAP = 1 << 20
#: How long output accumulates before it is sent, in seconds.
COALESCE_DELAY = 0.005


def call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    """``loop.call_soon_threadsafe`` from a worker, quietly nothing once the loop is closed.

    ``fn`` runs in a context of its own, not in a copy of the worker's, where
    the command's scope is bound: a timer it sets (a command's timeout) would
    keep that scope alive until the timer's time, cancelled or not.
    """
    try:
        loop.call_soon_threadsafe(fn, *args, context=contextvars.Context())
    except RuntimeError:
        pass  # The loop is closed: the server is gone, and so is the client.


class LoopInbox(Generic[T]):
    """Items put from any thread, handed to ``take`` on the event loop in batches.

    The first ``put`` after a batch was taken wakes the loop (``delay``
    seconds later, if given); the items put until the loop takes them join
    that batch. A loop wake-up from another thread is a write to the loop's
    self-pipe, which lets go of the GIL: when 64 cut workers return at once,
    that was 64 more turns at the GIL for the loop to wait through before
    their ``complete`` frames. Quietly nothing once the loop is closed.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        take: Callable[[list[T]], None],
        *,
        delay: float = 0.0,
    ) -> None:
        self._loop = loop
        self._take = take
        self._delay = delay
        # Guards the two below: threads put, the loop takes.
        self._lock = threading.Lock()
        self._items: list[T] = []
        self._armed = False

    def put(self, item: T) -> None:
        with self._lock:
            self._items.append(item)
            if self._armed:
                return  # The loop was woken for this batch already.
            self._armed = True
        call_soon(self._loop, self._arm if self._delay > 0 else self._drain)

    def _arm(self) -> None:
        self._loop.call_later(self._delay, self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._armed = False
        self._take(items)


class OutputFlusher:
    """Flushes every ``OutputBuffer`` with something new, ``delay`` after the first of them.

    ``mark`` is safe from any thread; the flush runs on the event loop.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, *, delay: float = COALESCE_DELAY) -> None:
        self._marked: LoopInbox[OutputBuffer] = LoopInbox(loop, _flush_each, delay=delay)

    def mark(self, buffer: OutputBuffer) -> None:
        self._marked.put(buffer)


def _flush_each(buffers: list[OutputBuffer]) -> None:
    for buffer in buffers:
        buffer.flush()  # nothing if it was flushed meanwhile (a confirm, a close)


class OutputBuffer:
    """What one command wrote and the event loop has not sent yet.

    ``write`` is safe from any thread; ``flush`` and ``close`` run on the
    event loop, which calls ``emit(stream, data)`` in order. ``flusher`` is
    shared with the other buffers of a runner; without one the buffer has its
    own (``delay`` after its first write).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        emit: Callable[[Stream, str], None],
        *,
        on_dropped: Callable[[int], None] = lambda n: None,
        cap: int = OUTPUT_CAP,
        delay: float = COALESCE_DELAY,
        flusher: OutputFlusher | None = None,
    ) -> None:
        self._flusher = flusher or OutputFlusher(loop, delay=delay)
        self._emit = emit
        self._on_dropped = on_dropped
        self._cap = cap
        # Guards everything below: workers append, the loop takes.
        self._lock = threading.Lock()
        self._chunks: list[tuple[Stream, list[str]]] = []
        self._written = 0
        self._scheduled = False
        self._capped = False
        self._closed = False

    def write(self, stream: Stream, data: str) -> None:
        if not data:
            return
        with self._lock:
            if self._closed:
                dropped = len(data)
            else:
                dropped = 0
                room = self._cap - self._written
                if len(data) > room:
                    data = data[: max(room, 0)]
                    if not self._capped:
                        self._capped = True
                        notice = f"\n[output cut short: over {self._cap} characters]\n"
                        self._append(stream, data)
                        stream, data = "stderr", notice
                if data:
                    self._append(stream, data)
                    self._written += len(data)
                schedule = not self._scheduled
                self._scheduled = True
        if dropped:
            self._on_dropped(dropped)
            return
        if schedule:
            self._flusher.mark(self)

    def _append(self, stream: Stream, data: str) -> None:
        # Called with the lock held.
        if self._chunks and self._chunks[-1][0] == stream:
            self._chunks[-1][1].append(data)
        else:
            self._chunks.append((stream, [data]))

    def flush(self) -> None:
        """Send what accumulated (event loop only)."""
        with self._lock:
            chunks, self._chunks = self._chunks, []
            self._scheduled = False
        for stream, parts in chunks:
            self._emit(stream, "".join(parts))

    def close(self) -> None:
        """Flush, then drop (and count) every later write (event loop only)."""
        self.flush()
        with self._lock:
            self._closed = True
            self._chunks = []


#: Each command scope's output, held weakly both ways. A buffer's ``emit``
#: reaches its command and so the scope: a buffer held strongly here kept its
#: own key alive, and with it every command's record, scope, exception and
#: frames for the life of the server.
_owners: weakref.WeakKeyDictionary[InterruptScope, weakref.ref[OutputBuffer]] = (
    weakref.WeakKeyDictionary()
)
_owners_lock = threading.Lock()


def bind_output(scope: InterruptScope, buffer: OutputBuffer) -> None:
    """Route what code under ``scope`` (and its child scopes) prints to ``buffer``.

    The binding lasts while both live: whoever owns ``buffer`` (the command's
    record) keeps it.
    """
    with _owners_lock:
        _owners[scope] = weakref.ref(buffer)


def _binding_for_current_scope() -> weakref.ref[OutputBuffer] | None:
    """The output bound to the current scope or its nearest ancestor; None if none is."""
    scope = current_scope()
    while scope is not None:
        found = _owners.get(scope)
        if found is not None:
            return found
        scope = scope.parent
    return None


class _RoutedStream(io.TextIOBase):
    """A ``sys.stdout``/``sys.stderr`` that writes to the current command's output."""

    def __init__(self, stream: Stream, fallback: TextIO) -> None:
        self._stream: Stream = stream
        self.fallback = fallback

    def write(self, s: str) -> int:
        found = _binding_for_current_scope()
        if found is None:
            return self.fallback.write(s)
        buffer = found()
        if buffer is not None:
            buffer.write(self._stream, s)
        # else: its command is gone, and what it prints is dropped, as after its complete.
        return len(s)

    def flush(self) -> None:
        if _binding_for_current_scope() is None:
            self.fallback.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        # encoding, fileno, ... of the real stream, for code that asks.
        return getattr(self.fallback, name)


class route_stdio:  # lower case: used like a function, as contextlib.suppress is
    """Route ``print()`` of commands to their output while the ``with`` block runs.

    Replaces ``sys.stdout``/``sys.stderr`` with routing writers (unless they
    route already) and puts back, on the way out, what it replaced, if the
    streams are still the ones it installed. Safe from any thread; usually
    entered once by the server's lifespan.
    """

    def __init__(self) -> None:
        self._installed: list[tuple[str, _RoutedStream]] = []

    def __enter__(self) -> None:
        for name, kind in (("stdout", "stdout"), ("stderr", "stderr")):
            current = getattr(sys, name)
            if not isinstance(current, _RoutedStream):
                routed = _RoutedStream(kind, current)  # type: ignore[arg-type]
                setattr(sys, name, routed)
                self._installed.append((name, routed))

    def __exit__(self, *exc_info: object) -> None:
        for name, routed in self._installed:
            if getattr(sys, name) is routed:
                setattr(sys, name, routed.fallback)
        self._installed.clear()
