"""The httpx2/httpcore2 flavour of ``wirecut.http``, for the official openai SDK.

The openai SDK 3.x is built on ``httpx2``/``httpcore2`` and takes an
``httpx2.Client`` as ``http_client`` (docs/architecture.md, fact 6). This
module binds the flavour-free cores of ``wirecut.http`` to those libraries;
the logic (per-scope pools, socket registration, the cuttable connect and TLS
handshake, the cut turned into ``Interrupted``) is the same code.

What a cut looks like to the SDK: the transport raises ``Interrupted`` itself,
a ``BaseException``, so it passes straight out of ``client.chat.completions.create()``
and out of iterating a ``Stream``, with no retry (the SDK retries only its
transport errors). A request under a cancelled scope raises ``Interrupted``
before connecting. Callers see ``wirecut.scope.Interrupted``, never an
``APIConnectionError``.

The SDK's own retry backoff is a ``time.sleep`` that nothing can wake, and an
HTTP client never sees it: ``openai_client()`` makes an ``OpenAI`` whose
backoff sleeps on the scope instead (``_openai_sdk``).
"""

from __future__ import annotations

from typing import Any

import httpcore2
import httpx2

from wirecut.http import DEFAULT_CONNECT_TIMEOUT
from wirecut.http._core import (
    ReleasingStreamCore,
    ScopedBackendCore,
    ScopedStreamCore,
    ScopedTransportCore,
    httpcore_flavour,
    scoped_client,
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

    releasing_stream = _ReleasingStream

    def __init__(
        self, *, connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT, **transport_kwargs: Any
    ) -> None:
        flavour = httpcore_flavour(httpcore2)
        backend = _Backend(flavour, httpcore2.SyncBackend(), _Stream, connect_timeout)
        super().__init__(httpx2, backend, transport_kwargs)


def openai_http_client(
    *, connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT, **client_kwargs: Any
) -> httpx2.Client:
    """An ``httpx2.Client`` on a ``ScopedTransport2``, configured like the SDK's default.

    ``client_kwargs`` go to ``httpx2.Client``; ``follow_redirects`` defaults
    to True as in the SDK's own client. The transport keywords (``verify``,
    ``cert``, ``http1``, ``http2``, ``limits``, ``proxy``) configure the
    ``ScopedTransport2``; a ``transport=`` or ``mounts=`` that is not one is
    refused with ``ValueError``, as its requests could not be cut. The SDK
    sets its own timeouts per request.
    """
    client_kwargs.setdefault("follow_redirects", True)
    made: httpx2.Client = scoped_client(
        httpx2.Client, ScopedTransport2, connect_timeout, client_kwargs
    )
    return made
