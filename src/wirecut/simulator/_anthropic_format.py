"""``/v1/messages`` wire shapes (the Anthropic Messages API), as llama.cpp emits them.

A stream is named server-sent events (``event: TYPE`` then ``data: {...}``),
without ``[DONE]``: ``message_start`` (with ``usage.input_tokens``) with the
first token; ``content_block_start`` when the text block (index 0) or a
``tool_use`` block (after it) begins, ``content_block_delta`` per piece
(``text_delta`` or ``input_json_delta``); at the end ``content_block_stop``
for each block, ``message_delta`` with ``stop_reason`` and
``usage.output_tokens``, and ``message_stop``. A ``tool_use`` block starts
with ``input: {}``, as Anthropic's own do. Errors are Anthropic's shape.
``MessagesWire`` is one per response, used by its task only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from wirecut.simulator._pieces import Piece
from wirecut.simulator._wire import Finish, Usage

__all__ = ["MessagesWire", "error_body"]

_STOP_REASONS = {
    Finish.STOP: "end_turn",
    Finish.LENGTH: "max_tokens",
    Finish.TOOL_CALLS: "tool_use",
}
# OpenAI's error types where Anthropic names them differently.
_ERROR_TYPES = {"server_error": "api_error"}


def error_body(message: str, type_: str, param: str | None = None) -> dict[str, object]:
    """Anthropic's error object: ``{"type": "error", "error": {"type", "message"}}``.

    It has no ``param``: the message names the field.
    """
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(type_, type_), "message": message}}


class MessagesWire:
    """``/v1/messages`` on the wire."""

    def __init__(self, message_id: str, model: str, prompt_tokens: int) -> None:
        self._id = message_id
        self._model = model
        self._prompt_tokens = prompt_tokens
        self._started = False
        self._text: list[str] | None = None
        # Each tool call's block: its content-block index, name, id and input so far.
        self._calls: dict[int, tuple[int, str, str, list[str]]] = {}

    def token(self, piece: Piece) -> bytes:
        out = self._open()
        if piece.tool_index is None:
            if self._text is None:
                self._text = []
                text_block = {"type": "text", "text": ""}
                out += _event("content_block_start", index=0, content_block=text_block)
            self._text.append(piece.content)
            delta = {"type": "text_delta", "text": piece.content}
            return out + _event("content_block_delta", index=0, delta=delta)
        if piece.tool_header is not None:
            header = piece.tool_header
            index = (self._text is not None) + piece.tool_index
            self._calls[piece.tool_index] = (index, header.id, header.name, [])
            tool_block = {"type": "tool_use", "id": header.id, "name": header.name, "input": {}}
            return out + _event("content_block_start", index=index, content_block=tool_block)
        index, _, _, arguments = self._calls[piece.tool_index]
        arguments.append(piece.arguments)
        delta = {"type": "input_json_delta", "partial_json": piece.arguments}
        return out + _event("content_block_delta", index=index, delta=delta)

    def end(self, finish: Finish, usage: Usage) -> bytes:
        out = self._open()
        blocks = [0] if self._text is not None else []
        blocks += [index for index, _, _, _ in self._calls.values()]
        for index in blocks:
            out += _event("content_block_stop", index=index)
        delta = {"stop_reason": _STOP_REASONS[finish], "stop_sequence": None}
        output = {"output_tokens": usage.completion_tokens}
        out += _event("message_delta", delta=delta, usage=output)
        return out + _event("message_stop")

    def whole(self, pieces: Sequence[Piece], finish: Finish, usage: Usage) -> dict[str, object]:
        for piece in pieces:
            self.token(piece)  # builds the same blocks the stream would have sent
        content: list[dict[str, object]] = []
        if self._text is not None:
            content.append({"type": "text", "text": "".join(self._text)})
        for _, call_id, name, arguments in self._calls.values():
            call = {"type": "tool_use", "id": call_id, "name": name, "input": _input(arguments)}
            content.append(call)
        counts = {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}
        return {**self._message(content, _STOP_REASONS[finish]), "usage": counts}

    def _open(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        message = {
            **self._message([], None),
            "usage": {"input_tokens": self._prompt_tokens, "output_tokens": 0},
        }
        return _event("message_start", message=message)

    def _message(
        self, content: list[dict[str, object]], stop_reason: str | None
    ) -> dict[str, object]:
        return {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": self._model,
            "stop_reason": stop_reason,
            "stop_sequence": None,
        }


def _input(arguments: list[str]) -> object:
    # llama.cpp sends {} for arguments that are no JSON (a call cut by max_tokens).
    try:
        return json.loads("".join(arguments))
    except ValueError:
        return {}


def _event(kind: str, **fields: object) -> bytes:
    payload = json.dumps({"type": kind, **fields}, separators=(",", ":")).encode()
    return b"event: " + kind.encode() + b"\ndata: " + payload + b"\n\n"
