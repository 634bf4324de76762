"""An httpx transport whose connections register with the bound scope.

Imports only ``wirecut.scope`` from the project. ``client()`` makes an
``httpx.Client`` whose requests a ``scope.cancel()`` cuts: the socket is shut
down, the blocked worker wakes with ``Interrupted`` and the server sees the
close. Connections are pooled per scope, never shared between two scopes.
With no scope bound, it is a plain httpx client.

The ``*Core`` classes, ``PerScope`` and ``SocketHold`` are the flavour-free
building blocks that ``wirecut.adapters`` reuses for httpx2 (the openai SDK)
and urllib3 (requests).
"""

from wirecut.http._backend import (
    DEFAULT_CONNECT_TIMEOUT,
    ScopedBackendCore,
    ScopedNetworkBackend,
    ScopedNetworkStream,
    ScopedStreamCore,
)
from wirecut.http._per_scope import PerScope
from wirecut.http._socket_hold import SocketHold, raise_if_cancelled
from wirecut.http._transport import (
    ReleasingStreamCore,
    ScopedTransport,
    ScopedTransportCore,
    client,
)

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "PerScope",
    "ReleasingStreamCore",
    "ScopedBackendCore",
    "ScopedNetworkBackend",
    "ScopedNetworkStream",
    "ScopedStreamCore",
    "ScopedTransport",
    "ScopedTransportCore",
    "SocketHold",
    "client",
    "raise_if_cancelled",
]
