"""Parse and validate a ``POST /v1/responses`` body (the OpenAI Responses API).

The input becomes chat messages as llama.cpp converts it: ``instructions``
a system message first; a string ``input`` one user message; each item of
an ``input`` array a message (its text parts joined), a ``function_call``
an assistant turn, a ``function_call_output`` a tool message; ``reasoning``
items are skipped. ``max_output_tokens`` is the token limit. The simulator
keeps no responses, so ``previous_response_id`` is refused. A bad body is a
``BadRequest`` naming the field. Pure functions; call from anywhere.
"""

from __future__ import annotations

from typing import Any

from wirecut._content import content_text
from wirecut.simulator._request import (
    Api,
    BadRequest,
    GenerationRequest,
    load_object,
    optional,
    token_limit,
)

__all__ = ["parse_responses_request"]


def parse_responses_request(raw: bytes) -> GenerationRequest:
    """Validate ``raw`` as a Responses body; raise ``BadRequest`` if it is not one."""
    body = load_object(raw)
    if body.get("previous_response_id") is not None:
        raise BadRequest(
            "'previous_response_id' is not supported: the simulator keeps no responses",
            "previous_response_id",
        )
    messages: list[dict[str, Any]] = []
    instructions = optional(body, "instructions", str, "a string")
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
    if "input" not in body:
        raise BadRequest("'input' is required", "input")
    items = body["input"]
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list) and items:
        messages.extend(_message(item, f"input[{i}]") for i, item in enumerate(items))
    else:
        raise BadRequest("'input' must be a string or a non-empty array of items", "input")
    messages = [m for m in messages if m]
    if not messages:
        raise BadRequest("'input' holds no message", "input")
    optional(body, "tools", list, "an array")
    return GenerationRequest.of_messages(
        Api.RESPONSES,
        body,
        messages,
        stream=optional(body, "stream", bool, "a boolean") or False,
        max_tokens=token_limit(body, "max_output_tokens"),
        model=optional(body, "model", str, "a string"),
    )


def _message(item: object, where: str) -> dict[str, Any]:
    """One input item as a chat message; {} for an item that adds no message."""
    if not isinstance(item, dict):
        raise BadRequest(f"'{where}' must be an object", where)
    kind = item.get("type", "message")
    if kind == "message":
        role, content = item.get("role"), item.get("content")
        if not isinstance(role, str):
            raise BadRequest(f"'{where}.role' must be a string", f"{where}.role")
        if not isinstance(content, str | list):
            raise BadRequest(
                f"'{where}.content' must be a string or an array of parts", f"{where}.content"
            )
        return {"role": role, "content": content_text(content)}
    if kind == "function_call":
        for field in ("call_id", "name", "arguments"):
            if not isinstance(item.get(field), str):
                raise BadRequest(f"'{where}.{field}' must be a string", f"{where}.{field}")
        call = {"name": item["name"], "arguments": item["arguments"]}
        tool_call = {"id": item["call_id"], "type": "function", "function": call}
        return {"role": "assistant", "content": "", "tool_calls": [tool_call]}
    if kind == "function_call_output":
        output = item.get("output")
        if not isinstance(item.get("call_id"), str):
            raise BadRequest(f"'{where}.call_id' must be a string", f"{where}.call_id")
        if not isinstance(output, str | list):
            raise BadRequest(
                f"'{where}.output' must be a string or an array of parts", f"{where}.output"
            )
        return {"role": "tool", "tool_call_id": item["call_id"], "content": content_text(output)}
    if kind == "reasoning":
        return {}
    raise BadRequest(
        f"'{where}' is not a message, function_call, function_call_output or reasoning item",
        where,
    )
