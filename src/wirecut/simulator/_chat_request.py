"""Parse and validate a ``POST /v1/chat/completions`` body at the boundary.

A bad body is a ``BadRequest`` that names the field and why; the app turns it
into OpenAI's 400 error shape. Pure functions; call from anywhere.
"""

from __future__ import annotations

from wirecut.simulator._request import (
    MAX_TOKENS_LIMIT,
    Api,
    BadRequest,
    GenerationRequest,
    check_messages,
    load_object,
    optional,
    token_limit,
)

__all__ = ["MAX_TOKENS_LIMIT", "BadRequest", "parse_chat_request"]


def parse_chat_request(raw: bytes) -> GenerationRequest:
    """Validate ``raw`` as a chat-completion body; raise ``BadRequest`` if it is not one."""
    body = load_object(raw)
    messages = check_messages(body)
    stream = optional(body, "stream", bool, "a boolean") or False
    stream_options = optional(body, "stream_options", dict, "an object") or {}
    include_usage = (
        optional(stream_options, "include_usage", bool, "a boolean", "stream_options.") or False
    )
    optional(body, "tools", list, "an array")
    # OpenAI's newer name wins when both are given.
    max_tokens = token_limit(body, "max_tokens", "max_completion_tokens")
    return GenerationRequest.of_messages(
        Api.CHAT,
        body,
        messages,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        model=optional(body, "model", str, "a string"),
    )
