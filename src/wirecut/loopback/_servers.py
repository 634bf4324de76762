"""Scripted servers on loopback: the far end of the wire for ``probe``, the tests and the bench.

``LoopbackServer`` is an HTTP/1.1 server on ``127.0.0.1``: raw sockets, an
accept thread and a thread per connection. Each request it reads becomes a
``LoopbackExchange`` handed to the server's handler, which answers with the
helpers (``json``, ``sse``, ``hold``, ...); a connection is kept alive between
requests unless the handler closes it. ``StallServer`` reads what a client
sends first (a TLS ClientHello) and never answers. ``FullBacklog`` is a
listener whose accept queue is full, so that a connect to it stays pending.

A server keeps a record: the requests received, how many of them a handler is
still on, and which connection's peer closed and when (``closes``,
``close_times``, by ``time.monotonic()``). A close the server made itself, by
stopping, is not a peer's and is not recorded. One Condition guards the record
and is notified on every change, so a wait for it (``wait_for`` and the ones
built on it) is bounded and never a sleep.

Like the simulator this is the other end of the wire that the client side
is tested against: stdlib only, no code path shared with ``wirecut.scope``,
``wirecut.http`` or ``wirecut.provider``. Its threads are
plain daemon threads that belong to no scope.

A server is made, waited on and stopped from any thread; a handler runs on
the thread of the connection its request came on.

Cancellation: ``stop()`` is how a server ends. It stops accepting and shuts
every socket down (``shutdown`` wakes a blocked ``accept``/``recv``; ``close``
does not: docs/architecture.md, fact 1), joins the threads with a bound and
returns the names of those still running. Each socket is closed by the thread
that owns it, so a thread that outlives the bound keeps its socket open rather
than read a reused fd (fact 3).
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Self

__all__ = [
    "FullBacklog",
    "LoopbackExchange",
    "LoopbackHandler",
    "LoopbackRequest",
    "LoopbackServer",
    "StallServer",
]

#: How long ``stop()`` waits for all of a server's threads to end.
JOIN_BOUND = 5.0
#: The largest request head a ``LoopbackServer`` reads; a longer one ends the connection.
MAX_HEAD = 64 * 1024
#: How long a filler connect may take before its SYN counts as dropped (a
#: loopback handshake takes microseconds; this leaves room for a busy machine).
FILL_WAIT = 0.5
#: The most filler connections a ``FullBacklog`` makes before it gives up.
MAX_FILLERS = 64


@dataclass
class LoopbackRequest:
    """One request as a ``LoopbackServer`` read it."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    connection: int  # the id of the connection it came on (0, 1, ...)
    received_at: float = field(default_factory=time.monotonic)

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(eq=False)
class LoopbackExchange:
    """One request on one connection, and the means to answer it.

    Used by the server's handler, on the connection's thread.
    """

    server: LoopbackServer
    conn: socket.socket
    request: LoopbackRequest
    #: False once the connection is to serve no further request.
    keep_open: bool = True
    #: True once the handler waited for the peer's close (the server then
    #: leaves the connection to end as it did, without a shutdown of its own).
    held: bool = False

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

    def await_close(self, timeout: float | None) -> bool:
        """Send nothing for up to ``timeout`` seconds (None: no bound); True once it closed.

        True when the peer closed the connection, or the server's ``stop()``
        shut it. What the peer sends meanwhile is read and dropped, so the
        connection serves no further request after this exchange.
        """
        self.keep_open = False
        self.held = True
        return self.server._await_close(self.conn, self.request.connection, timeout)

    def hold(self, timeout: float | None = 30.0) -> None:
        """Answer nothing (more); return when the peer closes (or after ``timeout``)."""
        self.await_close(timeout)

    def close(self) -> None:
        """Close the connection (from the server's side) after this exchange."""
        self.keep_open = False


LoopbackHandler = Callable[[LoopbackExchange], None]


class _Acceptor:
    """A listener on ``127.0.0.1``, a thread per connection, and the record of peer closes.

    A subclass serves a connection in ``_serve`` and sets its own fields
    before calling ``__init__``, whose last act starts the accept thread.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        # Guards the record, the connection table and the sockets' states: a
        # socket is shut down (by stop) and closed (by the thread that owns it)
        # only under it, so a shutdown never reaches a closed, perhaps reused,
        # fd (docs/architecture.md, fact 3).
        self._cond = threading.Condition()
        self.connections = 0
        self.closes: list[int] = []
        self.close_times: dict[int, float] = {}
        self._conns: dict[int, socket.socket] = {}
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._listener_open = True
        self._accepter = threading.Thread(
            target=self._accept_loop, name=f"{name}-accept", daemon=True
        )
        self._accepter.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        stuck = self.stop()
        if stuck and exc is None:
            raise RuntimeError(f"{self.name}: threads still running after stop(): {stuck}")

    # -- waiting --------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Wait until ``predicate()`` holds (checked under the lock); False after ``timeout``."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def wait_closes(self, n: int, timeout: float = 5.0) -> bool:
        return self.wait_for(lambda: len(self.closes) >= n, timeout)

    def wait_closed(self, connection: int, timeout: float = 5.0) -> bool:
        return self.wait_for(lambda: connection in self.close_times, timeout)

    # -- stopping -------------------------------------------------------------------

    def stop(self, bound: float = JOIN_BOUND) -> list[str]:
        """Stop accepting, wake and join every thread; each closes its own socket.

        Returns the names of the threads still running after ``bound``
        seconds. Idempotent.
        """
        deadline = time.monotonic() + bound
        with self._cond:
            # No connection is added from here: the accept thread checks
            # this under the lock, and starts each thread under it.
            self._stopping = True
            self._cond.notify_all()
            if self._listener_open:
                _shutdown(self._listener)  # wakes accept() (Linux)
            for conn in self._conns.values():
                _shutdown(conn)  # wakes recv(); the peer sees the close
            threads = [self._accepter, *self._threads]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [thread.name for thread in threads if thread.is_alive()]

    # -- serving (the server's own threads) -----------------------------------------

    def _accept_loop(self) -> None:
        try:
            while True:
                try:
                    conn, _ = self._listener.accept()
                except OSError:
                    return  # stop() shut the listener down
                with self._cond:
                    if self._stopping:
                        conn.close()
                        return
                    cid = self.connections
                    self.connections += 1
                    self._conns[cid] = conn
                    thread = threading.Thread(
                        target=self._run_connection,
                        args=(conn, cid),
                        name=f"{self.name}-conn{cid}",
                        daemon=True,
                    )
                    self._threads.append(thread)
                    thread.start()
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._listener_open = False
                self._listener.close()

    def _run_connection(self, conn: socket.socket, cid: int) -> None:
        try:
            self._serve(conn, cid)
        finally:
            with self._cond:
                self._conns.pop(cid).close()  # the socket in use now: perhaps a TLS one

    def _serve(self, conn: socket.socket, cid: int) -> None:
        raise NotImplementedError

    def _adopt(self, cid: int, conn: socket.socket) -> bool:
        """Make ``conn`` the socket of connection ``cid``; False once the server is stopping."""
        with self._cond:
            self._conns[cid] = conn
            return not self._stopping

    def _recv(self, conn: socket.socket, cid: int) -> bytes:
        """What the peer sent next; b"" (recorded as its close) once it closed.

        A ``TimeoutError`` (of a socket given a timeout) propagates.
        """
        try:
            data = conn.recv(65536)
        except TimeoutError:
            raise
        except OSError:
            data = b""
        if not data:
            self._record_close(cid)
        return data

    def _await_close(self, conn: socket.socket, cid: int, timeout: float | None) -> bool:
        """Read and drop until the peer closes (True) or ``timeout`` passes (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    conn.settimeout(remaining)
                try:
                    if not self._recv(conn, cid):
                        return True
                except TimeoutError:
                    return False
        finally:
            conn.settimeout(None)

    def _record_close(self, cid: int) -> None:
        with self._cond:
            if self._stopping or cid in self.close_times:
                return  # our own stop's shutdown, or a close already recorded
            self.closes.append(cid)
            self.close_times[cid] = time.monotonic()
            self._cond.notify_all()


class LoopbackServer(_Acceptor):
    """An HTTP/1.1 server on ``127.0.0.1:<port>`` running ``handler`` for each request.

    Use as a context manager (leaving it stops the server, and raises if a
    thread is still running after the bound) or call ``stop()``. ``url`` is
    the base URL; ``ssl_context`` makes it HTTPS. Its threads are named
    ``<name>-accept`` and ``<name>-conn<N>``. A handler that raises gets its
    request answered with a 599 and the connection goes on serving.

    The record: ``requests`` in the order they came, ``open_requests`` (how
    many a handler is on now), ``connections`` accepted, and the peer closes.
    """

    def __init__(
        self,
        handler: LoopbackHandler,
        *,
        ssl_context: ssl.SSLContext | None = None,
        name: str = "loopback",
    ) -> None:
        self.handler = handler
        self._ssl_context = ssl_context
        self.requests: list[LoopbackRequest] = []
        self.open_requests = 0
        super().__init__(name)
        scheme = "https" if ssl_context else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"

    def wait_requests(self, n: int, timeout: float = 5.0) -> bool:
        return self.wait_for(lambda: len(self.requests) >= n, timeout)

    def _serve(self, conn: socket.socket, cid: int) -> None:
        if self._ssl_context is not None:
            try:
                # The handshake only once stop() can reach the TLS socket.
                conn = self._ssl_context.wrap_socket(
                    conn, server_side=True, do_handshake_on_connect=False
                )
                if not self._adopt(cid, conn):
                    return
                conn.do_handshake()
            except OSError:
                self._record_close(cid)
                return
        buffer = b""
        while True:
            request, buffer = self._read_request(conn, cid, buffer)
            if request is None:
                return
            exchange = LoopbackExchange(self, conn, request)
            with self._cond:
                self.requests.append(request)
                self.open_requests += 1
                self._cond.notify_all()
            try:
                self.handler(exchange)
            except Exception as exc:  # The handler failed: answer 599, keep serving.
                exchange.respond(599, repr(exc).encode(), content_type="text/plain")
            finally:
                with self._cond:
                    self.open_requests -= 1
                    self._cond.notify_all()
            if not exchange.keep_open:
                if not exchange.held:
                    _shutdown(conn)
                return

    def _read_request(
        self, conn: socket.socket, cid: int, buffer: bytes
    ) -> tuple[LoopbackRequest | None, bytes]:
        """The next request and what was read after it; None once closed or not HTTP."""
        while b"\r\n\r\n" not in buffer:
            if len(buffer) > MAX_HEAD:
                return None, b""
            data = self._recv(conn, cid)
            if not data:
                return None, b""
            buffer += data
        head, _, rest = buffer.partition(b"\r\n\r\n")
        request_line, *lines = head.decode("latin-1").split("\r\n")
        method, _, target = request_line.partition(" ")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            return None, b""  # A body we cannot frame: end the connection.
        while len(rest) < length:
            data = self._recv(conn, cid)
            if not data:
                return None, b""
            rest += data
        path = target.split(" ", 1)[0]
        return LoopbackRequest(method, path, headers, rest[:length], cid), rest[length:]


class StallServer(_Acceptor):
    """A listener on 127.0.0.1 that reads a client's first bytes and never answers.

    Against it a TLS client sends its ClientHello and then waits for a
    ServerHello that never comes: the handshake stalls. ``hello`` is set once
    the first bytes of a connection arrived, ``closed`` once a peer closed (its
    ``recv`` returned b""), which is how the cut shows at the server;
    ``connections`` counts the connections accepted, so a retry shows.
    Stopped like a ``LoopbackServer``.
    """

    def __init__(self, *, name: str = "stall") -> None:
        self.hello = threading.Event()
        self.closed = threading.Event()
        super().__init__(name)
        self.url = f"https://127.0.0.1:{self.port}"

    def _serve(self, conn: socket.socket, cid: int) -> None:
        if self._recv(conn, cid):
            self.hello.set()
            self._await_close(conn, cid, None)  # Whatever else comes; we never answer.
        with self._cond:
            peer_closed = cid in self.close_times
        if peer_closed:
            self.closed.set()


class FullBacklog:
    """A listener on 127.0.0.1 that never accepts and whose accept queue is full.

    ``listen(0)`` queues one connection; the kernel then drops the SYN of the
    next ones and retries it for minutes, so a connect to ``port`` stays
    pending (SYN_SENT). Filler connections are made until one stays pending
    for ``wait`` seconds; that one is closed, so that the caller's connect is
    the only one waiting. If none does within ``most`` fillers (another
    kernel's rules), ``blocked`` is False and a connect would not block.

    No threads: made, used and closed by one thread. ``close()`` (or leaving
    it as a context manager) closes the fillers and the listener, so that a
    connect still waiting is refused.
    """

    def __init__(self, *, wait: float = FILL_WAIT, most: int = MAX_FILLERS) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=0)
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.blocked = False
        self._fillers: list[socket.socket] = []
        try:
            self._fill(wait, most)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _fill(self, wait: float, most: int) -> None:
        for _ in range(most):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(wait)
            try:
                sock.connect(("127.0.0.1", self.port))
            except TimeoutError:
                sock.close()  # Its SYN was dropped: the queue is full.
                self.blocked = True
                return
            except BaseException:
                sock.close()
                raise
            self._fillers.append(sock)

    def close(self) -> None:
        """Close the fillers and the listener. Idempotent."""
        for sock in self._fillers:
            sock.close()
        self._fillers.clear()
        self._listener.close()


def _shutdown(sock: socket.socket) -> None:
    # socket.socket's own shutdown, also for a TLS socket: SSLSocket.shutdown
    # drops the TLS state that the owner thread may be reading with.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
