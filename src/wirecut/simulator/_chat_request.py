"""Parse and validate a ``POST /v1/chat/completions`` body at the boundary.

A bad body is a ``BadRequest`` that names the field and why; the app turns it
into OpenAI's 400 error shape. Pure functions; call from anywhere.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["MAX_TOKENS_LIMIT", "BadRequest", "ChatRequest", "parse_chat_request"]

#: The largest ``max_tokens`` accepted: llama.cpp keeps ``n_predict`` in a
#: 32-bit int, and any count up to it is a usable bound in Python.
MAX_TOKENS_LIMIT = 2**31 - 1

_T = TypeVar("_T")


class BadRequest(Exception):
    """The request body is unusable; ``param`` names the offending field, if one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """The fields of a chat-completion request that the simulator acts on."""

    body: dict[str, Any]
    messages: list[dict[str, Any]]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    model: str | None


def parse_chat_request(raw: bytes) -> ChatRequest:
    """Validate ``raw`` as a chat-completion body; raise ``BadRequest`` if it is not one."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    except ValueError as exc:
        # Python refuses to parse an integer literal of more digits than this.
        raise BadRequest(
            f"request body holds a number of more than {sys.get_int_max_str_digits()} digits"
        ) from exc
    except RecursionError as exc:
        raise BadRequest("request body is nested too deeply") from exc
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")

    if "messages" not in body:
        raise BadRequest("'messages' is required", "messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise BadRequest("'messages' must be an array of message objects", "messages")
    if not messages:
        raise BadRequest("'messages' must not be empty", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"'messages[{i}]' must be an object", f"messages[{i}]")
        if not isinstance(message.get("role"), str):
            raise BadRequest(f"'messages[{i}].role' must be a string", f"messages[{i}].role")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise BadRequest(
                f"'messages[{i}].content' must be a string, an array of parts or null",
                f"messages[{i}].content",
            )

    stream = _optional(body, "stream", bool, "a boolean") or False
    stream_options = _optional(body, "stream_options", dict, "an object") or {}
    include_usage = (
        _optional(stream_options, "include_usage", bool, "a boolean", "stream_options.") or False
    )
    _optional(body, "tools", list, "an array")
    model = _optional(body, "model", str, "a string")

    max_tokens = None
    # OpenAI's newer name wins when both are given.
    for name in ("max_tokens", "max_completion_tokens"):
        value = _optional(body, name, int, "an integer")
        if value is not None:
            if not 1 <= value <= MAX_TOKENS_LIMIT:
                raise BadRequest(
                    f"'{name}' must be between 1 and {MAX_TOKENS_LIMIT}, got {_short(value)}", name
                )
            max_tokens = value

    return ChatRequest(
        body=body,
        messages=messages,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        model=model,
    )


def _optional(
    body: dict[str, Any], name: str, kind: type[_T], what: str, prefix: str = ""
) -> _T | None:
    value = body.get(name)
    if value is None:
        return None
    # bool is an int in Python, but `"max_tokens": true` is not a count.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        param = prefix + name
        raise BadRequest(f"'{param}' must be {what}, got {type(value).__name__}", param)
    return value


def _short(value: int) -> str:
    # A client's number may have thousands of digits: quote its size instead.
    text = str(value)
    return text if len(text) <= 24 else f"a number of {len(text)} digits"
