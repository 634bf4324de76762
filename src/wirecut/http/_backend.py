"""A network backend whose sockets register with the scope bound at connect time.

The logic lives in two flavour-free cores, ``ScopedStreamCore`` and
``ScopedBackendCore``, that wrap an httpcore ``SyncBackend`` and its streams by
duck typing. ``ScopedNetworkBackend``/``ScopedNetworkStream`` are the httpcore
(1.x) flavour used by ``wirecut.http``; ``wirecut.adapters`` builds the
httpcore2 flavour of the official openai SDK from the same cores.

A stream is used by one thread at a time, the thread that runs the request
(httpcore's sync pool connects and reads in the caller's thread, DESIGN fact 7);
the scope's cut reaches it from any thread, and only ever shuts the socket down.

Cancellation: connecting under a cancelled scope raises ``Interrupted`` before
any connect. A cut shuts the registered socket down, which wakes a blocked
read or write at once; the stream then raises ``Interrupted(scope.reason)``
instead of the ``b""``/``OSError`` the cut produced. This is the one place
where a cut becomes ``Interrupted`` for every client built on these cores:
httpcore, httpx and the openai SDK let a ``BaseException`` raised here pass
through untouched (and the SDK does not retry it, DESIGN fact 6), and httpcore
closes a connection whose response ended in an exception, so a cut connection
is never returned to a pool.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any, Generic, Self, TypeVar

import httpcore

from wirecut.http._socket_hold import SocketHold, raise_if_cancelled
from wirecut.scope import InterruptScope, current_scope

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "ScopedBackendCore",
    "ScopedNetworkBackend",
    "ScopedNetworkStream",
    "ScopedStreamCore",
]

#: Upper bound (seconds) on one ``connect()``: it runs before the socket can
#: be registered, so a cut cannot reach it (DESIGN fact 7).
DEFAULT_CONNECT_TIMEOUT = 10.0


class ScopedStreamCore:
    """An httpcore network stream whose socket is registered with a scope while in use.

    The scope is the one bound when the connection was opened. The socket is
    registered from the connect until the response that used it is released
    (``release()``, called by the transport before the connection goes back to
    its pool), and again as soon as a later request reads or writes: an idle
    pooled connection is not work the scope owns, so it does not count in
    ``scope.live()``, and a cut does not touch it.

    Only the thread using the connection calls the methods; ``close()``
    unregisters first (waiting for a cut in flight) and then closes, so the
    cutter never races the close (DESIGN fact 3).
    """

    def __init__(self, inner: Any, scope: InterruptScope | None) -> None:
        self._inner = inner
        self._hold = SocketHold(scope)
        self._acquire()

    @property
    def scope(self) -> InterruptScope | None:
        """The scope this connection belongs to (None: no scope was bound)."""
        return self._hold.scope

    @property
    def registered(self) -> bool:
        """True while the socket is registered with the scope."""
        return self._hold.registered

    def _acquire(self) -> None:
        # On a cancelled scope this shuts the socket down and raises.
        self._hold.hold(self._inner.get_extra_info("socket"))

    def release(self) -> None:
        """Unregister the socket; the next read or write registers it again."""
        self._hold.release()

    def _cut(self, exc: BaseException | None) -> None:
        self._hold.raise_if_cut(exc)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._acquire()
        try:
            data: bytes = self._inner.read(max_bytes, timeout)
        except Exception as exc:
            self._cut(exc)
            raise
        if not data:
            self._cut(None)  # A cut reads as EOF: say it was the cut.
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._acquire()
        try:
            self._inner.write(buffer, timeout)
        except Exception as exc:
            self._cut(exc)
            raise

    def close(self) -> None:
        self.release()  # Waits for a cut in flight: only then may we close.
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> Self:
        # The plain socket stays registered through the handshake, so a cut
        # reaches it there too.
        try:
            inner_tls = self._inner.start_tls(ssl_context, server_hostname, timeout)
        except Exception as exc:
            # The inner stream closed its socket already: drop our hold on it.
            self.release()
            self._cut(exc)
            raise
        except BaseException:
            self.release()
            raise
        # The wrap detached the plain socket (its fd is -1 now): the
        # registration moves to the TLS socket, registered before the plain
        # one is released so that a cancel in between cannot miss both.
        try:
            tls = type(self)(inner_tls, self.scope)
        except BaseException:
            self.release()
            inner_tls.close()
            raise
        self.release()
        return tls

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


StreamT = TypeVar("StreamT", bound=ScopedStreamCore)


class ScopedBackendCore(Generic[StreamT]):
    """An httpcore network backend that registers each new socket with the bound scope.

    Called by an httpcore sync pool in the requesting thread, where the
    request's scope is bound (DESIGN fact 7). A pool must serve one scope
    only: a stream belongs to the scope bound at its connect.
    ``ScopedTransport`` keeps one pool per scope for that reason.

    Cancellation: ``connect_*`` raises ``Interrupted`` at once under a
    cancelled scope, so no request, retry or reconnect starts after a cancel.
    The connect itself cannot be cut (no socket to register yet): it is
    bounded by ``connect_timeout``, and a cancel during it is seen when the
    new socket registers. ``sleep`` (httpcore's pause between connect retries)
    wakes at once on a cancel.
    """

    def __init__(
        self,
        inner: Any,
        stream_class: type[StreamT],
        connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        if connect_timeout is not None and not connect_timeout > 0:
            raise ValueError(
                f"connect_timeout must be > 0 seconds or None, not {connect_timeout!r}"
            )
        self._inner = inner
        self._stream_class = stream_class
        self.connect_timeout = connect_timeout

    def _timeout(self, timeout: float | None) -> float | None:
        if self.connect_timeout is None:
            return timeout
        return self.connect_timeout if timeout is None else min(timeout, self.connect_timeout)

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> StreamT:
        return self._connect(
            self._inner.connect_tcp,
            host,
            port,
            timeout=self._timeout(timeout),
            local_address=local_address,
            socket_options=socket_options,
        )

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> StreamT:
        return self._connect(
            self._inner.connect_unix_socket,
            path,
            timeout=self._timeout(timeout),
            socket_options=socket_options,
        )

    def _connect(self, connect: Any, *args: Any, **kwargs: Any) -> StreamT:
        scope = current_scope()
        if scope is not None:
            scope.check()
        try:
            stream = connect(*args, **kwargs)
        except Exception as exc:
            raise_if_cancelled(scope, exc)
            raise
        try:
            return self._stream_class(stream, scope)
        except BaseException:
            stream.close()  # Cancelled during the connect: cut on entry, ours to close.
            raise

    def sleep(self, seconds: float) -> None:
        scope = current_scope()
        if scope is None:
            self._inner.sleep(seconds)
        else:
            scope.sleep(seconds)


class ScopedNetworkStream(ScopedStreamCore, httpcore.NetworkStream):
    """The httpcore (1.x) flavour of ``ScopedStreamCore``."""


class ScopedNetworkBackend(ScopedBackendCore[ScopedNetworkStream], httpcore.NetworkBackend):
    """The httpcore (1.x) flavour of ``ScopedBackendCore``, over ``httpcore.SyncBackend``."""

    def __init__(self, *, connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT) -> None:
        super().__init__(httpcore.SyncBackend(), ScopedNetworkStream, connect_timeout)
