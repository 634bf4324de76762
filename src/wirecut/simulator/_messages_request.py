"""Parse and validate a ``POST /v1/messages`` body (the Anthropic Messages API).

The request becomes chat messages as llama.cpp converts it: ``system`` a
system message first; each message's text blocks its text; ``tool_use``
blocks an assistant's tool calls; ``tool_result`` blocks tool messages.
``max_tokens`` is the token limit; without one, llama.cpp's default of 4096
applies (Anthropic requires it; llama.cpp is lenient). A bad body is a
``BadRequest`` naming the field. Pure functions; call from anywhere.
"""

from __future__ import annotations

import json
from typing import Any

from wirecut._content import content_text
from wirecut.simulator._request import (
    Api,
    BadRequest,
    GenerationRequest,
    check_messages,
    load_object,
    optional,
    token_limit,
)

__all__ = ["DEFAULT_MAX_TOKENS", "parse_messages_request"]

#: The ``max_tokens`` llama.cpp gives an Anthropic request that sets none.
DEFAULT_MAX_TOKENS = 4096


def parse_messages_request(raw: bytes) -> GenerationRequest:
    """Validate ``raw`` as a Messages body; raise ``BadRequest`` if it is not one."""
    body = load_object(raw)
    converted: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        if not isinstance(system, str | list):
            raise BadRequest("'system' must be a string or an array of text blocks", "system")
        converted.append({"role": "system", "content": content_text(system)})
    for i, message in enumerate(check_messages(body)):
        converted.extend(_convert(message, f"messages[{i}]"))
    optional(body, "tools", list, "an array")
    limit = token_limit(body, "max_tokens")
    return GenerationRequest.of_messages(
        Api.MESSAGES,
        body,
        converted,
        stream=optional(body, "stream", bool, "a boolean") or False,
        max_tokens=DEFAULT_MAX_TOKENS if limit is None else limit,
        model=optional(body, "model", str, "a string"),
    )


def _convert(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    role, content = message["role"], message.get("content")
    if not isinstance(content, list):
        return [{"role": role, "content": content or ""}]
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        if not isinstance(block, dict):
            raise BadRequest(f"'{where}.content[{j}]' must be an object", f"{where}.content[{j}]")
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            function = {"name": block.get("name") or "", "arguments": arguments}
            calls.append({"id": block.get("id") or "", "type": "function", "function": function})
        elif kind == "tool_result":
            result = {"role": "tool", "tool_call_id": block.get("tool_use_id") or ""}
            results.append({**result, "content": content_text(block.get("content"))})
    out: list[dict[str, Any]] = []
    if text or calls:
        turn: dict[str, Any] = {"role": role, "content": "".join(text)}
        if calls:
            turn["tool_calls"] = calls
        out.append(turn)
    return out + results
