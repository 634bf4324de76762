"""The console's Starlette app: ``/api/console``, ``/api/health``, ``/metrics``, the page.

Authentication: every API route wants the server's token, as ``?token=`` or
``Authorization: Bearer``, compared in constant time. The WebSocket closes
with 4401 on a wrong or missing token and 4403 on an ``Origin`` that is not
the server's own (a client that sends no Origin, like a terminal client, is
allowed: the browser is the one that sends a foreign page's Origin). The page
(``/`` and ``/static``) is public: it holds no data, and it reads the token
from its own URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.resources
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from wirecut.console.runner import Runner, route_stdio
from wirecut.console.server._connection import Connection
from wirecut.console.server._metrics import CONTENT_TYPE, ConsoleMetrics

__all__ = ["ConsoleState", "create_app"]

#: WebSocket close codes of the protocol.
CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN_ORIGIN = 4403

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

    async def shutdown(self, drain_seconds: float = 2.0) -> None:
        """Cancel every command with reason "shutdown", send each its complete, then return."""
        await self.runner.shutdown("shutdown")
        if self.connections:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(drain_seconds):
                    await asyncio.gather(*(c.drain() for c in list(self.connections)))


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
        connection = Connection(websocket, state.runner)
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
        return JSONResponse(body)

    async def metrics(request: Request) -> Response:
        if not state.authorized(request):
            return JSONResponse({"error": "a valid token is required"}, status_code=401)
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    async def page(request: Request) -> Response:
        index = _STATIC / "index.html"
        return HTMLResponse(index.read_text(encoding="utf-8"), headers=_SECURITY_HEADERS)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.runner.start()
        with route_stdio():
            yield
            await state.shutdown()
            if state.metrics.slot_watch is not None:
                await state.metrics.slot_watch.aclose()

    return Starlette(
        routes=[
            Route("/", page),
            Route("/api/health", health),
            Route("/metrics", metrics),
            WebSocketRoute("/api/console", console),
            Mount("/static", StaticFiles(directory=str(_STATIC)), name="static"),
        ],
        lifespan=lifespan,
    )
