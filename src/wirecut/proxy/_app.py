"""The proxy's Starlette app: the four generation APIs, cancel by id, ``/health``, ``/metrics``.

Every request first passes ``Guard`` (an ASGI middleware): its ``Host`` must
be a loopback name, an IP address or an ``allowed_hosts`` name (a page of
another site cannot reach the proxy through DNS rebinding); an ``Origin``
must be the proxy's own (a page of another site cannot spend its tokens); and
with client keys, a known token (``Authorization: Bearer TOKEN`` or
``x-api-key: TOKEN``, ``_keys``), whose key's name the request then carries.
What fails gets an error in the API's shape (Anthropic's under
``/v1/messages``, else OpenAI's) and no record.

The generation routes (``/v1/chat/completions``, ``/v1/completions``,
``/v1/responses``, ``/v1/messages``) are plain ASGI apps (``Completions``),
which ``Guard`` calls itself: the whole life of a request, queue included,
runs where its ``receive()`` is watched for the client's disconnect
(``Exchange``). A request goes to the upstream that serves its ``model``
(``Router``); an unknown model is a ``404`` that lists the known ones.
``GET /v1/models`` is the union of what the upstreams serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import secrets
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from wirecut._json import JSONError, loads
from wirecut.proxy._dialects import Dialect, Endpoint, dialect_of
from wirecut.proxy._metrics import CONTENT_TYPE
from wirecut.proxy._proxy import DuplicateId, Proxy, UnknownModel
from wirecut.proxy._record import RecordReason
from wirecut.proxy._request import BadRequest, check_request_id
from wirecut.proxy._routing import Backend
from wirecut.proxy._upstream import BodyTooLarge, Upstream
from wirecut.proxy._wire import REQUEST_ID_HEADER, send_json
from wirecut.scope import Interrupted, InterruptScope

__all__ = ["KEY_SCOPE", "Completions", "Guard", "confined", "create_app", "host_allowed"]

#: Where ``Guard`` leaves the name of the client's key in the ASGI scope.
KEY_SCOPE = "wirecut.key"
#: Request headers passed upstream as they came, for the Messages API.
_ANTHROPIC_HEADERS = (b"anthropic-version", b"anthropic-beta")
#: Seconds ``GET /v1/models`` waits for each upstream's list.
MODELS_BOUND = 3.0

_LOOPBACK_NAMES = frozenset({"localhost"})


def host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """Whether a ``Host`` header names this proxy: a loopback name, an IP, or an allowed name."""
    host = host.strip().lower()
    if host.startswith("["):
        name = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        name = host.partition(":")[0]
    else:
        name = host
    name = name.rstrip(".")
    if name in _LOOPBACK_NAMES or name in allowed:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Guard:
    """Host, Origin and token checks in front of ``app`` (see the module docstring)."""

    def __init__(
        self, app: ASGIApp, proxy: Proxy, direct: dict[str, ASGIApp] | None = None
    ) -> None:
        self.app = app
        self.proxy = proxy
        # POST routes served without Starlette's router and middleware: a
        # streamed token passes every wrapper of ``send`` once.
        self._direct = direct or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        problem = None
        who = None
        if host and not host_allowed(host, self.proxy.config.allowed_hosts):
            problem = (403, "host", f"the Host {host!r} is not a name of this proxy")
        elif not _same_origin(headers.get(b"origin"), host):
            problem = (403, "origin", "requests from another site's page are refused")
        else:
            who = self.proxy.keys.match(_presented(headers))
            if who is None:
                problem = (
                    401,
                    "token",
                    "a valid token is required (Authorization: Bearer TOKEN, or x-api-key)",
                )
        if problem is None:
            assert who is not None
            scope[KEY_SCOPE] = who.name
            direct = self._direct.get(scope["path"]) if scope["method"] == "POST" else None
            await (direct or self.app)(scope, receive, send)
            return
        status, why, message = problem
        self.proxy.metrics.rejected.labels(why).inc()
        kind = "authentication_error" if status == 401 else "permission_error"
        await send_json(send, status, _shape(scope["path"]).error_body(message, kind), None)


def _presented(headers: dict[bytes, bytes]) -> bytes | None:
    """The token a client presented: ``Authorization: Bearer`` or Anthropic's ``x-api-key``."""
    scheme, _, value = headers.get(b"authorization", b"").partition(b" ")
    if scheme.lower() == b"bearer" and value.strip():
        return value.strip()
    return headers.get(b"x-api-key", b"").strip() or None


def _shape(path: str) -> Dialect:
    """The dialect whose error shape a path's clients read (Anthropic's under /v1/messages)."""
    messages = path == "/v1/messages" or path.startswith("/v1/messages/")
    return dialect_of(Endpoint.MESSAGES if messages else Endpoint.CHAT)


def _same_origin(origin: bytes | None, host: str) -> bool:
    if origin is None:
        return True  # Not a browser page's request (curl, SDKs, servers).
    parts = urlsplit(origin.decode("latin-1"))
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


class Completions:
    """``POST`` of one of the four generation APIs (``endpoint``), as an ASGI app."""

    def __init__(self, proxy: Proxy, endpoint: Endpoint) -> None:
        self.proxy = proxy
        self.endpoint = endpoint
        self.dialect = dialect_of(endpoint)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        proxy = self.proxy
        given = _header(scope, b"x-request-id")
        try:
            request_id = secrets.token_hex(12) if given is None else check_request_id(given)
        except BadRequest as exc:
            await self._reject(send, 400, "request_id", exc.message, None, exc.param)
            return
        limit = proxy.config.max_body_bytes
        declared = _header(scope, b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            raw: bytes | None = _TOO_LARGE  # Refused before a byte of it is read.
        else:
            raw = await _read_body(receive, limit)
        if raw is None:
            return  # The client left before its request was whole: nothing to do.
        if raw is _TOO_LARGE:
            message = f"the request body exceeds {limit} bytes (--max-body-bytes)"
            await self._reject(send, 413, "body", message, request_id)
            return
        passed: tuple[tuple[str, str], ...] = ()
        if self.endpoint is Endpoint.MESSAGES:
            passed = tuple(
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in scope["headers"]
                if name in _ANTHROPIC_HEADERS
            )
        try:
            request = await proxy.parser.parse(
                raw, self.endpoint, request_id, proxy.config.model, passed
            )
        except BadRequest as exc:
            await self._reject(send, 400, "body", exc.message, request_id, exc.param)
            return
        try:
            exchange = proxy.open(request_id, request, scope.get(KEY_SCOPE))
        except DuplicateId:
            message = f"a request with the id {request_id!r} is in flight"
            await self._reject(send, 409, "request_id", message, request_id, "X-Request-Id")
            return
        except UnknownModel as exc:
            status, why = (404, "model") if exc.model is not None else (400, "model")
            await self._reject(send, status, why, str(exc), request_id, "model", "model_not_found")
            return
        await exchange.serve(receive, send)

    async def _reject(
        self,
        send: Send,
        status: int,
        why: str,
        message: str,
        request_id: str | None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        self.proxy.metrics.rejected.labels(why).inc()
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        if self.endpoint is not Endpoint.MESSAGES and status == 404:
            kind = "invalid_request_error"  # OpenAI's type for an unknown model
        body = self.dialect.error_body(message, kind, param=param, code=code)
        await send_json(send, status, body, request_id)


_TOO_LARGE = b"\x00too large"


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body; None if the client left; ``_TOO_LARGE`` past ``limit``."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            return _TOO_LARGE
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def create_app(proxy: Proxy) -> ASGIApp:
    """The proxy app over ``proxy``; its lifespan starts it and, at the end, cuts what is live."""

    async def cancel(request: Request) -> Response:
        request_id = request.path_params["id"]
        exchange = proxy.live.get(request_id)
        if exchange is None:
            message = f"no request with the id {request_id!r} is in flight"
            return JSONResponse(_error(message, "not_found_error"), status_code=404)
        exchange.cancel(RecordReason.CANCEL)
        # The record comes once the worker returned: run_sync bounds that wait.
        async with asyncio.timeout(proxy.config.unwind_timeout + 5.0):
            await exchange.finished.wait()
        assert exchange.record is not None
        return JSONResponse(exchange.record.to_json())

    async def passthrough(request: Request) -> Response:
        path = confined(request.path_params["path"])
        if path is None:
            message = f"GET {request.url.path} is not served by wirecut proxy"
            return JSONResponse(_error(message, "invalid_request_error"), status_code=404)
        router = proxy.router
        if path == "models" and not _one_for_all(proxy):
            return await models(request)
        if path.startswith("models/") and not _one_for_all(proxy):
            return await model(request, request.path_params["path"].removeprefix("models/"))
        if len(router.backends) != 1:
            message = (
                f"GET {request.url.path} is not served with several upstreams "
                "(GET /v1/models and /v1/models/ID are)"
            )
            return JSONResponse(_error(message, "invalid_request_error"), status_code=404)
        return await forward(request, router.backends[0].upstream, path)

    async def forward(request: Request, upstream: Upstream, path: str) -> Response:
        request_id = secrets.token_hex(12)
        target = upstream.target(path)
        query = request.scope["query_string"].decode("latin-1")
        if query:
            target += "?" + query
        scope = InterruptScope(f"proxy-get-{request_id}")
        limit = proxy.config.response_limits.body_bytes
        try:
            async with cut_on_disconnect(request, scope):
                status, content_type, body = await upstream.get(target, scope=scope, limit=limit)
        except httpx.HTTPError as exc:
            message = f"the upstream {upstream.base_url} could not be reached: {exc}"
            return JSONResponse(_error(message, "upstream_error"), status_code=502)
        except BodyTooLarge as exc:
            message = f"the upstream {upstream.base_url} sent too much: {exc}"
            return JSONResponse(_error(message, "upstream_error"), status_code=502)
        except ValueError as exc:  # a query that cannot go on a request line
            return JSONResponse(_error(str(exc), "invalid_request_error"), status_code=400)
        except Interrupted:
            return Response(status_code=499)  # The client left: nobody reads this.
        return Response(
            body,
            status_code=status,
            media_type=content_type,
            headers={REQUEST_ID_HEADER: request_id},
        )

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": await union(request)})

    async def model(request: Request, name: str) -> Response:
        """One model of the union; a ``404`` listing the known ones if no upstream serves it."""
        if proxy.router.route(name) is None:
            message = str(UnknownModel(name, proxy.router.known()))
            return JSONResponse(
                _error(message, "invalid_request_error", "model_not_found"), status_code=404
            )
        found = [entry for entry in await union(request) if entry.get("id") == name]
        # Routed by a prefix and not listed by its upstream: served, and nothing more is known.
        return JSONResponse(found[0] if found else _configured(name))

    async def union(request: Request) -> list[dict[str, Any]]:
        """The union of the upstreams' models, each listed by the upstream that serves it."""
        scope = InterruptScope(f"proxy-models-{secrets.token_hex(6)}")
        limit = proxy.config.response_limits.body_bytes
        router = proxy.router

        async def listing(backend: Backend) -> list[Any]:
            try:
                async with asyncio.timeout(MODELS_BOUND):
                    status, _, body = await backend.upstream.get(
                        backend.upstream.target("models"), scope=scope, limit=limit
                    )
                answer = loads(body) if status == 200 else None
            except (httpx.HTTPError, BodyTooLarge, JSONError, TimeoutError, Interrupted):
                return []  # Down or not listing: its configured names are still served.
            data = answer.get("data") if isinstance(answer, dict) else None
            return data if isinstance(data, list) else []

        async with cut_on_disconnect(request, scope):
            found = await asyncio.gather(*(listing(b) for b in router.backends))
        data: list[dict[str, Any]] = []
        seen: set[str] = set()
        for backend, listed in zip(router.backends, found, strict=True):
            for entry in listed:
                name = entry.get("id") if isinstance(entry, dict) else None
                if isinstance(name, str) and name not in seen and router.route(name) is backend:
                    seen.add(name)
                    data.append(entry)
            for name in backend.spec.models:
                if not name.endswith("*") and name not in seen:
                    seen.add(name)
                    data.append(_configured(name))
        return data

    async def health(request: Request) -> Response:
        return JSONResponse(await proxy.health())

    async def metrics(request: Request) -> Response:
        return Response(proxy.metrics.render(), media_type=CONTENT_TYPE)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        message = f"{request.method} {request.url.path} is not served by wirecut proxy"
        return JSONResponse(_error(message, "invalid_request_error"), status_code=status)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await proxy.start()
        yield
        await proxy.shutdown()

    completions: dict[str, ASGIApp] = {
        endpoint.route: Completions(proxy, endpoint) for endpoint in Endpoint
    }
    app = Starlette(
        routes=[
            Route("/v1/requests/{id}/cancel", cancel, methods=["POST"]),
            Route("/v1/{path:path}", passthrough, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        exception_handlers={404: not_found, 405: not_found},
        lifespan=lifespan,
    )
    return Guard(app, proxy, completions)


@contextlib.asynccontextmanager
async def cut_on_disconnect(request: Request, scope: InterruptScope) -> AsyncIterator[None]:
    """Cancel ``scope`` if the client disconnects while the block runs (event loop)."""

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                scope.cancel("disconnect")
                return

    watcher = asyncio.create_task(watch())
    try:
        yield
    finally:
        watcher.cancel()


def confined(path: str) -> str | None:
    """``path`` (decoded, under ``/v1/``) quoted for the upstream; None if it would leave ``/v1``.

    A dot segment (``..``, also sent as ``%2E%2E``), or a backslash that a
    server may read as a slash, would reach the upstream's other routes
    (``/slots``, ``/metrics``) with the proxy's key.
    """
    if "\\" in path or any(segment in (".", "..") for segment in path.split("/")):
        return None
    return quote(path, safe="/:@!$&'()*+,;=-._~")


def _error(message: str, type_: str, code: str | None = None) -> dict[str, object]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _configured(name: str) -> dict[str, Any]:
    """A model served here that its upstream does not list: when it was made is unknown."""
    return {"id": name, "object": "model", "created": None, "owned_by": None}


def _one_for_all(proxy: Proxy) -> bool:
    """True if one upstream serves every model: its /v1/models is passed as it came."""
    backends = proxy.router.backends
    return len(backends) == 1 and "*" in backends[0].spec.models
