"""Serving the apps' HTTP: uvicorn on a thread or in the foreground, and its connection guards.

An app layer shared by the console, the proxy, the simulator, ``local`` and
the proof tools; it imports none of them. ``Server`` is uvicorn told when it
listens and what to end before its own shutdown, ``ServerThread`` runs it on a
background thread, and ``BackgroundServer`` is the one face of every app's
server that runs beside its caller (``start``/``stop``, a context manager,
``port``, ``url``, ``base_url``). ``ConnectionLimits`` and ``GuardedConfig`` bound what
a TCP connection may cost a server (a request-head deadline, a connection cap
that evicts idle connections first, bounds on sends and closes);
``connection_families`` shows a guard on ``/metrics``.
"""

from wirecut.serving._background import BackgroundServer
from wirecut.serving._guard_metrics import connection_families
from wirecut.serving._limits import (
    TRANSPORT_EXTENSION,
    ConnectionGuard,
    ConnectionLimits,
    Dropped,
    GuardedConfig,
    GuardedH11Protocol,
    GuardedHttpToolsProtocol,
    GuardedWebSocketProtocol,
    descriptor_limit,
    raise_descriptor_limit,
)
from wirecut.serving._uvicorn import (
    Server,
    ServerThread,
    http_address,
    http_base,
    listen,
    listen_all,
)

__all__ = [
    "TRANSPORT_EXTENSION",
    "BackgroundServer",
    "ConnectionGuard",
    "ConnectionLimits",
    "Dropped",
    "GuardedConfig",
    "GuardedH11Protocol",
    "GuardedHttpToolsProtocol",
    "GuardedWebSocketProtocol",
    "Server",
    "ServerThread",
    "connection_families",
    "descriptor_limit",
    "http_address",
    "http_base",
    "listen",
    "listen_all",
    "raise_descriptor_limit",
]
