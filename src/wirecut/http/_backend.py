"""A network backend whose sockets register with the scope bound at connect time.

The logic lives in two flavour-free cores, ``ScopedStreamCore`` and
``ScopedBackendCore``, that speak httpcore's backend interface by duck typing.
``ScopedNetworkBackend``/``ScopedNetworkStream`` are the httpcore (1.x) flavour
used by ``wirecut.http``; ``wirecut.adapters`` builds the httpcore2 flavour of
the official openai SDK from the same cores.

The backend makes its own TCP connections (``SocketHold.connect_tcp``: a
connect a cut ends at once) and wraps each connected socket in the flavour's
own ``SyncStream``, so reading, writing and TLS are httpcore's code.

httpcore's sync pool connects and reads in the requesting thread, where the
request's scope is bound: a stream belongs to the scope bound at its connect
and is used by one thread at a time. The scope's cut reaches it from any
thread, and only ever shuts the socket down.

Cancellation: connecting under a cancelled scope raises ``Interrupted``
before anything is resolved or connected. A cut ends a connect, a TLS
handshake, a read or a write at once, and the stream raises
``Interrupted(scope.reason)`` instead of the error the cut produced
(``cut_as_interrupted``). httpcore, httpx and the openai SDK let that
``BaseException`` pass through (the SDK does not retry it), and httpcore
closes a connection whose request ended in an exception, so a cut connection
is never returned to a pool.
"""

from __future__ import annotations

import math
import ssl
import threading
from collections.abc import Iterable
from typing import Any, Generic, Self, TypeVar

import httpcore

from wirecut.http._cut import cut_as_interrupted, raise_if_cut
from wirecut.http._socket_hold import SocketHold
from wirecut.http._thirdparty import HTTPCoreFlavour, httpcore_flavour
from wirecut.scope import InterruptScope, current_scope

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "ScopedBackendCore",
    "ScopedNetworkBackend",
    "ScopedNetworkStream",
    "ScopedStreamCore",
    "check_seconds",
]

#: Upper bound (seconds) on one TCP connect and on one TLS handshake, whatever
#: the request's timeout says (a cut ends either at once; this bounds them
#: where no scope is bound). Name resolution is not covered.
DEFAULT_CONNECT_TIMEOUT = 10.0


def check_seconds(name: str, value: object, *, allow_none: bool = False) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a usable number of seconds.

    Usable: an int or float (not a bool), finite, above 0 and at most
    ``threading.TIMEOUT_MAX``: the longest wait a lock or a socket can do
    here; a longer one fails later with ``OverflowError``, far from its cause.
    """
    if value is None and allow_none:
        return
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= threading.TIMEOUT_MAX
    )
    if not ok:
        bound = f"{threading.TIMEOUT_MAX:.0f}"
        none = " or None" if allow_none else ""
        raise ValueError(
            f"{name} must be a number of seconds above 0 and at most {bound}{none}, not {value!r}"
        )


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
    cutter never races the close.
    """

    def __init__(self, inner: Any, hold: SocketHold, connect_timeout: float | None) -> None:
        self._inner = inner
        self._hold = hold
        self._connect_timeout = connect_timeout
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

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._acquire()
        with cut_as_interrupted(self._hold.scope):
            data: bytes = self._inner.read(max_bytes, timeout)
        if not data:
            raise_if_cut(self._hold.scope)  # A cut reads as EOF: say it was the cut.
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._acquire()
        with cut_as_interrupted(self._hold.scope):
            self._inner.write(buffer, timeout)

    def close(self) -> None:
        self.release()  # Waits for a cut in flight: only then may we close.
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> Self:
        self._acquire()
        # The wrap detaches the plain socket before its handshake (its fd is
        # -1 then: docs/architecture.md, fact 7); the dup keeps the real
        # socket registered through the handshake.
        self._hold.hold_across_wrap(self._inner.get_extra_info("socket"))
        timeout = _bounded(timeout, self._connect_timeout)
        try:
            with cut_as_interrupted(self._hold.scope):
                inner_tls = self._inner.start_tls(ssl_context, server_hostname, timeout)
        except BaseException:
            # The inner stream closed its socket already; close the dup too.
            self._hold.release()
            raise
        try:
            # The registration moves to the TLS socket (and the dup is closed).
            return type(self)(inner_tls, self._hold, self._connect_timeout)
        except BaseException:
            self._hold.release()
            inner_tls.close()
            raise

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


StreamT = TypeVar("StreamT", bound=ScopedStreamCore)


def _bounded(timeout: float | None, bound: float | None) -> float | None:
    if bound is None:
        return timeout
    return bound if timeout is None else min(timeout, bound)


class ScopedBackendCore(Generic[StreamT]):
    """An httpcore network backend that registers each new socket with the bound scope.

    Called by an httpcore sync pool in the requesting thread, where the
    request's scope is bound. A pool must serve one scope only: a stream
    belongs to the scope bound at its connect. ``ScopedTransport`` keeps one
    pool per scope for that reason.

    ``inner`` is the flavour's ``SyncBackend``, used for Unix sockets and,
    with no scope bound, for ``sleep``.

    Cancellation: ``connect_tcp`` raises ``Interrupted`` at once under a
    cancelled scope, so no request, retry or reconnect starts after a cancel,
    and a cut ends a connect in progress at once. Name resolution and a Unix
    socket connect cannot be cut: they are bounded by the resolver's settings
    and by ``connect_timeout`` (docs/cancellation-limits.md). ``sleep``
    (httpcore's pause between connect retries) wakes at once on a cancel.
    """

    def __init__(
        self,
        flavour: HTTPCoreFlavour,
        inner: Any,
        stream_class: type[StreamT],
        connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        check_seconds("connect_timeout", connect_timeout, allow_none=True)
        self._flavour = flavour
        self._inner = inner
        self._stream_class = stream_class
        self.connect_timeout = connect_timeout

    def _timeout(self, timeout: float | None) -> float | None:
        return _bounded(timeout, self.connect_timeout)

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> StreamT:
        hold = SocketHold(current_scope())
        try:
            sock = hold.connect_tcp(
                host,
                port,
                timeout=self._timeout(timeout),
                source_address=None if local_address is None else (local_address, 0),
                socket_options=socket_options,
            )
        except TimeoutError as exc:
            raise self._flavour.connect_timeout(str(exc)) from exc
        except OSError as exc:
            raise self._flavour.connect_error(str(exc)) from exc
        try:
            return self._stream_class(self._flavour.sync_stream(sock), hold, self.connect_timeout)
        except BaseException:
            hold.release()
            sock.close()
            raise

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> StreamT:
        scope = current_scope()
        if scope is not None:
            # A Unix socket connect cannot be waited on (a full backlog fails
            # a non-blocking one at once): refuse it here, bound it below.
            scope.check()
        stream = self._inner.connect_unix_socket(
            path, timeout=self._timeout(timeout), socket_options=socket_options
        )
        try:
            return self._stream_class(stream, SocketHold(scope), self.connect_timeout)
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
    """The httpcore (1.x) flavour of ``ScopedBackendCore``; see there for cancellation."""

    def __init__(self, *, connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT) -> None:
        super().__init__(
            httpcore_flavour(httpcore), httpcore.SyncBackend(), ScopedNetworkStream, connect_timeout
        )
