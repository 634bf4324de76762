"""Who may talk to the console: the ``Host`` it was asked by, and the proof it holds the token.

Host. A page on ``http://rebound.attacker.example:8765/`` whose name the
attacker re-points at 127.0.0.1 (DNS rebinding) is, to the browser, the
attacker's own origin: it sends ``Host: rebound.attacker.example:8765`` and a
matching ``Origin``, so an Origin check alone lets it in. ``HostGuard`` answers
only the names the server is reachable by (``HostPolicy``) and refuses every
other request, on every route and before any work: HTTP with 421, a WebSocket
with a 421 *instead of* the handshake (the app never runs). The port in
``Host`` is not compared: rebinding changes the name, never the port, and an
SSH forward (``-L 9000:127.0.0.1:8765``) legitimately changes the port.

Proof. ``wirecut console`` finds a local console through ``serve.json``; if
that server died and another program took its port, sending it the token
would hand the token over. So the client first sends a random challenge to
``/api/proof`` (no token needed) and checks the answer, an HMAC of the
challenge keyed by the token (``wirecut.record.proof``), before it sends ``Authorization``
(docs/protocol.md, "/api/proof").

Event loop only (``HostGuard``); the functions are pure.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "LOOPBACK_NAMES",
    "HostGuard",
    "HostPolicy",
    "host_name_problem",
]

#: The names a console bound to loopback answers to (besides its own bound address).
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_WILDCARDS = {"", "0.0.0.0", "::"}


def _normalize(name: str) -> str:
    # "LOCALHOST." and "localhost" are one name; "[::1]" is written "::1".
    return name.strip().strip("[]").rstrip(".").lower()


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def host_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an ``--allowed-host`` (None: it can): a bare name or address."""
    if not name.strip():
        return "an allowed host must not be empty"
    parts = urlsplit("//" + name.strip())
    try:
        port = parts.port
    except ValueError:
        port = -1
    if (
        port is not None
        or parts.username is not None
        or parts.path
        or parts.query
        or parts.fragment
        or not parts.hostname
        or "*" in name
    ):
        return (
            f"{name!r} is not a host name: give a bare name or address "
            "(console.example.org, 192.168.1.5, ::1), without scheme, port or wildcard"
        )
    return None


@dataclass(frozen=True)
class HostPolicy:
    """The ``Host`` names a console answers to (ports are not compared; see the module doc)."""

    names: frozenset[str]
    #: Bound to every interface (0.0.0.0, ::): any IP literal is one of ours, and
    #: an IP literal cannot be rebound (rebinding needs a name the attacker's DNS serves).
    any_address: bool = False

    @classmethod
    def for_bind(cls, host: str, allowed: Iterable[str] = ()) -> HostPolicy:
        """The policy of a server bound to ``host``, plus the ``--allowed-host`` names."""
        bound = _normalize(host)
        names = {_normalize(name) for name in allowed}
        ip = _ip(bound)
        wildcard = bound in _WILDCARDS
        if wildcard or bound == "localhost" or (ip is not None and ip.is_loopback):
            names.update(LOOPBACK_NAMES)
        if not wildcard:
            names.add(bound)
        return cls(frozenset(names), any_address=wildcard)

    def allows(self, host_header: str | None) -> bool:
        """True when a request with this ``Host`` header is meant for this server."""
        if host_header is None:
            return False
        parts = urlsplit("//" + host_header)
        try:
            parts.port  # noqa: B018 (a malformed port raises here)
        except ValueError:
            return False
        if parts.username is not None or parts.path or parts.query or parts.fragment:
            return False
        name = _normalize(parts.hostname or "")
        if not name:
            return False
        if name in self.names:
            return True
        return self.any_address and _ip(name) is not None

    def describe(self) -> str:
        """The names, for messages: ``127.0.0.1, ::1, localhost``."""
        shown = sorted(self.names)
        if self.any_address:
            shown.append("any IP address")
        return ", ".join(shown)


class HostGuard:
    """ASGI middleware: a request whose ``Host`` the policy does not allow gets 421, nothing else.

    Covers ``http`` and ``websocket`` scopes alike (a WebSocket gets the 421
    as its handshake response, before any accept); ``lifespan`` passes.
    """

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = None
        for name, value in scope["headers"]:
            if name == b"host":
                if host is not None:  # two Host headers: refuse, never pick one
                    host = None
                    break
                host = value.decode("latin-1")
        if self.policy.allows(host):
            await self.app(scope, receive, send)
            return
        shown = "no Host header" if host is None else f"the host {host[:100]!r}"
        body = (
            f"421 Misdirected Request: this console does not answer to {shown} "
            "(wirecut serve --allowed-host NAME adds a name)\n"
        ).encode()
        prefix = "websocket.http.response." if scope["type"] == "websocket" else "http.response."
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": prefix + "start", "status": 421, "headers": headers})
        await send({"type": prefix + "body", "body": body})
