"""``H1Transport``: an httpx transport that speaks HTTP/1.1 itself, so that a stream is cheap.

Through httpcore, every chunk of a streamed body passes h11's pure-Python
state machine, httpcore's stream layers and ours: a provider sends one chunk
per token, and that was most of the CPU a relayed token cost. This transport
keeps httpx's client (the request it builds, its ``Response``, its errors)
and does the connection itself: the request written in one ``sendall``, the
response head and body parsed by llhttp in C (``ResponseParser``), one
``recv`` per batch of whatever arrived.

Everything that makes ``ScopedTransport`` cuttable holds here the same way:
a connection's socket registers with the scope bound at its connect
(``SocketHold``: a cut ends the connect, the TLS handshake, a write or a read
at once, and the peer sees the close), one keep-alive pool per scope
(``PerScope``, which closes a cancelled or idle scope's connections), and a
connection that did not end its response cleanly is closed, never reused.
An idle connection is unregistered; it is registered again when a request
takes it.

It calls httpcore's ``trace`` extension with the events of an HTTP/1.1
exchange (``http11.send_request_headers.started`` ...), so a caller that
tells "the provider may have the request" from "nothing was sent" by them
(``wirecut.provider``) sees the same on either transport.

What it does not do, since the provider's requests need none of it: HTTP/2,
proxies, Unix sockets, ``Expect: 100-continue`` (an informational response is
skipped), response trailers (discarded).
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

from wirecut.http._backend import DEFAULT_CONNECT_TIMEOUT, check_seconds
from wirecut.http._cut import cut_as_interrupted, raise_if_cut
from wirecut.http._per_scope import Lease, PerScope
from wirecut.http._response_parser import ResponseParser, ResponseProtocolError
from wirecut.http._socket_hold import SocketHold
from wirecut.http._thirdparty import shared_ssl_context
from wirecut.http._transport import DEFAULT_IDLE_EXPIRY
from wirecut.scope import InterruptScope, current_scope

__all__ = ["H1Transport"]

#: Bytes asked of one ``recv``: a burst of tokens that queued up is read at once.
READ_SIZE = 65536
#: poll()'s "the peer hung up" (Linux): a pause between reads waits for it only.
_POLLRDHUP: int | None = getattr(select, "POLLRDHUP", None)

_Origin = tuple[str, str, int]  # scheme, host, port


class _Connection:
    """One HTTP/1.1 connection: its socket and the registration of that socket.

    Used by one thread at a time (the one whose request holds it); the scope's
    cut reaches the socket from any thread, and only shuts it down.
    """

    __slots__ = ("_hangup", "_read_timeout", "hold", "origin", "sock")

    def __init__(self, hold: SocketHold, sock: socket.socket, origin: _Origin) -> None:
        self.hold = hold
        self.sock = sock
        self.origin = origin
        self._read_timeout: float | bool | None = False  # False: not set yet
        self._hangup: select.poll | None = None

    def pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the socket is shut down or its peer closed.

        Data arriving does not end the wait (it is what the wait is for): the
        poll asks for a hang-up only, which a cut (``shutdown``) is. Where
        the system cannot ask that (no ``POLLRDHUP``), the scope's sleep,
        which a cancel ends, does it.
        """
        if _POLLRDHUP is None:
            _pause(self.hold.scope, seconds)
            return
        if self._hangup is None:
            self._hangup = select.poll()
            self._hangup.register(self.sock, _POLLRDHUP)
        self._hangup.poll(seconds * 1000)

    def recv(self, timeout: float | None) -> bytes:
        """One read of at most ``READ_SIZE`` bytes; ``TimeoutError`` after ``timeout`` s.

        A plain socket reads in blocking mode with the kernel's receive
        timeout (``SO_RCVTIMEO``): one system call a read, where Python's own
        timeout polls first. A TLS socket keeps Python's.
        """
        sock = self.sock
        if isinstance(sock, ssl.SSLSocket):
            sock.settimeout(timeout)
            return sock.recv(READ_SIZE)
        if timeout != self._read_timeout:
            sock.settimeout(None)
            seconds = 0.0 if timeout is None else max(timeout, 1e-6)
            whole = int(seconds)
            sock.setsockopt(
                socket.SOL_SOCKET,
                socket.SO_RCVTIMEO,
                struct.pack("ll", whole, int((seconds - whole) * 1e6)),
            )
            self._read_timeout = timeout
        try:
            return sock.recv(READ_SIZE)
        except BlockingIOError as exc:  # SO_RCVTIMEO passed
            raise TimeoutError("timed out") from exc

    def send(self, data: bytes, timeout: float | None) -> None:
        self.sock.settimeout(timeout)
        self._read_timeout = False  # settimeout() changed the socket's mode
        self.sock.sendall(data)

    def stale(self) -> bool:
        """True if the idle connection was closed by its peer (or has data nobody asked for)."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        """Unregister (waiting for a cut in flight), then close: the owner's act."""
        try:
            self.hold.release()
        finally:
            self.sock.close()


class _Pool:
    """A scope's idle keep-alive connections, by origin. Safe from any thread."""

    def __init__(self) -> None:
        # Guards the idle lists and the closed flag; never held during I/O.
        self._lock = threading.Lock()
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._closed = False

    def take(self, origin: _Origin) -> _Connection | None:
        """An idle connection to ``origin`` whose peer did not close it, or None."""
        while True:
            with self._lock:
                idle = self._idle.get(origin)
                if not idle:
                    return None
                connection = idle.pop()
            if not connection.stale():
                return connection
            connection.close()

    def give_back(self, connection: _Connection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.setdefault(connection.origin, []).append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [c for connections in self._idle.values() for c in connections]
            self._idle.clear()
        for connection in idle:
            connection.close()


class H1Transport(httpx.BaseTransport):
    """An ``httpx.BaseTransport`` for HTTP/1.1 whose connections register with the bound scope.

    ``connect_timeout`` bounds one TCP connect and one TLS handshake, whatever
    a request's timeout says; ``verify``, ``cert`` and ``trust_env`` are
    httpx's; ``keepalive_expiry`` closes a scope's pool once idle that long.
    ``read_interval`` (seconds, 0: none) paces the reads of a body once it
    flows: at most one read per interval, which takes whatever arrived
    meanwhile, so a stream of many small chunks (a token each) wakes its
    reader a few times a second instead of once a chunk. The head and a
    body's first bytes are read as they come. Safe to share between threads
    and scopes.

    Cancellation: under a cancelled scope a request raises ``Interrupted``
    before a connection is opened or reused. A cut wakes a request blocked in
    the connect, the TLS handshake, sending, the response head or a body read
    at once, with ``Interrupted``; the server sees the connection close, and
    the connection is never reused. With no scope bound it is a plain HTTP/1.1
    transport.
    """

    def __init__(
        self,
        *,
        connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
        verify: Any = True,
        cert: Any = None,
        trust_env: bool = True,
        keepalive_expiry: float | None = DEFAULT_IDLE_EXPIRY,
        read_interval: float = 0.0,
    ) -> None:
        check_seconds("connect_timeout", connect_timeout, allow_none=True)
        if not isinstance(read_interval, int | float) or not 0 <= read_interval <= 1:
            raise ValueError(f"read_interval must be 0 to 1 seconds, not {read_interval!r}")
        self._connect_timeout = connect_timeout
        self._read_interval = float(read_interval)
        self._ssl_args = (verify, cert, trust_env)
        self._ssl: ssl.SSLContext | None = None
        self._pools: PerScope[_Pool] = PerScope(_Pool, idle_expiry=keepalive_expiry)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        origin = _origin(request.url)
        timeouts = request.extensions.get("timeout", {})
        scope = current_scope()
        lease = self._pools.enter(scope)
        try:
            head = _request_bytes(request)
            trace = _Trace(request)
            connection, parser = self._exchange(
                lease.resource, scope, origin, head, timeouts, trace
            )
        except BaseException:
            self._pools.leave(lease)
            raise
        body = _Body(
            connection, parser, lease, self._pools, timeouts.get("read"), self._read_interval
        )
        return httpx.Response(
            parser.status_code,
            headers=parser.headers,
            stream=body,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": parser.reason},
        )

    def close(self) -> None:
        self._pools.close()

    def _exchange(
        self,
        pool: _Pool,
        scope: InterruptScope | None,
        origin: _Origin,
        head: bytes,
        timeouts: dict[str, float | None],
        trace: _Trace,
    ) -> tuple[_Connection, ResponseParser]:
        """Send the request and read the response head, on a pooled connection or a new one.

        A pooled connection that the server closed just as we sent (no byte
        of a response came back) is replaced by a new one, once: the server
        had not read the request.
        """
        if scope is not None:
            scope.check()
        connection = pool.take(origin)
        if connection is not None:
            try:
                connection.hold.hold(connection.sock)  # Raises Interrupted if cancelled.
                return connection, _send_and_read_head(connection, head, timeouts, trace)
            except _NothingCame:
                connection.close()
            except BaseException:
                connection.close()
                raise
        connection = self._connect(scope, origin, timeouts.get("connect"))
        try:
            return connection, _send_and_read_head(connection, head, timeouts, trace)
        except _NothingCame as exc:
            connection.close()
            if exc.__cause__ is not None:
                raise httpx.WriteError(f"sending the request failed: {exc.__cause__}") from None
            raise httpx.RemoteProtocolError(
                "the server closed the connection without sending a response"
            ) from None
        except BaseException:
            connection.close()
            raise

    def _connect(
        self, scope: InterruptScope | None, origin: _Origin, timeout: float | None
    ) -> _Connection:
        scheme, host, port = origin
        timeout = _bounded(timeout, self._connect_timeout)
        hold = SocketHold(scope)
        try:
            sock = hold.connect_tcp(host, port, timeout=timeout)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        if scheme == "https":
            sock = self._start_tls(hold, sock, host, timeout)
        return _Connection(hold, sock, origin)

    def _start_tls(
        self, hold: SocketHold, sock: socket.socket, host: str, timeout: float | None
    ) -> socket.socket:
        context = self._ssl_context()
        # The wrap detaches the plain socket before its handshake: a dup keeps
        # the real socket registered through it (docs/architecture.md, fact 7).
        hold.hold_across_wrap(sock)
        try:
            sock.settimeout(timeout)
            with cut_as_interrupted(hold.scope):
                tls = context.wrap_socket(sock, server_hostname=host)
        except BaseException as exc:
            hold.release()
            sock.close()
            if isinstance(exc, TimeoutError):
                raise httpx.ConnectTimeout(f"the TLS handshake with {host} timed out") from exc
            if isinstance(exc, OSError):
                raise httpx.ConnectError(f"the TLS handshake with {host} failed: {exc}") from exc
            raise
        try:
            hold.hold(tls)  # The registration moves to the TLS socket; the dup is closed.
        except BaseException:
            tls.close()
            raise
        return tls

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            verify, cert, trust_env = self._ssl_args
            context = shared_ssl_context(httpx, verify, cert, trust_env)
            context.set_alpn_protocols(["http/1.1"])  # as httpcore does for HTTP/1.1
            self._ssl = context
        return self._ssl


class _Trace:
    """httpcore's ``trace`` request extension, if the request has one."""

    __slots__ = ("_hook",)

    def __init__(self, request: httpx.Request) -> None:
        self._hook = request.extensions.get("trace")

    def __call__(self, event: str) -> None:
        if self._hook is not None:
            self._hook(event, {})


class _NothingCame(Exception):
    """A reused connection gave no byte of a response before it closed."""


def _send_and_read_head(
    connection: _Connection, head: bytes, timeouts: dict[str, float | None], trace: _Trace
) -> ResponseParser:
    scope = connection.hold.scope
    write_failed: OSError | None = None
    try:
        trace("http11.send_request_headers.started")
        connection.send(head, timeouts.get("write"))
        trace("http11.send_request_body.complete")
    except TimeoutError as exc:
        raise_if_cut(scope, exc)
        raise httpx.WriteTimeout("sending the request timed out") from exc
    except OSError as exc:
        raise_if_cut(scope, exc)
        # A server may answer (413, say) and close before reading it all:
        # its answer is read all the same, as httpcore does.
        write_failed = exc
    trace("http11.receive_response_headers.started")
    parser = ResponseParser()
    got_any = False
    while not parser.headers_complete:
        try:
            data = _recv(connection, timeouts.get("read"))
        except httpx.ReadError:
            if write_failed is None or got_any:
                raise
            data = b""
        if not data:
            if not got_any:
                raise _NothingCame from write_failed
            _feed_eof(parser)
            break
        got_any = True
        _feed(parser, data)
    trace("http11.receive_response_headers.complete")
    return parser


def _recv(connection: _Connection, timeout: float | None) -> bytes:
    """One read; b"" at the peer's end. A cut is ``Interrupted``, an error is httpx's."""
    scope = connection.hold.scope
    try:
        data = connection.recv(timeout)
    except TimeoutError as exc:
        raise_if_cut(scope, exc)
        raise httpx.ReadTimeout("the server sent nothing within the read timeout") from exc
    except OSError as exc:
        raise_if_cut(scope, exc)
        raise httpx.ReadError(f"reading the response failed: {exc}") from exc
    if not data:
        raise_if_cut(scope)  # A cut reads as the end: say it was the cut.
    return data


def _feed(parser: ResponseParser, data: bytes) -> None:
    try:
        parser.feed(data)
    except ResponseProtocolError as exc:
        raise httpx.RemoteProtocolError(str(exc)) from None


def _feed_eof(parser: ResponseParser) -> None:
    try:
        parser.feed_eof()
    except ResponseProtocolError as exc:
        raise httpx.RemoteProtocolError(str(exc)) from None


class _Body(httpx.SyncByteStream):
    """A response body read from its connection as it arrives; see ``H1Transport``.

    Read to its end, a keep-alive connection goes back to its scope's pool;
    closed before its end (or after an error, or a cut), the connection is
    closed: the server sees the close and stops sending.
    """

    def __init__(
        self,
        connection: _Connection,
        parser: ResponseParser,
        lease: Lease[_Pool],
        pools: PerScope[_Pool],
        read_timeout: float | None,
        read_interval: float,
    ) -> None:
        self._connection: _Connection | None = connection
        self._parser = parser
        self._lease = lease
        self._pools = pools
        self._read_timeout = read_timeout
        self._read_interval = read_interval

    def __iter__(self) -> Iterator[bytes]:
        connection, parser = self._connection, self._parser
        if connection is None:
            return
        data = parser.take_body()
        if data:
            yield data
        pace = self._read_interval
        flowing = bool(data)
        while not parser.complete:
            if pace and flowing:
                # What arrives meanwhile waits in the socket for the next read;
                # a cut ends the pause, and the read then sees it.
                connection.pause(pace)
            received = _recv(connection, self._read_timeout)
            if received:
                _feed(parser, received)
            else:
                _feed_eof(parser)
            data = parser.take_body()
            if data:
                flowing = True
                yield data
        self._end(reuse=parser.keep_alive)

    def close(self) -> None:
        self._end(reuse=False)

    def _end(self, *, reuse: bool) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            if reuse:
                connection.hold.release()
                self._lease.resource.give_back(connection)
            else:
                connection.close()
        finally:
            self._pools.leave(self._lease)


def _pause(scope: InterruptScope | None, seconds: float) -> None:
    if scope is None:
        time.sleep(seconds)
    else:
        scope.sleep(seconds)  # Interrupted at once on a cancel


def _origin(url: httpx.URL) -> _Origin:
    scheme = url.scheme
    if scheme not in ("http", "https"):
        raise httpx.UnsupportedProtocol(f"H1Transport speaks http and https, not {scheme!r}")
    port = url.port or (443 if scheme == "https" else 80)
    return scheme, url.host, port


def _request_bytes(request: httpx.Request) -> bytes:
    """The request as it goes on the wire: the head, and the body (chunked if httpx said so)."""
    lines = [b"%s %s HTTP/1.1" % (request.method.encode("ascii"), request.url.raw_path)]
    chunked = False
    for name, value in request.headers.raw:
        if name.lower() == b"transfer-encoding" and value.lower() == b"chunked":
            chunked = True
        lines.append(name + b": " + value)
    head = b"\r\n".join(lines) + b"\r\n\r\n"
    if not chunked:
        return head + request.read()
    parts = [head]
    for chunk in request.stream:  # type: ignore[union-attr]
        if chunk:
            parts.append(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    parts.append(b"0\r\n\r\n")
    return b"".join(parts)


def _bounded(timeout: float | None, bound: float | None) -> float | None:
    if bound is None:
        return timeout
    return bound if timeout is None else min(timeout, bound)
