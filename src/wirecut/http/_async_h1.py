"""``AsyncH1Client``: HTTP/1.1 to one server on the event loop, cut by a scope or a task cancel.

The sync ``H1Transport`` runs a request on the thread that asked for it; a
gateway relaying a thousand streams cannot afford a thread each. This client
runs every request on the event loop of its caller, with the same rules:

- the response is parsed by llhttp in C (``ResponseParser``): the head, then
  the body as it arrives, handed over in batches (``receive()`` returns
  everything that came since the last call);
- one keep-alive pool per client (one client per server): the most recently
  used idle connection is taken first, an idle one is closed after
  ``keepalive_expiry``, and a connection that did not end its response
  cleanly (cut, cancelled, broken, closed before the end, or given back with
  its body unread) is closed, never reused;
- bounded: the response head (``max_head_bytes``); the body is read only as
  fast as the caller takes it (past ``READ_HIGH_WATER`` unread bytes the
  socket is not read, and the server's writes wait), so a slow caller never
  makes the client buffer a fast server's answer.

Cancellation. Two ways in, one way out:

- ``scope``: the connection's socket is registered with the request's scope
  from the start of its connect until the response is let go (``close()``).
  The scope's cut, from any thread, shuts the socket down; the server sees
  the FIN at once, the loop reads the end, and the waiting call raises
  ``Interrupted``. A connect in progress ends the same way (a shutdown of a
  connecting socket aborts the connect). A cancelled scope refuses to start.
- the calling task is cancelled: ``CancelledError`` passes through, and on
  the way out the connection is shut down and closed (the loop owns the
  socket: closing it here is correct), so the server sees the FIN at once.

What is registered is a ``dup()`` of the socket the transport uses: the cut
from another thread shuts down the one TCP socket both descriptors name,
while the dup is closed only after its registration ended. asyncio closes
its own descriptor when it sees fit (a reset, an abort); a descriptor closed
under a cutting thread could be reused at once (docs/architecture.md, fact 3).

Name resolution (``loop.getaddrinfo``, skipped for an IP address) runs in
the loop's default executor and cannot be cut; a cancel abandons the wait.

Event loop only: a client and its responses belong to the loop that first
uses them (``close()`` may be called once that loop has stopped).
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any, cast
from urllib.parse import urlsplit

import httpx

from wirecut.http._cut import raise_if_cut
from wirecut.http._response_parser import ResponseParser, ResponseProtocolError
from wirecut.scope import InterruptScope, Registration, cut_socket

__all__ = ["MAX_HEAD_BYTES", "READ_HIGH_WATER", "AsyncH1Client", "AsyncH1Response"]

#: Unread body bytes past which the socket is not read until the caller takes them.
READ_HIGH_WATER = 256 * 1024
#: The largest response head accepted, in bytes (status line and fields).
MAX_HEAD_BYTES = 64 * 1024

Headers = Sequence[tuple[str | bytes, str | bytes]]
# family, type, proto, address: what a connect needs of one getaddrinfo answer.
_Address = tuple[int, int, int, Any]


def _bytes(value: str | bytes) -> bytes:
    return value.encode("latin-1") if isinstance(value, str) else value


def _checked(value: bytes, what: str) -> bytes:
    # A CR or LF would end the field (or the head) early: header injection.
    if b"\r" in value or b"\n" in value or b"\0" in value:
        raise ValueError(f"the request's {what} holds a line break or NUL: {value[:80]!r}")
    return value


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection, its socket's registration, and the response being read."""

    def __init__(self, max_head: int) -> None:
        self.transport: asyncio.Transport | None = None
        self.dup: socket.socket | None = None  # what the scope cuts (see the module docstring)
        self.registration: Registration | None = None
        self.parser: ResponseParser | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False  # the peer ended, or the connection was lost: no more bytes
        self.error: BaseException | None = None
        self.got_any = False  # a byte of the current response arrived
        self.unread = 0  # body bytes parsed and not taken yet (an upper bound)
        self.head_bytes = 0
        self.paused = False
        self.idle_since = 0.0
        self.delivery: _Delivery | None = None  # set by AsyncH1Response.deliver
        self._max_head = max_head

    # -- asyncio's callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if parser is None:
            # Bytes nobody asked for, on an idle connection: not to be trusted again.
            self.closed = True
            self._wake()
            return
        self.got_any = True
        head_done = parser.headers_complete
        try:
            parser.feed(data)
        except ResponseProtocolError as exc:
            self.error = httpx.RemoteProtocolError(str(exc))
        if not head_done:
            if parser.headers_complete:  # The head ended in this piece: its exact size.
                size = len(parser.reason) + sum(len(k) + len(v) + 4 for k, v in parser.headers)
            else:
                self.head_bytes += len(data)
                size = self.head_bytes
            if size > self._max_head:
                self.error = httpx.RemoteProtocolError(
                    f"the response head exceeds {self._max_head} bytes"
                )
        if self.delivery is not None:
            self.delivery.pump()  # Its consumer paces the reading itself.
            return
        self.unread += len(data)
        if self.unread > READ_HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False  # Let the transport close itself.

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if exc is not None and self.error is None:
            self.error = exc
        self._wake()

    # -- used by the client and the response ------------------------------------------

    def _wake(self) -> None:
        if self.delivery is not None:
            self.delivery.pump()
            return
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Until something happens on the connection (bytes, the end, an error)."""
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def resume(self) -> None:
        """The caller took the unread body: read the socket again."""
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def hold(self, scope: InterruptScope | None) -> None:
        """Register the socket with ``scope`` (``Interrupted`` if it is cancelled)."""
        if scope is not None and self.dup is not None:
            self.registration = scope.register_socket(self.dup)

    def let_go(self) -> None:
        """End the registration; returns once no cut of it runs on another thread."""
        registration, self.registration = self.registration, None
        if registration is not None:
            registration.unregister()

    def start(self) -> ResponseParser:
        parser = ResponseParser()
        self.parser = parser
        self.got_any = False
        self.unread = self.head_bytes = 0
        return parser

    def discard(self) -> None:
        """Shut down and close: the peer sees the FIN now. Idempotent; the loop's thread."""
        self.let_go()
        self.closed = True
        self.parser = None
        self.delivery = None
        dup, self.dup = self.dup, None
        if dup is not None:
            cut_socket(dup)  # The FIN goes out now, not when asyncio closes its fd later.
            dup.close()
        if self.transport is not None:
            self.transport.abort()


class _Delivery:
    """A response body handed to a callback as it arrives (``AsyncH1Response.deliver``)."""

    __slots__ = ("conn", "done", "on_body", "parser", "scope")

    def __init__(
        self,
        conn: _Connection,
        parser: ResponseParser,
        on_body: Callable[[bytes], None],
        scope: InterruptScope | None,
    ) -> None:
        self.conn = conn
        self.parser = parser
        self.on_body = on_body
        self.scope = scope
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def pump(self) -> None:
        """Hand over what arrived; end ``done`` at the body's end or failure (the read callback)."""
        if self.done.done():
            return
        conn, parser = self.conn, self.parser
        try:
            data = parser.take_body()
            if data:
                conn.unread = 0
                self.on_body(data)
                if self.done.done():
                    return
            if not parser.complete and (conn.error is not None or conn.closed):
                _connection_ended(conn, parser, self.scope)
                data = parser.take_body()
                if data:
                    self.on_body(data)
        except BaseException as exc:
            if not self.done.done():
                self.done.set_exception(exc)
            return
        if parser.complete and not self.done.done():
            self.done.set_result(None)


class _NothingCame(Exception):
    """A reused connection ended before any byte of a response: the server closed it idle."""


class AsyncH1Response:
    """A response whose head arrived; its body is read with ``receive()``.

    ``close()`` (or ``async with``) lets the connection go: back to the pool
    if the body was read to its end on a keep-alive connection, else shut
    down and closed. Event loop only.
    """

    __slots__ = ("_client", "_conn", "_parser", "_scope", "headers", "reason", "status_code")

    def __init__(
        self,
        client: AsyncH1Client,
        conn: _Connection,
        parser: ResponseParser,
        scope: InterruptScope | None,
    ) -> None:
        self._client = client
        self._conn: _Connection | None = conn
        self._parser = parser
        self._scope = scope
        self.status_code = parser.status_code
        self.reason = parser.reason
        #: The head's fields as sent (names not folded).
        self.headers = parser.headers

    def header(self, name: bytes) -> bytes | None:
        """The value of the first field named ``name`` (lower case), or None."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def complete(self) -> bool:
        """True once the whole body arrived (it may still wait in ``receive()``)."""
        return self._parser.complete

    async def receive(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some); b"" at its end.

        Raises ``Interrupted`` once the scope cut the connection,
        ``httpx.RemoteProtocolError`` when the server broke HTTP or closed
        before the end, ``httpx.ReadError`` when the connection failed.
        Bytes that arrived before a cut or a failure are returned first.

        Cancellation: a cancel of the calling task passes through; the
        connection is then not reusable (``close()`` shuts it down).
        """
        conn, parser = self._conn, self._parser
        if conn is None:
            return b""
        while True:
            data = parser.take_body()
            if data:
                conn.unread = 0
                if conn.paused:
                    conn.resume()
                return data
            if parser.complete:
                return b""
            if conn.error is not None or conn.closed:
                _connection_ended(conn, parser, self._scope)
                continue  # Complete: its body was "until the connection closes".
            await conn.wait()

    def deliver(self, on_body: Callable[[bytes], None]) -> asyncio.Future[None]:
        """Hand the rest of the body to ``on_body`` as it arrives, from the read callback.

        For a long stream of small pieces: no task wakes per piece. ``on_body``
        runs on the event loop inside the connection's read callback, must
        not block, and may call ``pause_reading()``. The future returned ends
        with None at the body's end, or with what ``receive()`` would have
        raised (``Interrupted`` for a cut); ``close()`` then as usual. Call
        once, instead of ``receive()``.

        Cancellation: a cancel of the task awaiting the future does not stop
        the delivery; ``close()`` does (the connection is then not reused).
        """
        conn = self._conn
        if conn is None:
            raise RuntimeError("the response was closed")
        delivery = _Delivery(conn, self._parser, on_body, self._scope)
        conn.delivery = delivery
        delivery.pump()  # What arrived before.
        return delivery.done

    def pause_reading(self) -> None:
        """Stop reading the socket until ``resume_reading()`` (the server's writes then wait)."""
        conn = self._conn
        if conn is not None and not conn.paused and conn.transport is not None:
            conn.paused = True
            conn.transport.pause_reading()

    def resume_reading(self) -> None:
        conn = self._conn
        if conn is not None:
            conn.resume()

    def close(self) -> None:
        """Let the connection go (see the class docstring). Idempotent."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.delivery = None
        parser = self._parser
        reusable = (
            parser.complete
            and parser.keep_alive
            and not conn.closed
            and conn.error is None
            and not parser.take_body()
        )
        conn.let_go()
        if reusable and not (self._scope is not None and self._scope.cancelled):
            # Checked after the registration ended: a cut that ran before it
            # may have shut the socket; one that comes later cannot reach it.
            self._client._give_back(conn)
        else:
            conn.discard()

    async def __aenter__(self) -> AsyncH1Response:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()


def _connection_ended(
    conn: _Connection, parser: ResponseParser, scope: InterruptScope | None
) -> None:
    """The connection ended before the body did: raise why, or end a body read to the close.

    A cut reads as the end: it raises ``Interrupted``; a failed connection
    its error; a body cut short ``httpx.RemoteProtocolError``.
    """
    raise_if_cut(scope)
    _raise_for(conn)
    try:
        parser.feed_eof()
    except ResponseProtocolError as exc:
        raise httpx.RemoteProtocolError(str(exc)) from None


def _raise_for(conn: _Connection) -> None:
    error = conn.error
    if error is None:
        return
    if isinstance(error, httpx.HTTPError):
        raise error
    raise httpx.ReadError(f"reading the response failed: {error}") from error


class AsyncH1Client:
    """HTTP/1.1 requests to the server of ``url`` (``http://`` or ``https://``), pooled.

    ``connect_timeout`` bounds one connect (and TLS handshake);
    ``keepalive_expiry`` closes a connection idle that long; ``max_idle``
    bounds the idle connections kept; ``ssl_context`` is for ``https``
    (default: the system's trust store). Not thread-safe: event loop only.

    Cancellation: see the module docstring. ``aclose()`` closes the idle
    connections; a response still open keeps its connection until it is
    closed, which then closes it.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float = 5.0,
        keepalive_expiry: float = 2.0,
        max_idle: int = 1024,
        max_head_bytes: int = MAX_HEAD_BYTES,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"AsyncH1Client needs an http:// or https:// URL, not {url!r}")
        for name, value in (
            ("connect_timeout", connect_timeout),
            ("keepalive_expiry", keepalive_expiry),
        ):
            if not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds > 0, not {value!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        default = parts.port is None
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host_field = _checked(
            (host if default else f"{host}:{self.port}").encode("idna"), "Host"
        )
        self._connect_timeout = connect_timeout
        self._expiry = keepalive_expiry
        self._max_idle = max_idle
        self._max_head = max_head_bytes
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self._ssl = ssl_context or _default_ssl_context()
        self._idle: collections.deque[_Connection] = collections.deque()
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def idle(self) -> int:
        """Idle keep-alive connections held now."""
        return len(self._idle)

    async def send(
        self,
        method: str,
        target: str | bytes,
        headers: Headers = (),
        body: bytes = b"",
        *,
        scope: InterruptScope | None = None,
        on_sent: Callable[[], None] | None = None,
    ) -> AsyncH1Response:
        """Send a request and return once its response head arrived.

        ``target`` is the request target (``/v1/models?x=1``), sent as given:
        quote it first. ``Host`` and ``Content-Length`` are added.
        ``on_sent`` is called when the request was handed to a connected
        socket (the server may have it from then on; a stale pooled
        connection replaced by a new one calls it twice).

        Raises ``httpx.ConnectError`` or ``httpx.ConnectTimeout`` when no
        connection could be made (nothing was sent), ``Interrupted`` when the
        scope cut it (or was cancelled already), ``httpx.RemoteProtocolError``
        or ``httpx.ReadError`` when the server broke off, ``ValueError`` for a
        target or header holding a line break.
        """
        if self._closed:
            raise RuntimeError("the AsyncH1Client was closed: build a new one")
        if scope is not None:
            scope.check()
        request = self._request(method, target, headers, body)
        conn = self._take()
        if conn is not None:
            try:
                return await self._exchange(conn, request, scope, on_sent, reused=True)
            except _NothingCame:
                pass  # Closed by the server as we sent: it never read the request.
        conn = await self._connect(scope)
        try:
            return await self._exchange(conn, request, scope, on_sent, reused=False)
        except _NothingCame:
            raise httpx.RemoteProtocolError(
                "the server closed the connection without sending a response"
            ) from None

    def close(self) -> None:
        """Close the idle connections; later ``send()`` calls fail. Idempotent."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        while self._idle:
            self._idle.pop().discard()

    async def aclose(self) -> None:
        self.close()

    # -- the request ---------------------------------------------------------------

    def _request(self, method: str, target: str | bytes, headers: Headers, body: bytes) -> bytes:
        target_bytes = _checked(_bytes(target), "target")
        if not target_bytes.startswith(b"/") or b" " in target_bytes:
            raise ValueError(f"the request target must start with '/', without spaces: {target!r}")
        lines = [_checked(method.encode("ascii"), "method") + b" " + target_bytes + b" HTTP/1.1"]
        lines.append(b"Host: " + self._host_field)
        for name, value in headers:
            lines.append(
                _checked(_bytes(name), "header name") + b": " + _checked(_bytes(value), "header")
            )
        if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            lines.append(b"Content-Length: %d" % len(body))
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    async def _exchange(
        self,
        conn: _Connection,
        request: bytes,
        scope: InterruptScope | None,
        on_sent: Callable[[], None] | None,
        *,
        reused: bool,
    ) -> AsyncH1Response:
        try:
            if reused:
                conn.hold(scope)  # A new connection was registered before its connect.
            parser = conn.start()
            assert conn.transport is not None
            conn.transport.write(request)
            if on_sent is not None:
                on_sent()
            while not parser.headers_complete:
                if conn.error is not None or conn.closed:
                    raise_if_cut(scope)
                    if reused and not conn.got_any:
                        raise _NothingCame
                    _raise_for(conn)
                    try:
                        parser.feed_eof()
                    except ResponseProtocolError as exc:
                        raise httpx.RemoteProtocolError(str(exc)) from None
                    break
                await conn.wait()
            _raise_for(conn)  # The head arrived, and was too large.
        except BaseException:
            conn.discard()
            raise
        return AsyncH1Response(self, conn, parser, scope)

    # -- connections -----------------------------------------------------------------

    async def _connect(self, scope: InterruptScope | None) -> _Connection:
        loop = asyncio.get_running_loop()
        addresses = await self._resolve(loop)
        failure: OSError | None = None
        for family, kind, proto, address in addresses:
            conn = _Connection(self._max_head)
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.dup = sock.dup()
                conn.hold(scope)  # Registered before the connect: a cut ends the connect too.
                async with asyncio.timeout(self._connect_timeout):
                    await loop.sock_connect(sock, address)
                    await loop.create_connection(
                        _factory(conn),
                        sock=sock,
                        ssl=self._ssl,
                        server_hostname=self.host if self._ssl is not None else None,
                        ssl_handshake_timeout=self._connect_timeout if self._ssl else None,
                    )
            except TimeoutError as exc:
                conn.discard()
                sock.close()
                raise_if_cut(scope, exc)
                raise httpx.ConnectTimeout(
                    f"connecting to {self.host}:{self.port} timed out"
                ) from exc
            except OSError as exc:
                conn.discard()
                sock.close()
                raise_if_cut(scope, exc)
                failure = exc
                continue
            except BaseException:
                conn.discard()
                sock.close()
                raise
            return conn
        raise httpx.ConnectError(f"cannot connect to {self.host}:{self.port}: {failure}")

    async def _resolve(self, loop: asyncio.AbstractEventLoop) -> list[_Address]:
        host = self.host
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, (host, self.port))]
        try:
            found = await loop.getaddrinfo(host, self.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise httpx.ConnectError(f"cannot resolve {host}: {exc}") from exc
        return [
            (family, kind, proto, address)
            for family, kind, proto, _, address in found
            if family in (socket.AF_INET, socket.AF_INET6)
        ]

    def _take(self) -> _Connection | None:
        """The most recently used idle connection that is still open, or None."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
            conn.discard()
        return None

    def _give_back(self, conn: _Connection) -> None:
        if self._closed or len(self._idle) >= self._max_idle:
            conn.discard()
            return
        conn.parser = None
        loop = asyncio.get_running_loop()
        conn.idle_since = loop.time()
        self._idle.append(conn)
        if self._sweep is None:
            self._sweep = loop.call_later(self._expiry, self._expire)

    def _expire(self) -> None:
        """Close the connections idle for ``keepalive_expiry``; come back for the rest."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        idle = self._idle
        while idle and (idle[0].closed or now - idle[0].idle_since >= self._expiry):
            idle.popleft().discard()
        if idle:
            self._sweep = loop.call_at(idle[0].idle_since + self._expiry, self._expire)


def _factory(conn: _Connection) -> Callable[[], _Connection]:
    return lambda: conn


def _default_ssl_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    return context
