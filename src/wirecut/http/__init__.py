"""An httpx transport whose connections register with the bound scope.

Imports only ``wirecut.scope`` from the project. ``client()`` makes an
``httpx.Client`` whose requests a ``scope.cancel()`` cuts: the connect, the
TLS handshake or the read it is blocked in ends at once, the worker wakes
with ``Interrupted``, and the server sees the close. Connections are pooled
per scope, never shared between two scopes, and a cancelled scope's idle
connections are closed. With no scope bound, it is a plain httpx client.
``H1Transport`` is the same promise for HTTP/1.1 streams at a fraction of
the CPU (httptools instead of httpcore and h11): ``wirecut.provider`` streams
through it. ``AsyncH1Client`` keeps the same promise on an event loop (many
streams, no thread each): a scope's cut or a cancel of the task closes the
connection, and the server sees it at once.

``cut_as_interrupted`` is the one way the layers above turn an error that a
cut caused into ``Interrupted``. What cannot be cut (name resolution, a Unix
socket connect) is listed in docs/cancellation-limits.md.
"""

from wirecut.http._async_h1 import AsyncH1Client, AsyncH1Response
from wirecut.http._backend import (
    DEFAULT_CONNECT_TIMEOUT,
    ScopedNetworkBackend,
    ScopedNetworkStream,
)
from wirecut.http._cut import cut_as_interrupted, raise_if_cut
from wirecut.http._h1 import H1Transport
from wirecut.http._transport import ScopedTransport, client

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "AsyncH1Client",
    "AsyncH1Response",
    "H1Transport",
    "ScopedNetworkBackend",
    "ScopedNetworkStream",
    "ScopedTransport",
    "client",
    "cut_as_interrupted",
    "raise_if_cut",
]
