"""The console's Starlette app: ``/api/console``, ``/api/health``, ``/metrics``, the page.

Every route first passes ``HostGuard``: a ``Host`` the server is not
reachable by gets 421 before anything else runs (DNS rebinding,
``_access.py``). Authentication: every API route wants the server's token, as
``?token=`` or ``Authorization: Bearer``, compared in constant time. The
WebSocket closes with 4401 on a wrong or missing token and 4403 on an
``Origin`` that is not the server's own (a client that sends no Origin, like a
terminal client, is allowed: the browser is the one that sends a foreign
page's Origin). The page (``/`` and ``/static``) is public: it holds no data,
and it reads the token from its own URL. ``/api/proof`` is public too: it
proves that this server holds the token without revealing it (``serve.json``
may be stale; docs/protocol.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.resources
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from wirecut.agent import McpServers
from wirecut.console.runner import Runner, route_stdio
from wirecut.console.server._access import HostGuard, HostPolicy
from wirecut.console.server._catalog import catalog
from wirecut.console.server._connection import Connection
from wirecut.console.server._metrics import CONTENT_TYPE, ConsoleMetrics
from wirecut.provider import SlotGate
from wirecut.record import CLOSE_FORBIDDEN_ORIGIN, CLOSE_UNAUTHORIZED, PROOF_CHALLENGE, proof
from wirecut.serving import ConnectionGuard, ConnectionLimits, Dropped

__all__ = ["ConsoleState", "create_app"]

_STATIC = importlib.resources.files("wirecut.console") / "static"

_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "style-src 'self'; script-src 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@dataclass
class ConsoleState:
    """What the app serves: the runner, its metrics, and the token (None: none required)."""

    runner: Runner
    metrics: ConsoleMetrics
    token: str | None
    connections: set[Connection] = field(default_factory=set)
    #: The ``Host`` names it answers to.
    hosts: HostPolicy = field(default_factory=lambda: HostPolicy.for_bind("127.0.0.1"))
    #: This server's random id: in ``serve.json``, and in every ``/api/proof``.
    instance: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    #: The server's connections (None until a server is built around the app).
    guard: ConnectionGuard | None = None
    #: The MCP servers whose tools the agents get (``/api/commands`` lists them).
    mcp: McpServers | None = None
    #: The line the provider's requests take their turn in (None: no line).
    admission: SlotGate | None = None

    def authorized(self, conn: HTTPConnection) -> bool:
        if self.token is None:
            return True
        given = conn.query_params.get("token")
        if given is None:
            scheme, _, value = conn.headers.get("authorization", "").partition(" ")
            given = value.strip() if scheme.lower() == "bearer" else None
        if given is None:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())

    async def shutdown(self, drain_seconds: float | None = None) -> None:
        """Cancel every command with reason "shutdown", send each its complete, then return.

        The frames get ``drain_seconds`` (default: ``limits.drain_timeout``) to
        reach clients that read slowly.
        """
        await self.runner.shutdown("shutdown")
        bound = self.limits.drain_timeout if drain_seconds is None else drain_seconds
        if self.connections:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(bound):
                    await asyncio.gather(*(c.drain() for c in list(self.connections)))

    def slow_reader(self) -> None:
        if self.guard is not None:
            self.guard.note(Dropped.SLOW_READER)


def _same_origin(conn: HTTPConnection) -> bool:
    origin = conn.headers.get("origin")
    if origin is None:
        return True
    host = conn.headers.get("host", "")
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def create_app(state: ConsoleState) -> Starlette:
    """The console app over ``state``; its lifespan starts the runner and routes ``print()``."""

    async def console(websocket: WebSocket) -> None:
        await websocket.accept()
        if not state.authorized(websocket):
            await websocket.close(CLOSE_UNAUTHORIZED, "a valid token is required")
            return
        if not _same_origin(websocket):
            await websocket.close(CLOSE_FORBIDDEN_ORIGIN, "this Origin may not use the console")
            return
        connection = Connection(
            websocket,
            state.runner,
            max_outbox=state.limits.max_outbox,
            close_timeout=state.limits.close_timeout,
            on_slow_reader=state.slow_reader,
        )
        state.connections.add(connection)
        try:
            await connection.serve()
        finally:
            state.connections.discard(connection)

    async def health(request: Request) -> Response:
        if not state.authorized(request):
            return JSONResponse({"error": "a valid token is required"}, status_code=401)
        body = state.runner.health()
        if state.metrics.slot_watch is not None:
            body = {**body, "slots": state.metrics.slot_watch.health()}
        if state.admission is not None:
            body = {**body, "admission": state.admission.health()}
        return JSONResponse(body)

    async def commands(request: Request) -> Response:
        if not state.authorized(request):
            return JSONResponse({"error": "a valid token is required"}, status_code=401)
        return JSONResponse(catalog(state.runner.commands, state.mcp))

    async def metrics(request: Request) -> Response:
        if not state.authorized(request):
            return JSONResponse({"error": "a valid token is required"}, status_code=401)
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    async def prove(request: Request) -> Response:
        # Public: a client holding the token from serve.json checks the answer
        # before it sends the token. An HMAC does not reveal its key.
        if state.token is None:
            return JSONResponse({"error": "this console requires no token"}, status_code=404)
        challenge = request.query_params.get("challenge", "")
        if not PROOF_CHALLENGE.fullmatch(challenge):
            return JSONResponse(
                {"error": "'challenge' must be 32 to 128 characters of A-Z a-z 0-9 _ -"},
                status_code=400,
            )
        return JSONResponse(
            {"proof": proof(state.token, state.instance, challenge)},
            headers={"Cache-Control": "no-store"},
        )

    async def page(request: Request) -> Response:
        index = _STATIC / "index.html"
        return HTMLResponse(index.read_text(encoding="utf-8"), headers=_SECURITY_HEADERS)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.runner.start()
        if state.metrics.slot_watch is not None:
            state.metrics.slot_watch.start()
        with route_stdio():
            yield
            await state.shutdown()
            if state.metrics.slot_watch is not None:
                await state.metrics.slot_watch.aclose()

    return Starlette(
        routes=[
            Route("/", page),
            Route("/api/health", health),
            Route("/api/commands", commands),
            Route("/api/proof", prove),
            Route("/metrics", metrics),
            WebSocketRoute("/api/console", console),
            Mount("/static", StaticFiles(directory=str(_STATIC)), name="static"),
        ],
        middleware=[Middleware(HostGuard, policy=state.hosts)],
        lifespan=lifespan,
    )
