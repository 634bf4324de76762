"""``ScopedHTTPAdapter``: a requests adapter whose connections register with the bound scope.

Mount it on a ``requests.Session`` (``session.mount("http://", ScopedHTTPAdapter())``
and the same for "https://"). Like ``wirecut.http``, it keeps one urllib3 pool
manager (one inner ``HTTPAdapter``) per scope, so a connection never serves
two scopes, and registers a connection's socket with its scope from the
connect (``SocketHold``) while a request uses it. A request runs in the calling
thread, with its scope bound.

Cancellation: under a cancelled scope ``send()`` raises ``Interrupted``
before any connection is opened or reused. A cut shuts the socket down: a
request blocked on the response headers raises ``Interrupted``. A body read
after ``send()`` returned (``stream=True``, or requests reading ``.content``)
wakes at once too, but surfaces as requests' own ``ConnectionError`` or
``ChunkedEncodingError``: requests reads the body outside the adapter. urllib3
retries configured with ``max_retries`` stop at the next connect, which raises
``Interrupted``.

A limit: when a response says ``Connection: close``, http.client closes the
socket while the body is read, and the registration is released only when the
connection goes back to the pool, right after. The cut of a closed socket
object fails harmlessly (EBADF).
"""

from __future__ import annotations

import socket
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.poolmanager import PoolManager

from wirecut.http import DEFAULT_CONNECT_TIMEOUT, PerScope, SocketHold, raise_if_cancelled
from wirecut.scope import current_scope

__all__ = ["ScopedHTTPAdapter"]


class _RegisteringConnection:
    """Mixin for urllib3 connections: hold the socket's registration with the scope."""

    sock: socket.socket | None
    timeout: Any
    wirecut_connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT
    _wirecut_hold: SocketHold | None = None

    def _new_conn(self) -> socket.socket:
        scope = current_scope()
        if scope is not None:
            scope.check()
        self._wirecut_hold = SocketHold(scope)
        original = self.timeout
        bound = self.wirecut_connect_timeout
        if bound is not None and not (isinstance(original, int | float) and original <= bound):
            # The connect cannot be cut (no socket to register yet): bound it.
            self.timeout = bound
        try:
            sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        except Exception as exc:
            raise_if_cancelled(scope, exc)
            raise
        finally:
            self.timeout = original
        try:
            self._wirecut_hold.hold(sock)
        except BaseException:
            sock.close()  # Cancelled during the connect: cut on entry, ours to close.
            raise
        return sock

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        # HTTPS: the TLS wrap replaced (detached) the plain socket.
        self.wirecut_acquire()

    def wirecut_acquire(self) -> None:
        """Register the current socket, if any (a pooled connection taken again)."""
        if self._wirecut_hold is not None and self.sock is not None:
            self._wirecut_hold.hold(self.sock)

    def wirecut_release(self) -> None:
        if self._wirecut_hold is not None:
            self._wirecut_hold.release()

    def close(self) -> None:
        sock = self.sock
        # http.client's close() of a socket that a response still reads from
        # only drops a reference; then the registration stays until release.
        if sock is None or getattr(sock, "_io_refs", 0) == 0:
            self.wirecut_release()  # Before the close: waits for a cut in flight.
        super().close()  # type: ignore[misc]


class _ScopedHTTPConnection(_RegisteringConnection, HTTPConnection):
    pass


class _ScopedHTTPSConnection(_RegisteringConnection, HTTPSConnection):
    pass


class _ReleasingPool:
    """Mixin for urllib3 pools: release a connection's registration while it idles."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        conn.wirecut_acquire()
        return conn

    def _put_conn(self, conn: Any) -> None:
        if conn is not None:
            conn.wirecut_release()
        super()._put_conn(conn)  # type: ignore[misc]


class _ScopedHTTPConnectionPool(_ReleasingPool, HTTPConnectionPool):
    ConnectionCls = _ScopedHTTPConnection


class _ScopedHTTPSConnectionPool(_ReleasingPool, HTTPSConnectionPool):
    ConnectionCls = _ScopedHTTPSConnection


_POOL_CLASSES = {"http": _ScopedHTTPConnectionPool, "https": _ScopedHTTPSConnectionPool}


class _RegisteringAdapter(HTTPAdapter):
    """An ordinary adapter whose pool managers make registering connections."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOL_CLASSES)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> PoolManager:
        manager: PoolManager = super().proxy_manager_for(proxy, **proxy_kwargs)
        manager.pool_classes_by_scheme = dict(_POOL_CLASSES)
        return manager


class ScopedHTTPAdapter(HTTPAdapter):
    """A ``requests`` ``HTTPAdapter`` that is cut with the scope bound in the calling thread.

    Takes the arguments of ``HTTPAdapter`` (``pool_connections``,
    ``pool_maxsize``, ``max_retries``, ``pool_block``). Safe to share between
    threads and scopes; see the module docstring for cancellation.
    """

    def __init__(self, **adapter_kwargs: Any) -> None:
        super().__init__(**adapter_kwargs)
        self._adapter_kwargs = adapter_kwargs
        self._adapters: PerScope[_RegisteringAdapter] = PerScope(
            lambda: _RegisteringAdapter(**self._adapter_kwargs), what="adapter"
        )

    def send(
        self, request: requests.PreparedRequest, *args: Any, **kwargs: Any
    ) -> requests.Response:
        scope = current_scope()
        if scope is not None:
            scope.check()
        adapter = self._adapters.get(scope)
        try:
            return adapter.send(request, *args, **kwargs)
        except Exception as exc:
            raise_if_cancelled(scope, exc)
            raise

    def close(self) -> None:
        self._adapters.close()
        super().close()
