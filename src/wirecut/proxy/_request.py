"""A client's completion request, checked at the boundary and rewritten for the upstream.

The proxy looks at a few fields only (``model``, ``stream``, and for chat
and text completions ``stream_options`` and ``n``) and passes the rest as it
came (``tools``, ``response_format``, sampling ...): the upstream checks
what it serves. The upstream request always streams, with usage asked for
(chat and text completions; the Responses and Messages APIs always report
it), whatever the client asked. Each API's own required field is checked:
``messages`` (chat, Messages), ``prompt`` (text), ``input`` (Responses). A
bad body is a ``BadRequest`` that names the field: not JSON, nested deeper
than ``wirecut._json.MAX_DEPTH``, or holding a lone UTF-16 surrogate (what
a front-end sends after cutting a string in the middle of an emoji), which
no upstream could be sent. Pure functions; call them from
any thread or process.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

from wirecut._json import JSONError, loads
from wirecut.proxy._dialects import Endpoint
from wirecut.proxy._events import dumps
from wirecut.proxy._relay import UpstreamRequest

__all__ = ["BadRequest", "ClientRequest", "check_request_id", "parse_request"]

# Visible ASCII without "/" (the id goes into a URL path), 1-128 characters.
_REQUEST_ID = re.compile(r"[!-.0-~]{1,128}")


class BadRequest(Exception):
    """The request cannot be served as sent; ``param`` names the field, if one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, param)
        self.message = message
        self.param = param

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class ClientRequest:
    """A checked request: what the proxy records, and what it sends upstream."""

    model: str | None
    stream: bool
    upstream: UpstreamRequest

    @property
    def endpoint(self) -> Endpoint:
        return self.upstream.endpoint


def check_request_id(value: str) -> str:
    """A client's ``X-Request-Id``, or ``BadRequest`` saying what it may be."""
    if not _REQUEST_ID.fullmatch(value):
        raise BadRequest(
            "X-Request-Id must be 1-128 visible ASCII characters without '/'", "X-Request-Id"
        )
    return value


def parse_request(
    raw: bytes,
    endpoint: Endpoint,
    request_id: str,
    default_model: str | None,
    headers: tuple[tuple[str, str], ...] = (),
) -> ClientRequest:
    """Check ``raw`` as a body of ``endpoint`` and make its upstream request.

    ``headers`` go upstream as they came (see ``UpstreamRequest.headers``).
    """
    try:
        body = loads(raw)
    except JSONError as exc:
        if "nested" in str(exc):
            raise BadRequest(f"the request body is {exc}") from None
        if "digits" in str(exc):
            raise BadRequest(
                "the request body holds a number of more than "
                f"{sys.get_int_max_str_digits()} digits"
            ) from None
        why = str(exc).removeprefix("not JSON (").removesuffix(")")
        raise BadRequest(f"the request body is not valid JSON: {why}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    stream = _optional(body, "stream", bool, "a boolean") or False
    model = _optional(body, "model", str, "a string")
    if model is None and default_model is not None:
        body["model"] = model = default_model
    include_usage = False
    choices = 1
    if endpoint in (Endpoint.CHAT, Endpoint.MESSAGES):
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty array of message objects", "messages")
    elif endpoint is Endpoint.TEXT and "prompt" not in body:
        raise BadRequest("'prompt' is required", "prompt")
    elif endpoint is Endpoint.RESPONSES and not isinstance(body.get("input"), str | list):
        raise BadRequest("'input' must be a string or an array of input items", "input")
    if endpoint in (Endpoint.CHAT, Endpoint.TEXT):
        options = _optional(body, "stream_options", dict, "an object") or {}
        include_usage = bool(options.get("include_usage")) if stream else False
        choices = _optional(body, "n", int, "a whole number") or 1
        body["stream"] = True
        body["stream_options"] = {**options, "include_usage": True}
    else:
        body["stream"] = True
    try:
        encoded = dumps(body)
    except UnicodeEncodeError as exc:
        lone = exc.object[exc.start : exc.end].encode("unicode_escape").decode()
        raise BadRequest(
            f"the request body holds a lone UTF-16 surrogate ({lone}): a string cut in the "
            "middle of a character; send whole characters"
        ) from None
    upstream = UpstreamRequest(
        id=request_id,
        endpoint=endpoint,
        body=encoded,
        stream=stream,
        include_usage=include_usage,
        choices=max(choices, 1),
        headers=headers,
    )
    return ClientRequest(model=model, stream=stream, upstream=upstream)


def _optional(body: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise BadRequest(f"'{name}' must be {what}, not {type(value).__name__}", name)
    return value
