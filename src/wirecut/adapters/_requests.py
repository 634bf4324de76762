"""``ScopedHTTPAdapter``: a requests adapter whose connections register with the bound scope.

Mount it on a ``requests.Session`` (``session.mount("http://", ScopedHTTPAdapter())``
and the same for "https://"). Like ``wirecut.http``, it keeps one urllib3 pool
manager (one inner ``HTTPAdapter``) per scope (``PerScope``, which also closes
a cancelled or idle scope's connections), so a connection never serves two
scopes, and registers a connection's socket with its scope (``SocketHold``)
from the connect on: the connect and the TLS handshake are cut like the rest.
A request runs in the calling thread, with its scope bound.

Cancellation: under a cancelled scope ``send()`` raises ``Interrupted``
before any connection is opened or reused. A cut shuts the socket down: a
request blocked in the connect, the TLS handshake or the response headers
raises ``Interrupted``. A body read after ``send()`` returned
(``stream=True``, or requests reading ``.content``) wakes at once too, but
surfaces as requests' own ``ConnectionError`` or ``ChunkedEncodingError``:
requests reads the body outside the adapter. urllib3 retries configured with
``max_retries`` stop at the next connect, which raises ``Interrupted``.

A limit: when a response says ``Connection: close``, http.client closes the
socket while the body is read, and the registration is released only when the
connection goes back to the pool, right after. The cut of a closed socket
object does nothing.

urllib3's ``_new_conn``, ``_get_conn`` and ``_put_conn`` are private: they are
checked at import (``require_private``), and pyproject caps urllib3's major.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.poolmanager import PoolManager

from wirecut.http import DEFAULT_CONNECT_TIMEOUT, cut_as_interrupted
from wirecut.http._core import PerScope, SocketHold, require_private, socket_io_refs
from wirecut.scope import current_scope

__all__ = ["ScopedHTTPAdapter"]

require_private(HTTPConnection, ("_new_conn",), "urllib3")
require_private(HTTPConnectionPool, ("_get_conn", "_put_conn"), "urllib3")

#: Seconds an idle scope's pools are kept (httpx's keep-alive expiry).
IDLE_EXPIRY = 5.0


class _RegisteringConnection:
    """Mixin for urllib3 connections: hold the socket's registration with the scope."""

    sock: socket.socket | None
    timeout: Any
    host: str
    port: int
    source_address: tuple[str, int] | None
    socket_options: Any
    wirecut_connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT
    #: HTTPS: ``connect()`` wraps the plain socket, which detaches it.
    wirecut_tls = False
    _wirecut_hold: SocketHold | None = None

    def _wirecut_timeout(self) -> float | None:
        timeout: float | None = self.timeout
        if not isinstance(timeout, int | float):  # None, or urllib3's "socket default"
            timeout = socket.getdefaulttimeout()
        bound = self.wirecut_connect_timeout
        if bound is not None and (timeout is None or timeout > bound):
            timeout = bound
        return timeout

    def _new_conn(self) -> socket.socket:
        # urllib3's own _new_conn, on a connect that a cut ends at once.
        hold = self._wirecut_hold = SocketHold(current_scope())
        timeout = self._wirecut_timeout()
        try:
            sock = hold.connect_tcp(
                self.host,
                self.port,
                timeout=timeout,
                source_address=self.source_address,
                socket_options=self.socket_options,
                nodelay=False,  # urllib3 sets TCP_NODELAY through socket_options.
            )
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc  # type: ignore[arg-type]
        except TimeoutError as exc:
            raise ConnectTimeoutError(
                self, f"Connection to {self.host} timed out. (connect timeout={timeout})"
            ) from exc
        except OSError as exc:
            raise NewConnectionError(
                self,  # type: ignore[arg-type]
                f"Failed to establish a new connection: {exc}",
            ) from exc
        sys.audit("http.client.connect", self, self.host, self.port)
        sock.settimeout(timeout)  # As urllib3 leaves it: a TLS handshake runs with it.
        if self.wirecut_tls:
            hold.hold_across_wrap(sock)  # The wrap in connect() detaches sock.
        return sock

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        # HTTPS: the registration moves to the TLS socket.
        self.wirecut_acquire()

    def wirecut_acquire(self) -> None:
        """Register the current socket, if any (a pooled connection taken again)."""
        # Through an HTTPS proxy, ``sock`` is urllib3's SSLTransport, not a
        # socket: the dup of the connect stays registered then.
        if self._wirecut_hold is not None and isinstance(self.sock, socket.socket):
            self._wirecut_hold.hold(self.sock)

    def wirecut_release(self) -> None:
        if self._wirecut_hold is not None:
            self._wirecut_hold.release()

    def close(self) -> None:
        sock = self.sock
        # http.client's close() of a socket that a response still reads from
        # only drops a reference; then the registration stays until release.
        if not isinstance(sock, socket.socket) or socket_io_refs(sock) == 0:
            self.wirecut_release()  # Before the close: waits for a cut in flight.
        super().close()  # type: ignore[misc]


class _ScopedHTTPConnection(_RegisteringConnection, HTTPConnection):
    pass


class _ScopedHTTPSConnection(_RegisteringConnection, HTTPSConnection):
    wirecut_tls = True


class _ReleasingPool:
    """Mixin for urllib3 pools: release a connection's registration while it idles."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        try:
            conn.wirecut_acquire()  # On a cancelled scope: shut down, Interrupted.
        except BaseException:
            conn.close()  # urlopen never saw it: ours to close.
            raise
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
            lambda: _RegisteringAdapter(**self._adapter_kwargs),
            what="adapter",
            idle_expiry=IDLE_EXPIRY,
        )

    def send(
        self, request: requests.PreparedRequest, *args: Any, **kwargs: Any
    ) -> requests.Response:
        scope = current_scope()
        lease = self._adapters.enter(scope)
        try:
            with cut_as_interrupted(scope):
                response: requests.Response = lease.resource.send(request, *args, **kwargs)
        finally:
            # A body still being read is safe: closing a urllib3 pool closes
            # its idle connections only, and one returned later is closed then.
            self._adapters.leave(lease)
        return response

    def close(self) -> None:
        self._adapters.close()
        super().close()
