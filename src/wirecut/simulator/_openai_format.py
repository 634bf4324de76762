"""OpenAI chat wire shapes: stream chunks, the non-stream completion, errors.

Pure functions, and ``ChatWire`` (one per response, used by its task only).
Shapes follow the OpenAI chat API as llama.cpp's server emits them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from wirecut.simulator._pieces import Piece
from wirecut.simulator._wire import Finish, Usage

__all__ = [
    "DONE",
    "ChatWire",
    "chunk",
    "completion",
    "delta_for",
    "error_body",
    "json_bytes",
    "message_for",
    "sse",
    "usage",
]

DONE = b"data: [DONE]\n\n"


def json_bytes(payload: dict[str, object]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def sse(payload: dict[str, object]) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def error_body(message: str, type_: str, param: str | None = None) -> dict[str, object]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": None}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def delta_for(piece: Piece, first: bool) -> dict[str, object]:
    """The ``choices[0].delta`` that streams one token; the first also names the role."""
    delta: dict[str, object] = {"role": "assistant"} if first else {}
    if piece.tool_index is None:
        delta["content"] = piece.content
        return delta
    if first:
        delta["content"] = None
    function: dict[str, object] = {"arguments": piece.arguments}
    call: dict[str, object] = {"index": piece.tool_index}
    if piece.tool_header is not None:
        call["id"] = piece.tool_header.id
        call["type"] = "function"
        function = {"name": piece.tool_header.name, "arguments": ""}
    call["function"] = function
    delta["tool_calls"] = [call]
    return delta


def chunk(
    completion_id: str,
    model: str,
    created: int,
    delta: dict[str, object],
    finish_reason: str | None = None,
) -> dict[str, object]:
    """A ``chat.completion.chunk`` with one choice."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def message_for(pieces: Iterable[Piece]) -> dict[str, object]:
    """The assistant message that the given tokens add up to (non-stream mode)."""
    content: list[str] = []
    calls: list[dict[str, object]] = []
    arguments: list[list[str]] = []
    for piece in pieces:
        if piece.tool_index is None:
            content.append(piece.content)
        elif piece.tool_header is not None:
            arguments.append([])
            calls.append(
                {
                    "id": piece.tool_header.id,
                    "type": "function",
                    "function": {"name": piece.tool_header.name, "arguments": ""},
                }
            )
        else:
            arguments[piece.tool_index].append(piece.arguments)
    for call, parts in zip(calls, arguments, strict=True):
        function = call["function"]
        assert isinstance(function, dict)
        function["arguments"] = "".join(parts)
    message: dict[str, object] = {
        "role": "assistant",
        "content": "".join(content) if content or not calls else None,
    }
    if calls:
        message["tool_calls"] = calls
    return message


def completion(
    completion_id: str,
    model: str,
    created: int,
    message: dict[str, object],
    finish_reason: str,
    usage_: dict[str, int],
) -> dict[str, object]:
    """A non-stream ``chat.completion`` with one choice and ``usage``."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage_,
    }


class ChatWire:
    """``/v1/chat/completions`` on the wire: one chunk per piece, ``[DONE]`` last."""

    def __init__(self, completion_id: str, model: str, created: int, include_usage: bool) -> None:
        self._id = completion_id
        self._model = model
        self._created = created
        self._include_usage = include_usage
        self._first = True

    def token(self, piece: Piece) -> bytes:
        delta = delta_for(piece, first=self._first)
        self._first = False
        return sse(chunk(self._id, self._model, self._created, delta))

    def end(self, finish: Finish, usage_: Usage) -> bytes:
        body = sse(chunk(self._id, self._model, self._created, {}, finish.value))
        if self._include_usage:
            usage_chunk = chunk(self._id, self._model, self._created, {})
            usage_chunk["choices"] = []
            usage_chunk["usage"] = usage(usage_.prompt_tokens, usage_.completion_tokens)
            body += sse(usage_chunk)
        return body + DONE

    def whole(self, pieces: Sequence[Piece], finish: Finish, usage_: Usage) -> dict[str, object]:
        return completion(
            self._id,
            self._model,
            self._created,
            message_for(pieces),
            finish.value,
            usage(usage_.prompt_tokens, usage_.completion_tokens),
        )
