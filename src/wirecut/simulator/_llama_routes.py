"""llama.cpp's own routes beside the generation APIs: ``/props``, ``/tokenize``,
``/detokenize``, ``/apply-template``, and Anthropic's ``/v1/messages/count_tokens``.

Field names are llama.cpp's (``docs/protocol.md``, "The simulator"). Every
count here comes from the same tokenizer and template as the ``usage`` the
generation routes report, so a client can count relayed text and prompts
in tokens exactly as the simulator does. Bodies are validated at the
boundary: a bad one is a 400 in OpenAI's error shape (Anthropic's for
``count_tokens``) that names the field. The handlers run on the server's
event loop.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from wirecut.simulator import _anthropic_format, _openai_format
from wirecut.simulator._config import SimConfig
from wirecut.simulator._messages_request import parse_messages_request
from wirecut.simulator._request import BadRequest, check_messages, load_object, optional
from wirecut.simulator._tokenizer import (
    BOS_TOKEN,
    CHAT_TEMPLATE,
    EOS_TOKEN,
    Token,
    Tokenizer,
    UnknownToken,
    apply_template,
)
from wirecut.simulator._wire import ErrorBody

__all__ = ["LlamaRoutes"]


class LlamaRoutes:
    """The handlers; build one per simulator, with its config and tokenizer."""

    def __init__(self, config: SimConfig, tokenizer: Tokenizer) -> None:
        self._config = config
        self._tokenizer = tokenizer

    async def props(self, request: Request) -> Response:
        """``GET /props``: llama.cpp's server properties, ``total_slots`` first of all."""
        cfg = self._config
        # The simulator enforces no context size, so it reports no n_ctx: no guess.
        settings = {"params": {"n_predict": -1, "max_tokens": -1, "stream": False}}
        return JSONResponse(
            {
                "default_generation_settings": settings,
                "total_slots": cfg.slots,
                "model_alias": cfg.model,
                "model_path": cfg.model,
                "modalities": {"vision": False, "audio": False},
                "endpoint_slots": True,
                "endpoint_props": False,
                "endpoint_metrics": False,
                "webui": False,
                "chat_template": CHAT_TEMPLATE,
                "bos_token": BOS_TOKEN,
                "eos_token": EOS_TOKEN,
                "build_info": "wirecut-simulator",
            }
        )

    async def tokenize(self, request: Request) -> Response:
        """``POST /tokenize``: ``{"tokens": [id, ...]}``, or ``[{"id", "piece"}, ...]``."""
        body = await _body(request, _openai_format.error_body)
        if isinstance(body, Response):
            return body
        try:
            with_pieces = optional(body, "with_pieces", bool, "a boolean") or False
            optional(body, "add_special", bool, "a boolean")  # no BOS to add (ChatML)
            parse_special = optional(body, "parse_special", bool, "a boolean")
            tokens = self._tokens(body.get("content"), parse_special is not False)
        except BadRequest as exc:
            return _bad(_openai_format.error_body, exc)
        if with_pieces:
            return JSONResponse({"tokens": [{"id": t.id, "piece": t.piece_json()} for t in tokens]})
        return JSONResponse({"tokens": [t.id for t in tokens]})

    async def detokenize(self, request: Request) -> Response:
        """``POST /detokenize``: ``{"content": "..."}`` for ``{"tokens": [id, ...]}``."""
        body = await _body(request, _openai_format.error_body)
        if isinstance(body, Response):
            return body
        ids = body.get("tokens", [])
        try:
            if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
                raise BadRequest("'tokens' must be an array of token ids", "tokens")
            content = self._tokenizer.detokenize(ids)
        except BadRequest as exc:
            return _bad(_openai_format.error_body, exc)
        except UnknownToken as exc:
            return _bad(_openai_format.error_body, BadRequest(str(exc), "tokens"))
        return JSONResponse({"content": content})

    async def apply_template(self, request: Request) -> Response:
        """``POST /apply-template``: ``{"prompt": "..."}``, the prompt of chat ``messages``."""
        body = await _body(request, _openai_format.error_body)
        if isinstance(body, Response):
            return body
        try:
            messages = check_messages(body)
        except BadRequest as exc:
            return _bad(_openai_format.error_body, exc)
        return JSONResponse({"prompt": apply_template(messages)})

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}`` for a Messages body."""
        try:
            raw = await request.body()
        except ClientDisconnect:
            return Response(status_code=400)
        try:
            parsed = parse_messages_request(raw)
        except BadRequest as exc:
            return _bad(_anthropic_format.error_body, exc)
        return JSONResponse({"input_tokens": parsed.prompt_tokens})

    def _tokens(self, content: object, parse_special: bool) -> list[Token]:
        # llama.cpp: no content, no tokens; a list mixes text and token ids.
        if content is None:
            return []
        if isinstance(content, str):
            return self._tokenizer.tokenize(content, parse_special=parse_special)
        if isinstance(content, list) and all(isinstance(c, str) or _is_int(c) for c in content):
            tokens: list[Token] = []
            for part in content:
                if isinstance(part, str):
                    tokens += self._tokenizer.tokenize(part, parse_special=parse_special)
                else:
                    try:
                        tokens.append(self._tokenizer.lookup(part))
                    except UnknownToken as exc:
                        raise BadRequest(str(exc), "content") from None
            return tokens
        raise BadRequest(
            "'content' must be a string or an array of strings and token ids", "content"
        )


async def _body(request: Request, error_body: ErrorBody) -> dict[str, Any] | Response:
    try:
        raw = await request.body()
    except ClientDisconnect:
        return Response(status_code=400)
    try:
        return load_object(raw)
    except BadRequest as exc:
        return _bad(error_body, exc)


def _bad(error_body: ErrorBody, exc: BadRequest) -> JSONResponse:
    body = error_body(exc.message, "invalid_request_error", exc.param)
    return JSONResponse(body, status_code=400)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
