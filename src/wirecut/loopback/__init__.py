"""Scripted servers on loopback: the far end of the wire for ``probe``, the tests and the bench.

An app layer of its own (stdlib only; see ``_servers``): ``LoopbackServer``
answers HTTP/1.1 as its handler scripts it, ``StallServer`` never answers a
TLS handshake, and ``FullBacklog`` is a listener whose connects stay pending.
"""

from wirecut.loopback._servers import (
    FullBacklog,
    LoopbackExchange,
    LoopbackHandler,
    LoopbackRequest,
    LoopbackServer,
    StallServer,
)

__all__ = [
    "FullBacklog",
    "LoopbackExchange",
    "LoopbackHandler",
    "LoopbackRequest",
    "LoopbackServer",
    "StallServer",
]
