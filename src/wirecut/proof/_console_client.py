"""A client of ``/api/console`` for the proof tools: frames with their arrival times.

``ConsoleClient`` speaks the protocol (docs/protocol.md, "/api/console") over one
real WebSocket (the ``websockets`` sync client). A background thread reads
the frames and stamps each with ``time.monotonic()`` as it arrives, so that
``repro`` and ``bench`` can measure cancel -> ``complete`` on the client's
side of the wire. Every wait is bounded and wakes on the frame it waits for.

Safe to call from any thread; the frames are kept under one condition.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from websockets.sync.client import ClientConnection, connect

from wirecut.console.runner import CompleteFacts

__all__ = ["ConsoleClient", "Frame", "Received"]

Frame = dict[str, Any]


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

    ``run`` and ``cancel`` return the ``time.monotonic()`` taken just before
    the frame was handed to the socket: the moment the user asked.
    """

    def __init__(self, url: str, *, open_timeout: float = 10.0) -> None:
        # Entered as a context manager: websockets deprecates iterating a
        # connection that was not.
        self._stack = contextlib.ExitStack()
        self._ws: ClientConnection = self._stack.enter_context(
            connect(url, open_timeout=open_timeout, max_size=None)
        )
        # Guards _received and _closed; wakes wait_for() on every frame.
        self._cond = threading.Condition()
        self._received: list[Received] = []
        self._closed: BaseException | None = None
        self._ids = itertools.count(1)
        self._reader = threading.Thread(target=self._read, name="wirecut-proof-ws", daemon=True)
        self._reader.start()
        self.wait_for(lambda f: f["type"] == "ready", timeout=open_timeout)

    def _read(self) -> None:
        try:
            for message in self._ws:
                frame = json.loads(message)
                with self._cond:
                    self._received.append(Received(frame, time.monotonic()))
                    self._cond.notify_all()
        except Exception as exc:
            with self._cond:
                self._closed = exc
                self._cond.notify_all()
            return
        with self._cond:
            self._closed = ConnectionError("the console closed the connection")
            self._cond.notify_all()

    def send(self, frame: Frame) -> float:
        at = time.monotonic()
        self._ws.send(json.dumps(frame))
        return at

    def run(self, line: str, *, id: str | None = None, timeout: float | None = None) -> str:
        """Send a ``run`` frame; return its id."""
        id = id or f"p{next(self._ids)}"
        frame: Frame = {"type": "run", "id": id, "line": line}
        if timeout is not None:
            frame["timeout"] = timeout
        self.send(frame)
        return id

    def cancel(self, id: str | None = None) -> float:
        """Cancel ``id`` (every command of this connection when None); return when it was sent."""
        return self.send({"type": "cancel"} if id is None else {"type": "cancel", "id": id})

    def wait_for(self, match: Callable[[Frame], bool], timeout: float) -> Received:
        """The first frame, received so far or later, that ``match``es.

        Raises TimeoutError after ``timeout`` seconds or once the connection
        closed without one, naming the last frames seen.
        """
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for item in self._received[seen:]:
                    if match(item.frame):
                        return item
                seen = len(self._received)
                remaining = deadline - time.monotonic()
                if self._closed is not None or remaining <= 0:
                    last = [r.frame.get("type") for r in self._received[-5:]]
                    raise TimeoutError(f"no matching console frame (last: {last})")
                self._cond.wait(remaining)

    def complete(self, id: str, timeout: float) -> Received:
        """Wait for the ``complete`` frame of ``id``."""
        return self.wait_for(lambda f: f["type"] == "complete" and f.get("id") == id, timeout)

    def completes(self, ids: set[str], timeout: float) -> dict[str, Received]:
        """Wait for the ``complete`` of each of ``ids``; return those that came in time."""
        deadline = time.monotonic() + timeout
        found: dict[str, Received] = {}
        with self._cond:
            while True:
                for item in self._received:
                    frame = item.frame
                    if frame["type"] == "complete" and frame.get("id") in ids:
                        found.setdefault(frame["id"], item)
                remaining = deadline - time.monotonic()
                if len(found) == len(ids) or self._closed is not None or remaining <= 0:
                    return found
                self._cond.wait(remaining)

    def frames(self, id: str | None = None) -> list[Frame]:
        """Every frame so far (of ``id``, if given), in order."""
        with self._cond:
            return [r.frame for r in self._received if id is None or r.frame.get("id") == id]

    def close(self) -> None:
        """Close the connection (its live commands are cancelled by the server) and join."""
        self._stack.close()
        self._reader.join(5)

    def __enter__(self) -> ConsoleClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
