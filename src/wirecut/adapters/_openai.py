"""The httpx2/httpcore2 flavour of ``wirecut.http``, for the official openai SDK.

The openai SDK 3.x is built on ``httpx2``/``httpcore2`` and takes an
``httpx2.Client`` as ``http_client`` (DESIGN fact 6). This module binds the
flavour-free cores of ``wirecut.http`` to those libraries; the logic (per-scope
pools, socket registration, the cut turned into ``Interrupted``) is the same
code.

What a cut looks like to the SDK: the transport raises ``Interrupted`` itself,
a ``BaseException``, so it passes straight out of ``client.chat.completions.create()``
and out of iterating a ``Stream``, with no retry (the SDK retries only its
transport errors). A request under a cancelled scope raises ``Interrupted``
before connecting. Callers see ``wirecut.scope.Interrupted``, never an
``APIConnectionError``.
"""

from __future__ import annotations

from typing import Any

import httpcore2
import httpx2

from wirecut.http import (
    DEFAULT_CONNECT_TIMEOUT,
    ReleasingStreamCore,
    ScopedBackendCore,
    ScopedStreamCore,
    ScopedTransportCore,
)

__all__ = ["ScopedTransport2", "openai_http_client"]


class _Stream(ScopedStreamCore, httpcore2.NetworkStream):
    pass


class _Backend(ScopedBackendCore[_Stream], httpcore2.NetworkBackend):
    pass


class _ReleasingStream(ReleasingStreamCore, httpx2.SyncByteStream):
    pass


class ScopedTransport2(ScopedTransportCore, httpx2.BaseTransport):
    """``wirecut.http.ScopedTransport`` for httpx2: same arguments, same cancellation."""

    def __init__(
        self, *, connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT, **transport_kwargs: Any
    ) -> None:
        self._backend = _Backend(httpcore2.SyncBackend(), _Stream, connect_timeout)
        super().__init__(transport_kwargs, connect_timeout)

    def _new_transport(self) -> httpx2.HTTPTransport:
        transport = httpx2.HTTPTransport(**self._transport_kwargs)
        transport._pool._network_backend = self._backend
        return transport

    def _releasing_stream(self, inner: Any, network_stream: ScopedStreamCore) -> Any:
        return _ReleasingStream(inner, network_stream)


def openai_http_client(
    *, connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT, **client_kwargs: Any
) -> httpx2.Client:
    """An ``httpx2.Client`` on a ``ScopedTransport2``, configured like the SDK's default.

    ``client_kwargs`` go to ``httpx2.Client``; ``follow_redirects`` defaults
    to True as in the SDK's own client. The SDK sets its own timeouts per request.
    """
    client_kwargs.setdefault("follow_redirects", True)
    transport = client_kwargs.pop("transport", None) or ScopedTransport2(
        connect_timeout=connect_timeout
    )
    return httpx2.Client(transport=transport, **client_kwargs)
