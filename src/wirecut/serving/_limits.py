"""Bounds on what a TCP connection may cost a server before and after it speaks.

What uvicorn bounds itself, wirecut sets explicitly (``ConnectionLimits``):
the size of a request head (``h11_max_incomplete_event_size``; the
httptools protocol, which has no such bound, counts it itself), the keep-alive
wait between requests (``timeout_keep_alive``), a WebSocket message
(``ws_max_size``) and the WebSocket keepalive ping (``ws_ping_interval``,
``ws_ping_timeout``). What it does not bound, the protocol classes here add,
as subclasses of uvicorn's h11, httptools and websockets-sansio protocols,
with one ``ConnectionGuard`` per server that sees every connection:

- a connection that does not finish its request head within ``head_timeout``
  is closed: uvicorn arms no timer before the first request, and its
  keep-alive timer is disarmed by the first byte of the next head, so one
  byte every few seconds held a connection forever;
- at most ``max_connections`` are open (lowered to fit the descriptor limit).
  At the cap, a new connection closes the *oldest one that has not sent a
  complete request head*, and is itself closed only when every open
  connection is busy. uvicorn's ``limit_concurrency`` is not used: it answers
  503 to new requests once N connections are open, idle ones included,
  which is exactly how a thousand idle sockets locked out the token holder;
- an HTTP response the client does not read (writes paused) for
  ``send_timeout`` is cut (``abort``);
- a transport that was closed but cannot finish closing (data the peer never
  reads is still buffered: asyncio's ``close()`` waits for it forever) is
  aborted after ``close_timeout``; uvicorn's own closing-handshake bound
  (10 s, not configurable) is set to it too;
- a WebSocket whose app has not accepted it within ``handshake_timeout`` is
  cut; a WebSocket ping arriving while more than ``max_outbox`` bytes wait
  to go out is not answered but cut (uvicorn writes pongs past any bound);
- the WebSocket's ASGI scope gets an extension ``"wirecut.transport"`` with
  ``abort``, for the console to cut a client that stopped reading.

The per-connection outbox bound (``max_outbox``) is the console connection's
(``console/server/_connection.py``). ``raise_descriptor_limit`` lifts the soft
``RLIMIT_NOFILE`` to the hard one at start. Defaults: docs/security.md.

Event loop only: the guard and the protocols belong to the server's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState
from websockets.exceptions import InvalidState

__all__ = [
    "TRANSPORT_EXTENSION",
    "ConnectionGuard",
    "ConnectionLimits",
    "Dropped",
    "GuardedConfig",
    "GuardedH11Protocol",
    "GuardedHttpToolsProtocol",
    "GuardedWebSocketProtocol",
    "descriptor_limit",
    "raise_descriptor_limit",
]

#: The ASGI scope extension of a WebSocket that carries ``{"abort": callable}``.
TRANSPORT_EXTENSION = "wirecut.transport"


@dataclass(frozen=True)
class ConnectionLimits:
    """A server's bounds on connections; the defaults are documented in docs/security.md."""

    #: Open TCP connections at most (lowered to the descriptor limit minus ``fd_reserve``).
    max_connections: int = 512
    #: Descriptors kept free for everything else (the store, provider sockets, processes).
    fd_reserve: int = 128
    #: The listen backlog, which is also how many connections asyncio accepts at
    #: one wake-up before the guard sees any of them: kept below ``fd_reserve``,
    #: or a burst of queued connections passes the cap and accept fails for
    #: want of descriptors (uvicorn's 2048 did, at a 256-descriptor limit).
    accept_backlog: int = 64
    #: Seconds a connection may take to send a complete request head (each one, on keep-alive).
    head_timeout: float = 10.0
    #: Bytes of a request head at most (uvicorn's ``h11_max_incomplete_event_size``).
    max_head: int = 16 * 1024
    #: Seconds an idle keep-alive connection stays open (uvicorn's ``timeout_keep_alive``).
    keep_alive: int = 5
    #: Seconds an HTTP response may wait for a client that does not read it.
    send_timeout: float = 30.0
    #: Seconds from the upgrade request to the app's accept of a WebSocket.
    handshake_timeout: float = 10.0
    #: Seconds a closing connection may wait for its peer (close frame, unread data).
    close_timeout: float = 5.0
    #: Bytes of frames waiting to go out on one console connection; past it, close 4429.
    max_outbox: int = 4 * 1024 * 1024
    #: A WebSocket message larger than this closes the connection (1009).
    ws_max_size: int = 1 << 20
    #: Seconds between WebSocket keepalive pings, and to wait for the pong.
    ws_ping_interval: float = 20.0
    ws_ping_timeout: float = 20.0
    #: Seconds a stopping server waits for its frames to reach slow readers.
    drain_timeout: float = 2.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_head", "max_outbox", "ws_max_size", "keep_alive"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        if self.fd_reserve < 0:
            raise ValueError(f"fd_reserve must be >= 0, not {self.fd_reserve!r}")
        if isinstance(self.accept_backlog, bool) or not isinstance(self.accept_backlog, int):
            raise ValueError(f"accept_backlog must be a whole number, not {self.accept_backlog!r}")
        if not 1 <= self.accept_backlog <= max(1, self.fd_reserve):
            raise ValueError(
                f"accept_backlog must be 1 to fd_reserve ({self.fd_reserve}), "
                f"not {self.accept_backlog!r}"
            )
        for name in (
            "head_timeout",
            "send_timeout",
            "handshake_timeout",
            "close_timeout",
            "ws_ping_interval",
            "ws_ping_timeout",
            "drain_timeout",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value < float("inf")):
                raise ValueError(f"{name} must be a finite number of seconds > 0, not {value!r}")

    def connections_for(self, descriptors: int) -> int:
        """``max_connections``, lowered so that the connections fit in ``descriptors``."""
        return max(1, min(self.max_connections, descriptors - self.fd_reserve))


class Dropped(enum.Enum):
    """Why the guard ended a connection (the label of ``wirecut_connections_dropped_total``)."""

    #: Closed to make room for a new connection at the cap (it had sent no complete head).
    EVICTED = "evicted"
    #: A new connection closed at once: the cap was reached and every connection was busy.
    REFUSED = "refused"
    #: Its request head did not complete within ``head_timeout``.
    HEAD_TIMEOUT = "head_timeout"
    #: Its client did not read a response for ``send_timeout``.
    SEND_TIMEOUT = "send_timeout"
    #: Its WebSocket was not accepted within ``handshake_timeout``.
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    #: It could not finish closing within ``close_timeout`` (aborted).
    CLOSE_TIMEOUT = "close_timeout"
    #: A WebSocket ping came while its unsent bytes were over ``max_outbox``.
    PING_FLOOD = "ping_flood"
    #: A console connection whose outbox passed ``max_outbox`` (close code 4429).
    SLOW_READER = "slow_reader"


class _Guarded(Protocol):
    transport: asyncio.Transport

    def idle(self) -> bool: ...

    def check(self, now: float) -> Dropped | None: ...


def descriptor_limit() -> int:
    """The soft ``RLIMIT_NOFILE`` in force (a large number where there is none)."""
    try:
        import resource
    except ImportError:  # not a POSIX system: no such limit to fit in
        return 1 << 20
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_descriptor_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one; returns the soft limit now in force.

    Call once at start, from the main thread. Where the hard limit cannot be
    reached (it is unlimited, or the platform caps it lower), the soft one is
    left as it was.
    """
    try:
        import resource
    except ImportError:
        return descriptor_limit()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return descriptor_limit()


class ConnectionGuard:
    """Every open connection of one server, oldest first, and the checks on them.

    Event loop only. Protocols call ``opened`` (a new TCP connection),
    ``adopt`` (the same connection, upgraded to a WebSocket) and ``forget``;
    a timer on the loop runs each connection's ``check`` a few times a second
    while any is open.
    """

    def __init__(self, limits: ConnectionLimits, max_connections: int) -> None:
        self.limits = limits
        self.max_connections = max_connections
        #: How many connections the guard ended, by why.
        self.dropped: Counter[Dropped] = Counter()
        # In the order they opened; the value is when its transport was seen closing.
        self._open: dict[_Guarded, float | None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tick = min(
            0.5,
            max(
                0.02,
                min(
                    limits.head_timeout,
                    limits.send_timeout,
                    limits.handshake_timeout,
                    limits.close_timeout,
                )
                / 5,
            ),
        )

    @property
    def open(self) -> int:
        return len(self._open)

    def opened(self, conn: _Guarded) -> bool:
        """Count a new connection; False when it must be closed (the cap, every one busy)."""
        if len(self._open) >= self.max_connections:
            victim = next((c for c in self._open if c.idle() and self._open[c] is None), None)
            if victim is None:
                self.dropped[Dropped.REFUSED] += 1
                return False
            self._drop(victim, Dropped.EVICTED)
        self.adopt(conn)
        return True

    def adopt(self, conn: _Guarded) -> None:
        """Count ``conn`` without checking the cap (it is a connection already counted)."""
        self._open[conn] = None
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._tick, self._check_all)

    def forget(self, conn: _Guarded) -> None:
        """``conn`` is gone (or handed over); idempotent."""
        self._open.pop(conn, None)

    def note(self, why: Dropped) -> None:
        """Count a connection ended elsewhere for ``why`` (the console's slow reader)."""
        self.dropped[why] += 1

    def _drop(self, conn: _Guarded, why: Dropped) -> None:
        self.dropped[why] += 1
        if why is Dropped.EVICTED:
            # Idle: a response it has not read yet may still be buffered, so
            # close (the closing check aborts it if that never drains).
            self._open[conn] = asyncio.get_running_loop().time()
            conn.transport.close()
        else:
            self._open.pop(conn, None)
            conn.transport.abort()  # what it left buffered would hold a close forever

    def _check_all(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for conn, closing_since in list(self._open.items()):
            if conn.transport.is_closing():
                if closing_since is None:
                    self._open[conn] = now
                elif now - closing_since > self.limits.close_timeout:
                    self._drop(conn, Dropped.CLOSE_TIMEOUT)
                continue
            why = conn.check(now)
            if why is not None:
                self._drop(conn, why)
        self._timer = loop.call_later(self._tick, self._check_all) if self._open else None


def _guard_of(config: uvicorn.Config) -> ConnectionGuard:
    guard = getattr(config, "guard", None)
    if not isinstance(guard, ConnectionGuard):
        raise TypeError("the guarded protocols need a GuardedConfig (it carries the guard)")
    return guard


def _require(obj: object, names: tuple[str, ...]) -> None:
    """Raise unless ``obj`` (a guarded protocol, or its class) has every one of ``names``."""
    missing = [name for name in names if not hasattr(obj, name)]
    if missing:
        cls = obj if isinstance(obj, type) else type(obj)
        raise RuntimeError(
            f"{cls.__mro__[1].__name__} has no {', '.join(missing)}: this uvicorn is not "
            "one wirecut was checked against (see pyproject.toml's cap)"
        )


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head deadline, a send bound and the cap."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        _require(self, ("conn", "cycle", "transport", "loop"))
        self._guard = _guard_of(config)
        self._head_deadline = 0.0
        self._paused_since: float | None = None

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        super().connection_made(transport)
        self._head_deadline = self.loop.time() + self._guard.limits.head_timeout
        if not self._guard.opened(self):
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.forget(self)
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        # The next request head gets its own deadline (uvicorn's keep-alive
        # timer is disarmed by its first byte, so it does not bound it).
        self._head_deadline = self.loop.time() + self._guard.limits.head_timeout
        super().on_response_complete()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        # The WebSocket protocol takes this connection over and adopts it.
        self._guard.forget(self)
        super().handle_websocket_upgrade(event)

    def pause_writing(self) -> None:
        self._paused_since = self.loop.time()
        super().pause_writing()

    def resume_writing(self) -> None:
        self._paused_since = None
        super().resume_writing()

    def idle(self) -> bool:
        """True while no request is in progress: no complete head since the last response."""
        return self.cycle is None or self.cycle.response_complete

    def check(self, now: float) -> Dropped | None:
        if self.idle() and now > self._head_deadline:
            return Dropped.HEAD_TIMEOUT
        if self._paused_since is not None and now - self._paused_since > (
            self._guard.limits.send_timeout
        ):
            return Dropped.SEND_TIMEOUT
        return None


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the same bounds as ``GuardedH11Protocol``.

    For a server whose responses are many small pieces (the proxy's
    streams): httptools writes a piece without h11's state machine. llhttp
    does not bound a request head, so the protocol counts it: a head past
    ``max_head`` is answered 431 and the connection closed.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        _require(self, ("cycle", "transport", "loop", "parser"))
        self._guard = _guard_of(config)
        self._head_deadline = 0.0
        self._paused_since: float | None = None
        self._head_bytes = 0  # of the head being read; -1 once it is complete

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        super().connection_made(transport)
        self._head_deadline = self.loop.time() + self._guard.limits.head_timeout
        if not self._guard.opened(self):
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.forget(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        reading_head = self._head_bytes >= 0
        super().data_received(data)
        if reading_head and self._head_bytes >= 0:
            self._head_bytes += len(data)
            if self._head_bytes > self._guard.limits.max_head and not self.transport.is_closing():
                self._refuse_head()

    def on_message_begin(self) -> None:
        self._head_bytes = 0
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._head_bytes = -1
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        # The next request head gets its own deadline and its own count.
        self._head_deadline = self.loop.time() + self._guard.limits.head_timeout
        self._head_bytes = 0
        super().on_response_complete()

    def handle_websocket_upgrade(self) -> None:
        # The WebSocket protocol takes this connection over and adopts it.
        self._guard.forget(self)
        super().handle_websocket_upgrade()

    def pause_writing(self) -> None:
        self._paused_since = self.loop.time()
        super().pause_writing()

    def resume_writing(self) -> None:
        self._paused_since = None
        super().resume_writing()

    def idle(self) -> bool:
        """True while no request is in progress: no complete head since the last response."""
        return self.cycle is None or self.cycle.response_complete

    def check(self, now: float) -> Dropped | None:
        if self.idle() and now > self._head_deadline:
            return Dropped.HEAD_TIMEOUT
        if self._paused_since is not None and now - self._paused_since > (
            self._guard.limits.send_timeout
        ):
            return Dropped.SEND_TIMEOUT
        return None

    def _refuse_head(self) -> None:
        message = b"the request head is too large"
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(message), message)
        )
        self.transport.close()


class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol with a handshake bound, a pong bound and ``abort``."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        _require(self, ("handshake_complete", "close_timeout", "transport", "loop", "writable"))
        self._guard = _guard_of(config)
        # uvicorn's bound on the closing handshake (10 s, no setting for it).
        self.close_timeout = self._guard.limits.close_timeout
        self._opened_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._opened_at = self.loop.time()
        self._guard.adopt(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.forget(self)
        super().connection_lost(exc)

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if isinstance(scope, dict):  # None when the handshake was refused
            scope.setdefault("extensions", {})[TRANSPORT_EXTENSION] = {
                "abort": self.transport.abort,
                # False while the transport is paused: the peer took nothing of
                # what was written lately (uvicorn's own flow-control event).
                "writable": self.writable.is_set,
            }

    def shutdown(self) -> None:
        """uvicorn's shutdown of this connection (close 1012), also when the client began closing.

        A client whose close frame came just before the server stopped left
        the connection CLOSING (its transport still flushing): websockets then
        refuses a close of ours with ``InvalidState``, which uvicorn let out of
        the server's shutdown, and ``wirecut serve`` ended on SIGTERM with a
        traceback and exit 1. The closing handshake is under way already:
        the transport is closed, as uvicorn does after its own close frame.
        """
        try:
            super().shutdown()
        except InvalidState:
            self.transport.close()

    def handle_ping(self) -> None:
        if self.transport.get_write_buffer_size() > self._guard.limits.max_outbox:
            # The peer pings but reads none of its pongs: answering would buffer without end.
            self._guard.note(Dropped.PING_FLOOD)
            self.transport.abort()
            return
        super().handle_ping()

    def idle(self) -> bool:
        return False  # An accepted WebSocket is authenticated, or closed within milliseconds.

    def check(self, now: float) -> Dropped | None:
        if not self.handshake_complete and now - self._opened_at > (
            self._guard.limits.handshake_timeout
        ):
            return Dropped.HANDSHAKE_TIMEOUT
        return None


class GuardedConfig(uvicorn.Config):
    """uvicorn's ``Config`` with the guarded protocols and the guard they share.

    ``http`` is ``GuardedH11Protocol`` (the default) or ``GuardedHttpToolsProtocol``.
    """

    def __init__(
        self,
        app: Any,
        *,
        guard: ConnectionGuard,
        http: type[GuardedH11Protocol] | type[GuardedHttpToolsProtocol] = GuardedH11Protocol,
        **kwargs: Any,
    ) -> None:
        # Fail at start, not on the first connection, on a uvicorn whose
        # protocols lack what the subclasses override.
        _require(
            GuardedH11Protocol,
            ("on_response_complete", "handle_websocket_upgrade", "pause_writing"),
        )
        _require(
            GuardedHttpToolsProtocol,
            (
                "on_response_complete",
                "handle_websocket_upgrade",
                "pause_writing",
                "on_message_begin",
                "on_headers_complete",
            ),
        )
        _require(
            GuardedWebSocketProtocol, ("handle_connect", "handle_ping", "run_asgi", "shutdown")
        )
        self.guard = guard
        limits = guard.limits
        super().__init__(
            app,
            http=http,
            ws=GuardedWebSocketProtocol,
            h11_max_incomplete_event_size=limits.max_head,
            timeout_keep_alive=limits.keep_alive,
            backlog=limits.accept_backlog,
            ws_max_size=limits.ws_max_size,
            ws_ping_interval=limits.ws_ping_interval,
            ws_ping_timeout=limits.ws_ping_timeout,
            # No permessage-deflate: console frames are small JSON, and
            # compressing each one cost the event loop about 20 µs in a
            # burst of cancels, and every connection a zlib context of its
            # own (docs/security.md).
            ws_per_message_deflate=False,
            **kwargs,
        )
