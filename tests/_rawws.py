"""A WebSocket client that reads only when told to: for tests of clients that stop reading.

``websockets``' own clients read their socket on a background thread into
their own buffers, so "a client that does not read" cannot be made with them.
``RawClient`` drives websockets' sans-I/O ``ClientProtocol`` over a plain
socket: nothing is read from the socket until ``recv_frames`` is called, so
the kernel's buffers fill and the server's writes stall, as with a real
client that stopped reading.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from websockets.client import ClientProtocol
from websockets.frames import Close
from websockets.http11 import Response
from websockets.uri import parse_uri

__all__ = ["RawClient"]


class RawClient:
    """One WebSocket connection whose reads happen only in ``recv_frames``/``handshake``."""

    def __init__(self, url: str, *, rcvbuf: int | None = 4096, timeout: float = 10.0) -> None:
        uri = parse_uri(url)
        self.sock = socket.socket()
        if rcvbuf is not None:  # before connect, so the window is small from the start
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.protocol = ClientProtocol(uri, max_size=None)
        self.close: Close | None = None
        self.closed = False
        self._pending: list[Any] = []  # events that came with the handshake response
        try:
            self.sock.connect((uri.host, uri.port))
            self.protocol.send_request(self.protocol.connect())
            self._flush()
            self.response = self._handshake(timeout)
        except BaseException:
            self.sock.close()
            raise

    def _flush(self) -> None:
        data = b"".join(self.protocol.data_to_send())
        if data:
            self.sock.sendall(data)

    def _handshake(self, timeout: float) -> Response:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = self.sock.recv(4096)
            if data:
                self.protocol.receive_data(data)
            else:
                self.protocol.receive_eof()
            events = self.protocol.events_received()
            for n, event in enumerate(events):
                if isinstance(event, Response):
                    if self.protocol.handshake_exc is not None:
                        raise self.protocol.handshake_exc
                    self._pending = events[n + 1 :]
                    return event
            if not data:
                break
        raise TimeoutError("no handshake response")

    def send(self, frame: dict[str, Any] | str) -> None:
        """Send one text frame (a dict is sent as JSON); raises OSError once the server cut us."""
        self.protocol.send_text((frame if isinstance(frame, str) else json.dumps(frame)).encode())
        self._flush()

    def send_many(self, frame: dict[str, Any], count: int) -> None:
        """Send ``frame`` (as JSON) ``count`` times in one write; OSError once the server cut us."""
        self.sock.sendall(self.encode_many(frame, count))

    def encode_many(self, frame: dict[str, Any], count: int) -> bytes:
        """``count`` copies of ``frame`` as wire bytes, to send (again and again) with ``sock``.

        A flood that re-sends the same bytes costs the client nearly nothing,
        so the server, not the client, sets the pace.
        """
        data = json.dumps(frame).encode()
        for _ in range(count):
            self.protocol.send_text(data)
        return b"".join(self.protocol.data_to_send())

    def ping_many(self, count: int) -> None:
        """Send ``count`` WebSocket pings (control frames) in one write."""
        for n in range(count):
            self.protocol.send_ping(n.to_bytes(4, "big"))
        self._flush()

    def recv_frames(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Read until the connection ends (or ``timeout``); the text frames, decoded.

        ``close`` is the server's close frame, if one came; ``closed`` is True
        once the connection ended (a close, an EOF, or a reset).
        """
        frames: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        for event in self._pending:
            if getattr(event, "opcode", None) is not None and event.opcode.name == "TEXT":
                frames.append(json.loads(event.data))
        self._pending = []
        while not self.closed and time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                break
            except OSError:  # reset: the server aborted the connection
                self.closed = True
                break
            if data:
                self.protocol.receive_data(data)
            else:
                self.protocol.receive_eof()
                self.closed = True
            for event in self.protocol.events_received():
                if getattr(event, "opcode", None) is not None and event.opcode.name == "TEXT":
                    frames.append(json.loads(event.data))
            if self.protocol.close_rcvd is not None:
                self.close = self.protocol.close_rcvd
            try:
                self._flush()
            except OSError:
                self.closed = True
        return frames

    def abort(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.abort()
