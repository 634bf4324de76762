"""The simulator as an ASGI app: ``Simulator`` and its routes.

``Simulator`` holds the state (slots, event log, request records) and builds
the Starlette app that serves it. Build it in any thread; the app runs on one
event loop. The read methods (``events``, ``requests``, ``slots``) and
``reset`` are safe from any thread; ``begin_shutdown`` is for the event loop.

Routes: ``GET /health``, ``GET /v1/models``, the generation APIs ``POST
/v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` and
``/v1/messages`` (with ``/v1/messages/count_tokens``), llama.cpp's ``GET
/slots``, ``GET /props``, ``POST /tokenize``, ``/detokenize`` and
``/apply-template``, and for tests and benchmarks ``GET /sim/events?since=N``,
``GET /sim/requests``, ``POST /sim/reset``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable, Mapping

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from wirecut.simulator import _anthropic_format
from wirecut.simulator import _openai_format as fmt
from wirecut.simulator._anthropic_format import MessagesWire
from wirecut.simulator._chat_request import parse_chat_request
from wirecut.simulator._completion import CompletionResponse, Runtime, WireFactory
from wirecut.simulator._config import SimConfig
from wirecut.simulator._events import EventLog, SimEvent
from wirecut.simulator._llama_routes import LlamaRoutes
from wirecut.simulator._messages_request import parse_messages_request
from wirecut.simulator._request import Api, BadRequest, GenerationRequest
from wirecut.simulator._requests import RequestLedger, RequestSummary
from wirecut.simulator._responses_format import ResponsesWire
from wirecut.simulator._responses_request import parse_responses_request
from wirecut.simulator._script import Responder, ScriptedReply
from wirecut.simulator._slots import SlotPool
from wirecut.simulator._text_format import TextWire
from wirecut.simulator._text_request import parse_text_request
from wirecut.simulator._tokenizer import Tokenizer
from wirecut.simulator._wire import ErrorBody

__all__ = ["Simulator"]


class Simulator:
    """A llama.cpp-like OpenAI-compatible provider, as an ASGI app (``.app``).

    ``responder`` is the scripting hook (see ``wirecut.simulator._script``):
    called with each valid request body on the event loop; returning an
    assistant message makes the simulator serve that message instead of its
    generated words. ``tokenizer`` is the one every count is made with.
    """

    def __init__(
        self, config: SimConfig | None = None, *, responder: Responder | None = None
    ) -> None:
        self.config = config if config is not None else SimConfig()
        self.responder = responder
        self.event_log = EventLog()
        self._ledger = RequestLedger()
        self._pool = SlotPool(self.config.slots)
        self._runtime = Runtime(
            config=self.config, pool=self._pool, ledger=self._ledger, events=self.event_log
        )
        self.tokenizer = Tokenizer()
        self._created = int(time.time())
        # Numbers the tool-call ids a script leaves out, so they are deterministic.
        self._scripts = itertools.count(1)
        llama = LlamaRoutes(self.config, self.tokenizer)
        self.app = Starlette(
            routes=[
                Route("/health", self._health, methods=["GET"]),
                Route("/v1/models", self._models, methods=["GET"]),
                *(Route(api.value, self._generation(api), methods=["POST"]) for api in Api),
                Route("/v1/messages/count_tokens", llama.count_tokens, methods=["POST"]),
                Route("/slots", self._slots, methods=["GET"]),
                Route("/props", llama.props, methods=["GET"]),
                Route("/tokenize", llama.tokenize, methods=["POST"]),
                Route("/detokenize", llama.detokenize, methods=["POST"]),
                Route("/apply-template", llama.apply_template, methods=["POST"]),
                Route("/sim/events", self._events, methods=["GET"]),
                Route("/sim/requests", self._requests, methods=["GET"]),
                Route("/sim/reset", self._reset, methods=["POST"]),
            ]
        )

    # -- any thread -------------------------------------------------------

    def events(self, since: int = 0) -> list[SimEvent]:
        """The event log from ``seq`` ``since`` on, oldest first."""
        return self.event_log.snapshot(since)

    def requests(self) -> list[RequestSummary]:
        """A summary of each request since the last reset, oldest first."""
        return self._ledger.summaries()

    def slots(self) -> list[dict[str, object]]:
        """Each slot as ``{"id", "is_processing", "n_decoded", "request_id"}``."""
        return self._pool.snapshot()

    def reset(self) -> None:
        """Clear the event log and the records of finished requests.

        In-flight requests go on and keep logging; ids and ``seq`` numbers are
        never reused.
        """
        self.event_log.clear()
        self._ledger.clear()

    # -- event loop -------------------------------------------------------

    def begin_shutdown(self) -> None:
        """Turn queued requests away and stop decoding ones at once.

        Event-loop thread only. Idempotent. Without it, an endless stream
        would hold uvicorn's graceful shutdown forever.
        """
        self._runtime.shutting_down = True
        self._pool.close()
        for stop in self._runtime.active:
            stop.set()

    # -- routes -------------------------------------------------------------

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def _models(self, request: Request) -> Response:
        model = {
            "id": self.config.model,
            "object": "model",
            "created": self._created,
            "owned_by": "wirecut",
        }
        return JSONResponse({"object": "list", "data": [model]})

    async def _slots(self, request: Request) -> Response:
        return JSONResponse(self.slots())

    async def _events(self, request: Request) -> Response:
        raw = request.query_params.get("since", "0")
        try:
            since = int(raw)
        except ValueError:
            return _error(400, f"'since' must be an integer, got {raw!r}", "since")
        return JSONResponse([event.to_json() for event in self.events(since)])

    async def _requests(self, request: Request) -> Response:
        return JSONResponse([summary.to_json() for summary in self.requests()])

    async def _reset(self, request: Request) -> Response:
        self.reset()
        return JSONResponse({"status": "ok"})

    def _generation(self, api: Api) -> Callable[[Request], Awaitable[Response]]:
        error_body = _ERROR_BODIES[api]

        async def endpoint(request: Request) -> Response:
            try:
                raw = await request.body()
            except ClientDisconnect:
                # Nobody is left to answer; nothing was queued.
                return Response(status_code=400)
            try:
                parsed = self._parse(api, raw)
            except BadRequest as exc:
                return _error(400, exc.message, exc.param, error_body=error_body)
            scripted = None
            if self.responder is not None:
                try:
                    reply: Mapping[str, object] | None = self.responder(parsed.responder_body())
                    if reply is not None:
                        scripted = ScriptedReply.from_json(reply, f"s{next(self._scripts)}")
                except Exception as exc:
                    # A broken script is the test's bug: say so to the client.
                    message = f"responder failed: {exc!r}"
                    return _error(500, message, None, "server_error", error_body)
                if scripted is not None and scripted.tool_calls and api is Api.TEXT:
                    message = f"the scripted reply has tool calls, which {api.value} cannot carry"
                    return _error(500, message, None, "server_error", error_body)
            client = f"{request.client.host}:{request.client.port}" if request.client else None
            return CompletionResponse(
                self._runtime, parsed, scripted, client, _wire_factory(parsed), error_body
            )

        return endpoint

    def _parse(self, api: Api, raw: bytes) -> GenerationRequest:
        if api is Api.TEXT:
            return parse_text_request(raw, self.tokenizer)
        if api is Api.RESPONSES:
            return parse_responses_request(raw)
        if api is Api.MESSAGES:
            return parse_messages_request(raw)
        return parse_chat_request(raw)


_ERROR_BODIES: dict[Api, ErrorBody] = {
    Api.CHAT: fmt.error_body,
    Api.TEXT: fmt.error_body,
    Api.RESPONSES: fmt.error_body,
    Api.MESSAGES: _anthropic_format.error_body,
}


def _wire_factory(request: GenerationRequest) -> WireFactory:
    """How the reply to ``request`` goes on the wire, given its id, model and time."""
    api, prompt_tokens = request.api, request.prompt_tokens
    if api is Api.TEXT:
        return lambda rid, model, created: TextWire(f"cmpl-{rid}", model, created)
    if api is Api.RESPONSES:
        return lambda rid, model, created: ResponsesWire(
            f"resp_{rid}", model, created, prompt_tokens
        )
    if api is Api.MESSAGES:
        return lambda rid, model, created: MessagesWire(f"msg_{rid}", model, prompt_tokens)
    include_usage = request.include_usage
    return lambda rid, model, created: fmt.ChatWire(
        f"chatcmpl-{rid}", model, created, include_usage
    )


def _error(
    status: int,
    message: str,
    param: str | None,
    type_: str = "invalid_request_error",
    error_body: ErrorBody = fmt.error_body,
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param), status_code=status)
