"""Scripted replies: a hook that lets an agent test decide what the "model" says.

A ``Responder`` is a plain callable given to ``Simulator``/``SimulatorServer``.
For each generation request it receives the parsed request body (a dict)
and returns either None (generate the usual deterministic words) or an
assistant message::

    {"content": "Let me look.",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "shell", "arguments": "{\\"cmd\\": \\"ls\\"}"}}]}

``arguments`` may also be a dict (it is JSON-encoded); ``id`` and ``type`` may
be left out. The reply is streamed or returned in the route's format with the
usual timing: its content and arguments are tokens as the simulator's
tokenizer splits them (about one per word), and each tool call's header one
more. ``max_tokens`` still cuts it (``finish_reason`` "length").

Every route's body reaches the responder with ``messages`` in chat-completions
form: ``/v1/chat/completions`` as sent; ``/v1/completions`` with its prompt as
one user message; ``/v1/responses`` and ``/v1/messages`` with their input
converted as llama.cpp converts it (each message's text as a string). A
scripted reply with tool calls on ``/v1/completions``, which has none, is a
500 that says so.

The responder runs on the server's event-loop thread: it must be quick and
must not block. ``directive_responder`` is a ready-made responder that reads
the reply from the last user message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from wirecut.simulator._pieces import Piece, ScriptedToolCall, text_pieces

__all__ = [
    "DIRECTIVE_PREFIX",
    "Piece",
    "Responder",
    "ScriptedReply",
    "ScriptedToolCall",
    "directive_responder",
]

Responder = Callable[[dict[str, Any]], Mapping[str, Any] | None]

DIRECTIVE_PREFIX = "#sim-reply"


@dataclass(frozen=True, slots=True)
class ScriptedReply:
    """An assistant message that a responder asked for, validated."""

    content: str | None
    tool_calls: tuple[ScriptedToolCall, ...]

    @classmethod
    def from_json(cls, reply: Mapping[str, Any], id_prefix: str) -> ScriptedReply:
        """Validate a responder's return value; a bad shape is a ValueError naming the field.

        A tool call without an ``id`` gets ``call_{id_prefix}_{index}``.
        """
        content = reply.get("content")
        if content is not None and not isinstance(content, str):
            raise ValueError("scripted reply: 'content' must be a string or null")
        raw_calls = reply.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise ValueError("scripted reply: 'tool_calls' must be a list")
        calls: list[ScriptedToolCall] = []
        for i, raw in enumerate(raw_calls):
            where = f"scripted reply: tool_calls[{i}]"
            if not isinstance(raw, Mapping):
                raise ValueError(f"{where} must be an object")
            function = raw.get("function")
            if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                raise ValueError(f"{where}.function.name must be a string")
            arguments = function.get("arguments", "")
            if isinstance(arguments, Mapping):
                arguments = json.dumps(arguments)
            if not isinstance(arguments, str):
                raise ValueError(f"{where}.function.arguments must be a string or an object")
            call_id = raw.get("id") or f"call_{id_prefix}_{i}"
            if not isinstance(call_id, str):
                raise ValueError(f"{where}.id must be a string")
            calls.append(ScriptedToolCall(id=call_id, name=function["name"], arguments=arguments))
        return cls(content=content, tool_calls=tuple(calls))

    def pieces(self) -> Iterator[Piece]:
        """The reply as tokens, in the order a model would emit them.

        The content and each call's arguments are tokens as the simulator's
        tokenizer splits them; a call's header is one token more.
        """
        yield from text_pieces(self.content or "")
        for index, call in enumerate(self.tool_calls):
            yield Piece(tool_index=index, tool_header=call)
            yield from text_pieces(call.arguments, index)


def directive_responder(request: dict[str, Any]) -> Mapping[str, Any] | None:
    """Reply with the JSON after ``#sim-reply`` in the last user message, if any.

    For out-of-process tests that cannot pass a callable: a user message
    ``#sim-reply {"content": null, "tool_calls": [...]}`` makes the simulator
    answer exactly that. Any other request gets the usual generated words.
    A directive that is not a JSON object raises ValueError (the client gets
    a 500 that says why).
    """
    messages = request.get("messages")
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if not isinstance(content, str) or not content.startswith(DIRECTIVE_PREFIX):
                return None
            reply = json.loads(content[len(DIRECTIVE_PREFIX) :])
            if not isinstance(reply, dict):
                raise ValueError(f"{DIRECTIVE_PREFIX} must be followed by a JSON object")
            return reply
    return None
