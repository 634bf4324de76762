"""``/v1/responses`` wire shapes (the OpenAI Responses API), as llama.cpp and vLLM emit them.

A stream is named server-sent events (``event: TYPE`` then ``data: {...}``),
without ``[DONE]``: ``response.created`` and ``response.in_progress`` with
the first token; ``response.output_item.added`` and
``response.content_part.added`` when the message begins, then
``response.output_text.delta`` per piece of text; ``response.output_item.added``
and ``response.function_call_arguments.delta`` for a tool call; at the end
each item's ``.done`` events, then ``response.completed`` with ``usage``.
Like llama.cpp every item is closed at the end; like vLLM a reply that the
token limit cut is ``status: "incomplete"`` (still in ``response.completed``).
Every event carries the fields of OpenAI's own (``sequence_number``,
``output_index``, ``content_index``), a superset of llama.cpp's, so that the
official SDK's stream helper can follow it. ``ResponsesWire`` is one per
response, used by its task only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from wirecut.simulator._pieces import Piece
from wirecut.simulator._wire import Finish, Usage

__all__ = ["ResponsesWire"]


@dataclass(slots=True)
class _Call:
    """A function-call output item under way."""

    output_index: int
    item_id: str
    call_id: str
    name: str
    arguments: list[str] = field(default_factory=list)

    def item(self, status: str) -> dict[str, object]:
        return {
            "id": self.item_id,
            "type": "function_call",
            "status": status,
            "call_id": self.call_id,
            "name": self.name,
            "arguments": "".join(self.arguments) if status == "completed" else "",
        }


class ResponsesWire:
    """``/v1/responses`` on the wire."""

    def __init__(self, response_id: str, model: str, created: int, prompt_tokens: int) -> None:
        self._id = response_id
        self._model = model
        self._created = created
        self._prompt_tokens = prompt_tokens
        self._message_id = "msg_" + response_id.removeprefix("resp_")
        self._sequence = 0
        self._started = False
        # The message item's output index once it began, and its text so far.
        self._text_index: int | None = None
        self._text: list[str] = []
        self._calls: dict[int, _Call] = {}

    # -- stream -------------------------------------------------------------

    def token(self, piece: Piece) -> bytes:
        out = self._open()
        if piece.tool_index is None:
            if self._text_index is None:
                self._text_index = self._next_output_index()
                out += self._event(
                    "response.output_item.added",
                    output_index=self._text_index,
                    item=self._message("in_progress", ""),
                )
                out += self._event(
                    "response.content_part.added",
                    item_id=self._message_id,
                    output_index=self._text_index,
                    content_index=0,
                    part=_text_part(""),
                )
            self._text.append(piece.content)
            return out + self._event(
                "response.output_text.delta",
                item_id=self._message_id,
                output_index=self._text_index,
                content_index=0,
                delta=piece.content,
                logprobs=[],
            )
        if piece.tool_header is not None:
            header = piece.tool_header
            call = _Call(
                output_index=self._next_output_index(),
                item_id=f"fc_{self._id.removeprefix('resp_')}_{piece.tool_index}",
                call_id=header.id,
                name=header.name,
            )
            self._calls[piece.tool_index] = call
            return out + self._event(
                "response.output_item.added",
                output_index=call.output_index,
                item=call.item("in_progress"),
            )
        call = self._calls[piece.tool_index]
        call.arguments.append(piece.arguments)
        return out + self._event(
            "response.function_call_arguments.delta",
            item_id=call.item_id,
            output_index=call.output_index,
            delta=piece.arguments,
        )

    def end(self, finish: Finish, usage: Usage) -> bytes:
        out = self._open()
        if self._text_index is not None:
            text = "".join(self._text)
            where = {"item_id": self._message_id, "output_index": self._text_index}
            out += self._event("response.output_text.done", **where, content_index=0, text=text)
            out += self._event(
                "response.content_part.done", **where, content_index=0, part=_text_part(text)
            )
            out += self._event(
                "response.output_item.done",
                output_index=self._text_index,
                item=self._message("completed", text),
            )
        for call in self._calls.values():
            out += self._event(
                "response.function_call_arguments.done",
                item_id=call.item_id,
                output_index=call.output_index,
                arguments="".join(call.arguments),
            )
            out += self._event(
                "response.output_item.done",
                output_index=call.output_index,
                item=call.item("completed"),
            )
        return out + self._event("response.completed", response=self._response(finish, usage))

    # -- non-stream -----------------------------------------------------------

    def whole(self, pieces: Sequence[Piece], finish: Finish, usage: Usage) -> dict[str, object]:
        for piece in pieces:
            self.token(piece)  # builds the same items the stream would have sent
        return self._response(finish, usage)

    # -- shapes -------------------------------------------------------------

    def _open(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        response = self._response(None, None)
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def _response(self, finish: Finish | None, usage: Usage | None) -> dict[str, object]:
        output: list[dict[str, object]] = []
        if finish is not None:
            items: list[tuple[int, dict[str, object]]] = [
                (call.output_index, call.item("completed")) for call in self._calls.values()
            ]
            if self._text_index is not None:
                items.append((self._text_index, self._message("completed", "".join(self._text))))
            output = [item for _, item in sorted(items, key=lambda pair: pair[0])]
        if finish is None:
            status, incomplete = "in_progress", None
        elif finish is Finish.LENGTH:
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        else:
            status, incomplete = "completed", None
        return {
            "id": self._id,
            "object": "response",
            "created_at": self._created,
            "status": status,
            "model": self._model,
            "output": output,
            "incomplete_details": incomplete,
            "error": None,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": None if usage is None else _usage(usage),
        }

    def _message(self, status: str, text: str) -> dict[str, object]:
        return {
            "id": self._message_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [] if status == "in_progress" else [_text_part(text)],
        }

    def _next_output_index(self) -> int:
        return len(self._calls) + (self._text_index is not None)

    def _event(self, kind: str, **fields: object) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        payload = json.dumps(data, separators=(",", ":")).encode()
        return b"event: " + kind.encode() + b"\ndata: " + payload + b"\n\n"


def _text_part(text: str) -> dict[str, object]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _usage(usage: Usage) -> dict[str, object]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }
