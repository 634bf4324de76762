"""Scripted servers on loopback, for tests and the benchmark.

``LoopbackServer`` is an HTTP/1.1 server: raw sockets, one thread per
connection. Every request received and every peer close observed is recorded,
and waiting for either is bounded (a Condition), never a sleep. A handler gets
an ``Exchange`` per request and answers it with the helpers (``json``,
``sse``, ``hold`` ...); a connection is kept alive between requests unless the
handler closes it.

``StallServer`` reads what a client sends first (a TLS ClientHello) and never
answers; ``FullBacklog`` is a listener whose accept queue is full, so that a
connect to it stays pending; ``self_signed`` makes a certificate for 127.0.0.1.
"""

from __future__ import annotations

import json
import select
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Exchange",
    "FullBacklog",
    "LoopbackServer",
    "Request",
    "StallServer",
    "connect_started",
    "self_signed",
]

#: Seconds a server's stop() waits for each of its threads.
JOIN_BOUND = 5.0


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    connection: int  # the id of the connection it came on (0, 1, ...)
    received_at: float = field(default_factory=time.monotonic)

    def json(self) -> Any:
        return json.loads(self.body)


class Exchange:
    """One request on one connection, and the means to answer it."""

    def __init__(self, server: LoopbackServer, conn: socket.socket, request: Request) -> None:
        self.server = server
        self.conn = conn
        self.request = request
        self.keep_open = True
        self.held = False

    def send(self, data: bytes) -> None:
        try:
            self.conn.sendall(data)
        except OSError:
            pass  # The peer went away; its close is recorded by the reader.

    def respond(
        self,
        status: int,
        body: bytes,
        *,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        head = [f"HTTP/1.1 {status} X", f"Content-Type: {content_type}"]
        head += [f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.send(("\r\n".join(head) + "\r\n\r\n").encode() + body)

    def json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.respond(status, json.dumps(obj).encode(), headers=headers)

    def start_chunked(self, content_type: str = "text/event-stream") -> None:
        self.send(
            f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )

    def chunk(self, data: bytes) -> None:
        self.send(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def end_chunked(self) -> None:
        self.send(b"0\r\n\r\n")

    def sse(self, payloads: Iterable[Any], *, done: bool = True, stall: bool = False) -> None:
        """Stream ``payloads`` (dicts become JSON ``data:`` events, str is raw).

        ``stall``: after the payloads, send nothing more and wait for the peer
        to close.
        """
        self.start_chunked()
        for payload in payloads:
            raw = payload if isinstance(payload, str) else f"data: {json.dumps(payload)}\n\n"
            self.chunk(raw.encode())
        if stall:
            self.hold()
            return
        if done:
            self.chunk(b"data: [DONE]\n\n")
        self.end_chunked()

    def hold(self, timeout: float = 30.0) -> None:
        """Answer nothing (more); return when the peer closes (or ``timeout``)."""
        self.keep_open = False
        self.held = True
        self.server._read_until_close(self.conn, self.request.connection, timeout)

    def close(self) -> None:
        """Close the connection (from the server's side) after this exchange."""
        self.keep_open = False


Handler = Callable[[Exchange], None]


class LoopbackServer:
    """A server on ``127.0.0.1:<port>`` running ``handler`` for each request.

    Use as a context manager; ``url`` is the base URL. ``requests`` and
    ``closes`` (connection ids whose peer closed) are the record.
    """

    def __init__(self, handler: Handler, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self._ssl_context = ssl_context
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        scheme = "https" if ssl_context else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        # Guards the records and the connection list; notified on each change.
        self._cond = threading.Condition()
        self.requests: list[Request] = []
        self.closes: list[int] = []
        self.close_times: dict[int, float] = {}
        self.connections = 0
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._accepter = threading.Thread(target=self._accept_loop, name="loopback", daemon=True)
        self._accepter.start()

    def __enter__(self) -> LoopbackServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- waiting ---------------------------------------------------------

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def wait_requests(self, n: int, timeout: float = 5.0) -> bool:
        return self.wait_for(lambda: len(self.requests) >= n, timeout)

    def wait_closes(self, n: int, timeout: float = 5.0) -> bool:
        return self.wait_for(lambda: len(self.closes) >= n, timeout)

    def wait_closed(self, connection: int, timeout: float = 5.0) -> bool:
        return self.wait_for(lambda: connection in self.closes, timeout)

    # -- serving ---------------------------------------------------------

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._cond:
                if self._stopping:
                    conn.close()
                    return
                cid = self.connections
                self.connections += 1
                self._conns.append(conn)
                thread = threading.Thread(
                    target=self._serve, args=(conn, cid), name=f"loopback-{cid}", daemon=True
                )
                self._threads.append(thread)
                self._cond.notify_all()
            thread.start()

    def _serve(self, conn: socket.socket, cid: int) -> None:
        if self._ssl_context is not None:
            try:
                tls = self._ssl_context.wrap_socket(conn, server_side=True)
            except OSError:
                self._record_close(cid)
                return
            with self._cond:
                self._conns[self._conns.index(conn)] = tls
            conn = tls
        buffer = b""
        while True:
            request, buffer = self._read_request(conn, cid, buffer)
            if request is None:
                return
            with self._cond:
                self.requests.append(request)
                self._cond.notify_all()
            exchange = Exchange(self, conn, request)
            try:
                self.handler(exchange)
            except Exception as exc:  # A test's handler failed: answer 599, keep serving.
                exchange.respond(599, repr(exc).encode(), content_type="text/plain")
            if not exchange.keep_open:
                if not exchange.held:
                    try:
                        conn.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return

    def _read_request(
        self, conn: socket.socket, cid: int, buffer: bytes
    ) -> tuple[Request | None, bytes]:
        while b"\r\n\r\n" not in buffer:
            data = self._recv(conn, cid)
            if not data:
                return None, b""
            buffer += data
        head, _, rest = buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            data = self._recv(conn, cid)
            if not data:
                return None, b""
            rest += data
        return Request(method, path, headers, rest[:length], cid), rest[length:]

    def _recv(self, conn: socket.socket, cid: int) -> bytes:
        try:
            data = conn.recv(65536)
        except TimeoutError:
            raise
        except OSError:
            data = b""
        if not data:
            self._record_close(cid)
        return data

    def _read_until_close(self, conn: socket.socket, cid: int, timeout: float) -> None:
        """Wait for the peer's close (recv -> b""), at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            conn.settimeout(remaining)
            try:
                if not self._recv(conn, cid):
                    return
            except TimeoutError:
                return
            finally:
                conn.settimeout(None)

    def _record_close(self, cid: int) -> None:
        with self._cond:
            if cid not in self.close_times:
                self.closes.append(cid)
                self.close_times[cid] = time.monotonic()
                self._cond.notify_all()

    def stop(self) -> None:
        """Stop accepting, wake every connection thread, join them, close everything."""
        with self._cond:
            self._stopping = True
            conns = list(self._conns)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._accepter.join(JOIN_BOUND)
        for conn in conns:
            try:
                socket.socket.shutdown(conn, socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in list(self._threads):
            thread.join(JOIN_BOUND)
        for conn in conns:
            conn.close()
        stuck = [t.name for t in [self._accepter, *self._threads] if t.is_alive()]
        assert not stuck, f"loopback threads still running after stop(): {stuck}"


class StallServer:
    """A listener on 127.0.0.1 that reads a client's first bytes and never answers.

    Against it a TLS client sends its ClientHello and then waits for a
    ServerHello that never comes: the handshake stalls. ``hello`` is set once
    the first bytes of a connection arrived, ``closed`` once that peer closed
    (its ``recv`` returned b""), which is how the cut shows at the server.
    """

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self.hello = threading.Event()
        self.closed = threading.Event()
        self.connections = 0
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, name="stall", daemon=True)
        self._thread.start()

    def __enter__(self) -> StallServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _serve(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        self.connections += 1
        self._conns.append(conn)
        if conn.recv(65536):
            self.hello.set()
            while conn.recv(65536):
                pass  # Whatever else comes; we never answer.
        self.closed.set()

    def stop(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for conn in self._conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(JOIN_BOUND)
        for conn in self._conns:
            conn.close()
        assert not self._thread.is_alive(), "the stall server's thread is still running"


class FullBacklog:
    """A listener on 127.0.0.1 that never accepts and whose accept queue is full.

    ``listen(0)`` queues one connection; the kernel then drops the SYN of the
    next ones and retries it for minutes, so a connect to ``port`` stays
    pending (SYN_SENT). The queue is filled until a probe connect is seen to
    stay pending for ``probe`` seconds; if none does (another kernel's
    rules), ``blocked`` is False and the caller should skip.
    """

    def __init__(self, probe: float = 0.5) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=0)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._fill: list[socket.socket] = []
        self.blocked = False
        for _ in range(8):
            sock = socket.socket()
            sock.setblocking(False)
            self._fill.append(sock)
            sock.connect_ex(("127.0.0.1", self.port))
            _, writable, _ = select.select([], [sock], [], probe)
            if not writable:
                self.blocked = True
                break

    def __enter__(self) -> FullBacklog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sock in self._fill:
            sock.close()
        self._listener.close()


def self_signed(directory: Path) -> tuple[ssl.SSLContext, ssl.SSLContext, Path] | None:
    """A server context with a fresh certificate for 127.0.0.1, a client context that
    trusts it, and the certificate file; None without the openssl command."""
    if shutil.which("openssl") is None:
        return None
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    return server, client, cert


# Ports whose next connect() sets the Event; filled by connect_started().
_connect_waiters: dict[int, threading.Event] = {}
_audit_installed = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect" and _connect_waiters:
        address = args[1]
        if isinstance(address, tuple) and len(address) >= 2:
            waiter = _connect_waiters.pop(address[1], None)
            if waiter is not None:
                waiter.set()


def connect_started(port: int) -> threading.Event:
    """An Event set when some thread of this process next starts a connect to ``port``.

    Set from Python's ``socket.connect`` audit event, which fires as the
    connect is issued: a test can then cancel while the connect is pending.
    """
    global _audit_installed
    if not _audit_installed:
        sys.addaudithook(_audit)  # Hooks cannot be removed; this one costs a dict lookup.
        _audit_installed = True
    event = threading.Event()
    _connect_waiters[port] = event
    return event
