"""``ScopedTransport``: an httpx transport whose requests are cut with their scope.

How it keeps scopes apart: one ordinary ``httpx.HTTPTransport`` (one httpcore
connection pool) per scope, made on the scope's first request, plus one for
requests made with no scope bound (``PerScope``, which also closes a scope's
idle connections once the scope is cancelled or idle). A connection therefore
only ever serves the scope it was opened under, and cutting scope A cannot
touch a response of scope B on the same client (urllib3 #3581). Each pool's
network backend is a ``ScopedNetworkBackend``: its sockets register with the
scope while a request uses them (see ``_backend``). A cut connection is closed
by httpcore (its response ended in an exception) and never goes back to a pool.

The expensive part of a pool, its SSL context, is made once per process and
configuration (``shared_ssl_context``), so a new scope's pool costs tens of
microseconds, not the 16-20 ms of loading the certificate store.

The core (``ScopedTransportCore``) is flavour-free; ``ScopedTransport`` is the
httpx flavour and ``wirecut.adapters`` makes the httpx2 one for the openai SDK.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import httpx

from wirecut.http._backend import (
    DEFAULT_CONNECT_TIMEOUT,
    ScopedBackendCore,
    ScopedNetworkBackend,
    ScopedStreamCore,
)
from wirecut.http._per_scope import Lease, PerScope
from wirecut.http._thirdparty import install_network_backend, shared_ssl_context
from wirecut.scope import current_scope

__all__ = [
    "DEFAULT_IDLE_EXPIRY",
    "ReleasingStreamCore",
    "ScopedTransport",
    "ScopedTransportCore",
    "client",
    "scoped_client",
]

#: Seconds an idle scoped pool is kept when ``limits`` does not say (httpx's default).
DEFAULT_IDLE_EXPIRY = 5.0

#: ``httpx.Client`` keywords that configure the transport: they go to the
#: scoped transport, where the client would otherwise build a plain one.
TRANSPORT_KEYWORDS = ("verify", "cert", "http1", "http2", "limits", "proxy")


class ReleasingStreamCore:
    """A response body that releases its connection's registration when closed.

    The release comes before the inner close, which is when an HTTP/1.1
    connection goes back to its pool: from then on another request (of the
    same scope) may take it, and registers it again. After the inner close,
    the request is no longer in flight for its pool (``PerScope.leave``).

    Closed, it lets go of the body below it too. httpx's ``Response`` and
    the stream it wraps around this one name each other, a cycle that only
    the cycle collector frees; holding on, this body kept the connection,
    its socket and its scope's pool in that cycle (75 objects a cut stream),
    freed by a full collection: tens of milliseconds on the event loop, in
    the middle of a burst of cancels.
    """

    def __init__(
        self,
        inner: Any,
        network_stream: ScopedStreamCore | None,
        lease: Lease[Any],
        done: Callable[[Lease[Any]], None],
    ) -> None:
        self._inner = inner
        self._network_stream = network_stream
        self._lease: Lease[Any] | None = lease
        self._done = done  # PerScope.leave

    def __iter__(self) -> Iterator[bytes]:
        yield from self._inner

    def close(self) -> None:
        lease, self._lease = self._lease, None
        inner, self._inner = self._inner, _CLOSED
        network_stream, self._network_stream = self._network_stream, None
        try:
            if network_stream is not None:
                network_stream.release()
            inner.close()
        finally:
            if lease is not None:
                self._done(lease)


class _ClosedBody:
    """What a closed ``ReleasingStreamCore`` holds instead of its body: nothing to read."""

    def __iter__(self) -> Iterator[bytes]:
        return iter(())

    def close(self) -> None:
        pass


_CLOSED = _ClosedBody()


class ScopedTransportCore:
    """Route each request to its scope's pool; see the module docstring.

    ``handle_request`` runs in the requesting thread, with the request's scope
    bound. Safe to share one transport between threads and scopes.

    A flavour sets ``releasing_stream`` to its ``ReleasingStreamCore`` that
    is also its library's ``SyncByteStream``.

    Cancellation: under a cancelled scope a request raises ``Interrupted``
    before anything is resolved, connected or sent (a pooled connection
    refuses to register, a new one to connect). While it runs, a cut wakes
    whatever it is blocked in (the connect, the TLS handshake, the response
    headers, a body read) with ``Interrupted``.
    """

    releasing_stream: type[ReleasingStreamCore]

    def __init__(
        self,
        httpx_module: ModuleType,
        backend: ScopedBackendCore[Any],
        transport_kwargs: dict[str, Any],
    ) -> None:
        if transport_kwargs.get("http2"):
            # An HTTP/2 connection multiplexes requests: releasing it after
            # one response would drop the registration of the others.
            raise ValueError("a scoped transport speaks HTTP/1.1 only: http2 must be False")
        kwargs = dict(transport_kwargs)
        kwargs["verify"] = shared_ssl_context(
            httpx_module,
            kwargs.pop("verify", True),
            kwargs.pop("cert", None),
            kwargs.get("trust_env", True),
        )
        self._httpx = httpx_module
        self._backend = backend
        self._transport_kwargs = kwargs
        limits = kwargs.get("limits")
        expiry = DEFAULT_IDLE_EXPIRY if limits is None else limits.keepalive_expiry
        # Checks the backend swap now, not at the first request.
        self._new_transport().close()
        self._pools: PerScope[Any] = PerScope(self._new_transport, idle_expiry=expiry)

    def _new_transport(self) -> Any:
        transport = self._httpx.HTTPTransport(**self._transport_kwargs)
        install_network_backend(transport, self._backend, self._httpx.__name__)
        return transport

    def handle_request(self, request: Any) -> Any:
        lease = self._pools.enter(current_scope())
        try:
            response = lease.resource.handle_request(request)
        except BaseException:
            self._pools.leave(lease)
            raise
        network_stream = response.extensions.get("network_stream")
        if not isinstance(network_stream, ScopedStreamCore):
            network_stream = None
        response.stream = self.releasing_stream(
            response.stream, network_stream, lease, self._pools.leave
        )
        return response

    def close(self) -> None:
        self._pools.close()


class _ReleasingStream(ReleasingStreamCore, httpx.SyncByteStream):
    pass


class ScopedTransport(ScopedTransportCore, httpx.BaseTransport):
    """An ``httpx.BaseTransport`` whose connections register with the bound scope.

    Takes the keyword arguments of ``httpx.HTTPTransport`` (``verify``,
    ``limits``, ``retries``, ``proxy`` ...; ``http2`` must stay False), plus
    ``connect_timeout``: the upper bound on one TCP connect and one TLS
    handshake. Use it as ``httpx.Client(transport=ScopedTransport())``, or
    call ``wirecut.http.client()``. Safe to share between threads and scopes.
    Raises ``RuntimeError`` if the installed httpx/httpcore lack what it relies
    on (``_thirdparty``).

    Cancellation: under a cancelled scope a request raises ``Interrupted``
    before a connection is opened or reused. A cut wakes a request blocked
    in the connect, the TLS handshake, the response headers, a body read or a
    stream at once, with ``Interrupted``; the server sees the connection close.
    A cancelled scope's idle connections are closed too (``PerScope``). With
    no scope bound it is a plain httpx transport.
    """

    releasing_stream = _ReleasingStream

    def __init__(
        self, *, connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT, **transport_kwargs: Any
    ) -> None:
        backend = ScopedNetworkBackend(connect_timeout=connect_timeout)
        super().__init__(httpx, backend, transport_kwargs)


def scoped_client(
    client_class: type[Any],
    transport_class: type[ScopedTransportCore],
    connect_timeout: float | None,
    client_kwargs: dict[str, Any],
) -> Any:
    """Make ``client_class(**client_kwargs)`` on a scoped transport, refusing any bypass.

    The transport keywords of the client (``TRANSPORT_KEYWORDS``) go to a new
    ``transport_class``; a ``transport=`` must be a ``transport_class`` (and
    then takes no transport keyword), and every ``mounts=`` transport must be
    one too. httpx would otherwise build plain transports for them (a
    ``proxy=`` does), and a request through one could not be cut.
    """
    kwargs = dict(client_kwargs)
    given = {key: kwargs.pop(key) for key in TRANSPORT_KEYWORDS if key in kwargs}
    transport = kwargs.pop("transport", None)
    name = transport_class.__name__
    for pattern, mounted in (kwargs.get("mounts") or {}).items():
        if mounted is not None and not isinstance(mounted, transport_class):
            raise ValueError(
                f"mounts[{pattern!r}] is a {type(mounted).__name__}, whose requests a cancel "
                f"could not cut: mount a wirecut {name} instead"
            )
    if transport is None:
        if "trust_env" in kwargs:
            given["trust_env"] = kwargs["trust_env"]
        transport = transport_class(connect_timeout=connect_timeout, **given)  # type: ignore[call-arg]
    elif not isinstance(transport, transport_class):
        raise ValueError(
            f"transport= is a {type(transport).__name__}, whose requests a cancel could "
            f"not cut: pass a wirecut {name}, or leave it out"
        )
    elif given:
        raise ValueError(
            f"{', '.join(given)} would be ignored next to transport=: "
            f"give {'it' if len(given) == 1 else 'them'} to the {name} instead"
        )
    return client_class(transport=transport, **kwargs)


def client(
    *, connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT, **client_kwargs: Any
) -> httpx.Client:
    """An ``httpx.Client`` on a ``ScopedTransport`` (see there for cancellation).

    ``client_kwargs`` go to ``httpx.Client`` (``base_url``, ``timeout``,
    ``headers`` ...), except the transport's own (``verify``, ``cert``,
    ``http1``, ``http2``, ``limits``, ``proxy``, and ``trust_env`` for both),
    which configure the ``ScopedTransport``. A ``transport=`` or ``mounts=``
    that is not a ``ScopedTransport`` is refused with ``ValueError``: its
    requests could not be cut. Proxies from the environment (``HTTP_PROXY``
    ...) are not used; pass ``proxy=``.
    """
    made: httpx.Client = scoped_client(
        httpx.Client, ScopedTransport, connect_timeout, client_kwargs
    )
    return made
