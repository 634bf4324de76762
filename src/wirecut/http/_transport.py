"""``ScopedTransport``: an httpx transport whose requests are cut with their scope.

How it keeps scopes apart: one ordinary ``httpx.HTTPTransport`` (one httpcore
connection pool) per scope, made on the scope's first request and closed when
the scope is collected or the transport closed, plus one for requests made
with no scope bound (``PerScope``). A connection therefore only ever serves
the scope it was opened under, and cutting scope A cannot touch a response of
scope B on the same client (urllib3 #3581). Each pool's network backend is a
``ScopedNetworkBackend``: its sockets register with the scope while a request
uses them (see ``_backend``). A cut connection is closed by httpcore (its
response ended in an exception) and never goes back to a pool.

The core (``ScopedTransportCore``) is flavour-free; ``ScopedTransport`` is the
httpx flavour and ``wirecut.adapters`` makes the httpx2 one for the openai SDK.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx

from wirecut.http._backend import DEFAULT_CONNECT_TIMEOUT, ScopedNetworkBackend, ScopedStreamCore
from wirecut.http._per_scope import PerScope
from wirecut.scope import current_scope

__all__ = ["ReleasingStreamCore", "ScopedTransport", "ScopedTransportCore", "client"]


class ReleasingStreamCore:
    """A response body that releases its connection's registration when closed.

    The release comes before the inner close, which is when an HTTP/1.1
    connection goes back to its pool: from then on another request (of the
    same scope) may take it, and registers it again.
    """

    def __init__(self, inner: Any, network_stream: ScopedStreamCore) -> None:
        self._inner = inner
        self._network_stream = network_stream

    def __iter__(self) -> Iterator[bytes]:
        yield from self._inner

    def close(self) -> None:
        self._network_stream.release()
        self._inner.close()


class ScopedTransportCore:
    """Route each request to its scope's pool; see the module docstring.

    ``handle_request`` runs in the requesting thread, with the request's scope
    bound. Safe to share one transport between threads and scopes.

    Cancellation: under a cancelled scope a request raises ``Interrupted``
    before anything is sent. While it runs, a cut wakes whatever it is blocked
    in (the response headers, a body read, a stream) with ``Interrupted``.
    """

    def __init__(self, transport_kwargs: dict[str, Any], connect_timeout: float | None) -> None:
        if transport_kwargs.get("http2"):
            # An HTTP/2 connection multiplexes requests: releasing it after
            # one response would drop the registration of the others.
            raise ValueError("a scoped transport speaks HTTP/1.1 only: http2 must be False")
        self._transport_kwargs = transport_kwargs
        self._connect_timeout = connect_timeout
        self._pools: PerScope[Any] = PerScope(self._new_transport)

    def _new_transport(self) -> Any:
        raise NotImplementedError

    def _releasing_stream(self, inner: Any, network_stream: ScopedStreamCore) -> Any:
        raise NotImplementedError

    def handle_request(self, request: Any) -> Any:
        scope = current_scope()
        if scope is not None:
            scope.check()
        response = self._pools.get(scope).handle_request(request)
        network_stream = response.extensions.get("network_stream")
        if isinstance(network_stream, ScopedStreamCore):
            response.stream = self._releasing_stream(response.stream, network_stream)
        return response

    def close(self) -> None:
        self._pools.close()


class _ReleasingStream(ReleasingStreamCore, httpx.SyncByteStream):
    pass


class ScopedTransport(ScopedTransportCore, httpx.BaseTransport):
    """An ``httpx.BaseTransport`` whose connections register with the bound scope.

    Takes the keyword arguments of ``httpx.HTTPTransport`` (``verify``,
    ``limits``, ``retries``, ``proxy`` ...; ``http2`` must stay False), plus
    ``connect_timeout``: the upper bound on one TCP connect, which a cut cannot
    reach. Use it as ``httpx.Client(transport=ScopedTransport())``, or call
    ``wirecut.http.client()``. Safe to share between threads and scopes.

    Cancellation: under a cancelled scope a request raises ``Interrupted``
    before a connection is opened or reused. A cut wakes a request blocked on
    the response headers, a body read or a stream at once, with
    ``Interrupted``; the server sees the connection close. With no scope bound
    it is a plain httpx transport.
    """

    def __init__(
        self, *, connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT, **transport_kwargs: Any
    ) -> None:
        self._backend = ScopedNetworkBackend(connect_timeout=connect_timeout)
        super().__init__(transport_kwargs, connect_timeout)

    def _new_transport(self) -> httpx.HTTPTransport:
        transport = httpx.HTTPTransport(**self._transport_kwargs)
        # httpx does not take a network backend: set it on the pool it made
        # (ConnectionPool and the proxy pools all keep it there).
        transport._pool._network_backend = self._backend
        return transport

    def _releasing_stream(self, inner: Any, network_stream: ScopedStreamCore) -> Any:
        return _ReleasingStream(inner, network_stream)


def client(
    *, connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT, **client_kwargs: Any
) -> httpx.Client:
    """An ``httpx.Client`` on a ``ScopedTransport`` (see there for cancellation).

    ``client_kwargs`` go to ``httpx.Client`` (``base_url``, ``timeout``,
    ``headers`` ...). Transport options go through ``transport=ScopedTransport(...)``.
    """
    transport = client_kwargs.pop("transport", None) or ScopedTransport(
        connect_timeout=connect_timeout
    )
    return httpx.Client(transport=transport, **client_kwargs)
