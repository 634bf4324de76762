"""What every generation route parses its body into, and the checks they share.

Each route (``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``,
``/v1/messages``) has its own parser module; each turns a valid body into a
``GenerationRequest`` and a bad one into a ``BadRequest`` that names the
field and why. Pure functions; call from anywhere.
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from wirecut.simulator._tokenizer import apply_template, count_tokens

__all__ = [
    "MAX_TOKENS_LIMIT",
    "Api",
    "BadRequest",
    "GenerationRequest",
    "check_messages",
    "load_object",
    "optional",
    "short",
    "token_limit",
]

#: The largest ``max_tokens`` accepted: llama.cpp keeps ``n_predict`` in a
#: 32-bit int, and any count up to it is a usable bound in Python.
MAX_TOKENS_LIMIT = 2**31 - 1

_T = TypeVar("_T")


class Api(enum.Enum):
    """A generation route; the value is its path (what the logs name)."""

    CHAT = "/v1/chat/completions"
    TEXT = "/v1/completions"
    RESPONSES = "/v1/responses"
    MESSAGES = "/v1/messages"


class BadRequest(Exception):
    """The request body is unusable; ``param`` names the offending field, if one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """The fields of a generation request that the simulator acts on, whatever its route.

    ``messages`` is the request in chat-completions form (each message's text
    a string for converted routes): it seeds the generated words, and its
    template is what ``prompt_tokens`` counts, as llama.cpp counts a prompt.
    """

    api: Api
    body: dict[str, Any]
    messages: list[dict[str, Any]]
    prompt_tokens: int
    stream: bool
    include_usage: bool
    max_tokens: int | None
    model: str | None

    @classmethod
    def of_messages(
        cls,
        api: Api,
        body: dict[str, Any],
        messages: list[dict[str, Any]],
        *,
        stream: bool,
        max_tokens: int | None,
        model: str | None,
        include_usage: bool = False,
    ) -> GenerationRequest:
        """A request whose prompt is the template of ``messages``."""
        return cls(
            api=api,
            body=body,
            messages=messages,
            prompt_tokens=count_tokens(apply_template(messages)),
            stream=stream,
            include_usage=include_usage,
            max_tokens=max_tokens,
            model=model,
        )

    def responder_body(self) -> dict[str, Any]:
        """The body a ``Responder`` gets: as sent, with ``messages`` in chat form."""
        if self.api is Api.CHAT:
            return self.body
        return {**self.body, "messages": self.messages}


def load_object(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object; ``BadRequest`` saying why if it is not one."""
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
    return body


def optional(
    body: Mapping[str, Any], name: str, kind: type[_T], what: str, prefix: str = ""
) -> _T | None:
    """``body[name]`` if it is a ``kind``, None if absent or null; else ``BadRequest``."""
    value = body.get(name)
    if value is None:
        return None
    # bool is an int in Python, but `"max_tokens": true` is not a count.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        param = prefix + name
        raise BadRequest(f"'{param}' must be {what}, got {type(value).__name__}", param)
    return value


def token_limit(body: Mapping[str, Any], *names: str) -> int | None:
    """The token limit that ``names`` give (each in 1..MAX_TOKENS_LIMIT); the last present wins."""
    limit = None
    for name in names:
        value = optional(body, name, int, "an integer")
        if value is not None:
            if not 1 <= value <= MAX_TOKENS_LIMIT:
                raise BadRequest(
                    f"'{name}' must be between 1 and {MAX_TOKENS_LIMIT}, got {short(value)}", name
                )
            limit = value
    return limit


def check_messages(body: Mapping[str, Any], name: str = "messages") -> list[Any]:
    """``body[name]``: a non-empty array of objects with a string ``role``."""
    if name not in body:
        raise BadRequest(f"'{name}' is required", name)
    messages = body[name]
    if not isinstance(messages, list):
        raise BadRequest(f"'{name}' must be an array of message objects", name)
    if not messages:
        raise BadRequest(f"'{name}' must not be empty", name)
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"'{name}[{i}]' must be an object", f"{name}[{i}]")
        if not isinstance(message.get("role"), str):
            raise BadRequest(f"'{name}[{i}].role' must be a string", f"{name}[{i}].role")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise BadRequest(
                f"'{name}[{i}].content' must be a string, an array of parts or null",
                f"{name}[{i}].content",
            )
    return messages


def short(value: int) -> str:
    """A client's number as an error quotes it: its size if it has thousands of digits."""
    text = str(value)
    return text if len(text) <= 24 else f"a number of {len(text)} digits"
