"""The synchronous client of ``/api/console``: frames with their arrival times.

``ConsoleClient`` speaks the protocol (docs/protocol.md, "/api/console") over one
real WebSocket (the ``websockets`` sync client). A background thread reads
the frames and stamps each with ``time.monotonic()`` as it arrives, so that
``repro`` and ``bench`` can measure cancel -> ``complete`` on the client's
side of the wire. Every wait is bounded and wakes on the frame it waits for.

It is the one synchronous client of the project: the proof tools use it,
and the test suite's client (tests/_console.py) is a thin adapter over it.
The terminal's ``Link`` is its asynchronous counterpart; both build and read
frames with ``wirecut.record``.

Safe to call from any thread; the frames are kept under one condition.

Cancellation: nothing here is cancelled from outside. A wait ends on its frame,
on its timeout, or when the connection closes; ``close`` closes the connection
(the server cancels the connection's live commands, reason ``disconnect``) and
joins the reader.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from websockets.sync.client import ClientConnection, connect

from wirecut.record import CancelFrame, CompleteFacts, Frame, RunFrame, read_frame

__all__ = ["ConsoleClient", "Received"]

# How long close() waits for the reader to see the connection end.
_READER_JOIN = 5.0


@dataclass(frozen=True)
class Received:
    """A frame and the ``time.monotonic()`` at which it was read off the socket."""

    frame: Frame
    at: float

    @property
    def facts(self) -> CompleteFacts:
        """The record of a ``complete`` frame (KeyError or ValueError for another frame)."""
        return CompleteFacts.from_wire(self.frame)


class ConsoleClient:
    """One WebSocket connection to a console; use as a context manager.

    ``connect_kwargs`` go to ``websockets.sync.client.connect`` (for example
    ``additional_headers=`` or ``origin=``); frames of any size are accepted
    unless ``max_size`` says otherwise. The constructor returns once the
    server's ``ready`` frame has come (``self.ready``).

    ``send``, ``run`` and ``cancel`` return the ``time.monotonic()`` taken just
    before the frame was handed to the socket: the moment the user asked.
    """

    def __init__(self, url: str, *, open_timeout: float = 10.0, **connect_kwargs: Any) -> None:
        connect_kwargs.setdefault("max_size", None)
        # Entered as a context manager: websockets deprecates iterating a
        # connection that was not.
        self._stack = contextlib.ExitStack()
        #: The connection itself, for callers that must act below the protocol
        #: (send raw bytes, shut the TCP socket without a close handshake).
        self.ws: ClientConnection = self._stack.enter_context(
            connect(url, open_timeout=open_timeout, **connect_kwargs)
        )
        # Guards _received, _by_id, _completes and _closed; wakes every wait on each frame.
        self._cond = threading.Condition()
        self._received: list[Received] = []
        self._by_id: defaultdict[str | None, list[Received]] = defaultdict(list)
        # The complete of each id: found without reading the frames again, which
        # a burst's waits did under the lock that the reader needs for each frame
        # (thousands of output frames, 64 waits), delaying the frames they timed.
        self._completes: dict[str | None, Received] = {}
        self._closed: BaseException | None = None
        self._ids = itertools.count(1)
        self._reader = threading.Thread(target=self._read, name="wirecut-console-ws", daemon=True)
        self._reader.start()
        try:
            self.ready: Frame = self.wait_for(lambda f: f["type"] == "ready", open_timeout).frame
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        try:
            for message in self.ws:
                frame = read_frame(message)
                if frame is None:
                    raise ValueError(f"not a console frame: {message!r:.80}")
                item = Received(frame, time.monotonic())
                with self._cond:
                    self._received.append(item)
                    self._by_id[frame.get("id")].append(item)
                    if frame.get("type") == "complete":
                        self._completes.setdefault(frame.get("id"), item)
                    self._cond.notify_all()
        except Exception as exc:
            with self._cond:
                self._closed = exc
                self._cond.notify_all()
            return
        with self._cond:
            self._closed = ConnectionError("the console closed the connection")
            self._cond.notify_all()

    def send(self, frame: Frame | str) -> float:
        """Send a frame (a ``str`` goes as it is, for frames the protocol refuses)."""
        text = frame if isinstance(frame, str) else json.dumps(frame)
        at = time.monotonic()
        self.ws.send(text)
        return at

    def run(self, line: str, *, id: str | None = None, timeout: float | None = None) -> str:
        """Send a ``run`` frame; return its id."""
        id = id or f"p{next(self._ids)}"
        self.send(RunFrame(id, line, timeout).to_wire())
        return id

    def cancel(self, id: str | None = None) -> float:
        """Cancel ``id`` (every command of this connection when None); return when it was sent."""
        return self.send(CancelFrame(id).to_wire())

    def wait_for(
        self, match: Callable[[Frame], bool], timeout: float, *, id: str | None = None
    ) -> Received:
        """The first frame, received so far or later, that ``match``es.

        With ``id``, only the frames about ``id`` are read, from the index the
        reader keeps: a wait of a long session does not read every frame
        again (a benchmark's 64 waits a burst, each reading every earlier
        burst's frames too, made its client slower with every burst).

        Raises TimeoutError after ``timeout`` seconds or once the connection
        closed without one, naming why and the last frames seen.
        """
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            frames = self._received if id is None else self._by_id[id]
            while True:
                for item in frames[seen:]:
                    if match(item.frame):
                        return item
                seen = len(frames)
                remaining = deadline - time.monotonic()
                if self._closed is not None or remaining <= 0:
                    why = "timed out" if self._closed is None else repr(self._closed)
                    last = [r.frame for r in self._received[-5:]]
                    raise TimeoutError(f"no matching console frame ({why}); last: {last}")
                self._cond.wait(remaining)

    def complete(self, id: str, timeout: float) -> Received:
        """Wait for the ``complete`` frame of ``id``.

        Raises TimeoutError after ``timeout`` seconds or once the connection
        closed without it, naming why and the last frames seen.
        """
        found = self.completes({id}, timeout)
        if id in found:
            return found[id]
        with self._cond:
            why = "timed out" if self._closed is None else repr(self._closed)
            last = [r.frame for r in self._received[-5:]]
        raise TimeoutError(f"no complete for {id!r} ({why}); last: {last}")

    def completes(self, ids: set[str], timeout: float) -> dict[str, Received]:
        """Wait for the ``complete`` of each of ``ids``; return those that came in time."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = {id: self._completes[id] for id in ids if id in self._completes}
                remaining = deadline - time.monotonic()
                if len(found) == len(ids) or self._closed is not None or remaining <= 0:
                    return found
                self._cond.wait(remaining)

    def received(self, id: str | None = None) -> list[Received]:
        """Every frame so far, in order; with ``id``, only the frames about ``id``."""
        with self._cond:
            return list(self._received if id is None else self._by_id.get(id, ()))

    def close(self) -> None:
        """Close the connection (its live commands are cancelled by the server) and join.

        Raises RuntimeError if the reader is still running afterwards.
        """
        self._stack.close()
        self._reader.join(_READER_JOIN)
        if self._reader.is_alive():
            raise RuntimeError("the console client's reader did not end after close")

    def __enter__(self) -> ConsoleClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
