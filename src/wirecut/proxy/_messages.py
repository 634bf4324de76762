"""``/v1/messages`` (Anthropic's Messages API) as the proxy reads it.

A stream is named events and no ``[DONE]``: ``message_start`` (the model,
and ``usage.input_tokens``: the prompt's count comes first),
``content_block_start`` / ``content_block_delta`` (generated text, a tool
call's JSON, thinking) / ``content_block_stop`` per block, ``message_delta``
(``stop_reason``, ``usage.output_tokens``), and ``message_stop``, the end of
a whole answer; an ``error`` event is the upstream's error. A client that
asked for no stream gets the ``message`` that ``MessagesAssembler`` builds
from the events; an upstream that answered whole is turned into the events.

For counting a prompt with the upstream's chat template, the request becomes
chat messages as llama.cpp converts it (``system`` first, text blocks
joined, ``tool_use`` an assistant's tool calls, ``tool_result`` a tool
message).

Pure functions, and ``MessagesAssembler`` (one per request).
"""

from __future__ import annotations

import json
from typing import Any

from wirecut._content import content_text
from wirecut._json import JSONError, loads
from wirecut.proxy._events import typed_event
from wirecut.proxy._tally import Tally

__all__ = [
    "READ",
    "MessagesAssembler",
    "answer_texts",
    "chat_messages",
    "event_texts",
    "look_whole",
    "whole_events",
]

#: The events the proxy parses; every other one passes as it came.
READ = frozenset({"message_start", "message_delta", "message_stop", "error"})
_DELTA_TEXT = ("text", "partial_json", "thinking")


def saw(name: str, chunk: dict[str, Any], tally: Tally) -> None:
    """Note in ``tally`` what a parsed event says (the model, the usage, the end)."""
    if name == "message_start":
        message = chunk.get("message")
        if isinstance(message, dict):
            tally.saw_model(message.get("model"))
            usage = message.get("usage")
            if isinstance(usage, dict):
                tally.report(prompt=usage.get("input_tokens"))
    elif name == "message_delta":
        usage = chunk.get("usage")
        delta = chunk.get("delta")
        # output_tokens is counted from the start: final once a stop_reason comes.
        if isinstance(delta, dict) and delta.get("stop_reason") and isinstance(usage, dict):
            tally.report(usage.get("input_tokens"), usage.get("output_tokens"))
    elif name == "message_stop":
        tally.ended = True


def event_texts(name: str | None, chunk: dict[str, Any]) -> list[str]:
    """The generated text one event carries (a delta, or a tool call's name)."""
    kind = name or chunk.get("type")
    if kind == "content_block_delta":
        delta = chunk.get("delta")
        if isinstance(delta, dict):
            return [delta[key] for key in _DELTA_TEXT if isinstance(delta.get(key), str)]
    elif kind == "content_block_start":
        block = chunk.get("content_block")
        if isinstance(block, dict) and block.get("type") == "tool_use":
            return [block["name"]] if isinstance(block.get("name"), str) else []
    return []


def answer_texts(answer: dict[str, Any]) -> list[str]:
    """The generated text of a whole ``message``."""
    texts: list[str] = []
    for block in answer.get("content") or ():
        if not isinstance(block, dict):
            continue
        for key in ("text", "thinking", "name"):
            if isinstance(block.get(key), str):
                texts.append(block[key])
        if block.get("type") == "tool_use":
            texts.append(json.dumps(block.get("input") or {}, ensure_ascii=False))
    return texts


def look_whole(answer: Any, tally: Tally) -> bool:
    """Whether ``answer`` (an upstream's unstreamed answer) is a message; notes it in ``tally``."""
    if not isinstance(answer, dict) or not isinstance(answer.get("content"), list):
        return False
    tally.saw_whole(answer, answer_texts(answer), ended=True)
    return True


class MessagesAssembler:
    """Builds the non-stream ``message`` from the events."""

    def __init__(self) -> None:
        self._message: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}

    def add(self, name: str, chunk: dict[str, Any]) -> None:
        index = chunk.get("index")
        if name == "message_start" and isinstance(chunk.get("message"), dict):
            self._message = dict(chunk["message"])
        elif name == "content_block_start" and isinstance(index, int):
            block = chunk.get("content_block")
            self._blocks[index] = dict(block) if isinstance(block, dict) else {}
        elif name == "content_block_delta" and isinstance(index, int):
            self._delta(self._blocks.setdefault(index, {}), index, chunk.get("delta"))
        elif name == "content_block_stop" and isinstance(index, int):
            self._close(index)
        elif name == "message_delta":
            delta = chunk.get("delta")
            if isinstance(delta, dict):
                self._message.update(delta)
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                known = self._message.get("usage")
                self._message["usage"] = {**(known if isinstance(known, dict) else {}), **usage}

    def _delta(self, block: dict[str, Any], index: int, delta: object) -> None:
        if not isinstance(delta, dict):
            return
        kind = delta.get("type")
        if kind == "text_delta" and isinstance(delta.get("text"), str):
            block["text"] = str(block.get("text") or "") + delta["text"]
        elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            self._json.setdefault(index, []).append(delta["partial_json"])
        elif kind == "thinking_delta" and isinstance(delta.get("thinking"), str):
            block["thinking"] = str(block.get("thinking") or "") + delta["thinking"]
        elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
            block["signature"] = delta["signature"]
        elif kind == "citations_delta" and "citation" in delta:
            block.setdefault("citations", []).append(delta["citation"])

    def _close(self, index: int) -> None:
        parts = self._json.pop(index, None)
        if parts is None:
            return
        try:
            value = loads("".join(parts)) if "".join(parts).strip() else {}
        except JSONError:
            value = {}  # As llama.cpp does for arguments that are no JSON.
        self._blocks.setdefault(index, {})["input"] = value

    def result(self) -> dict[str, Any]:
        for index in list(self._json):
            self._close(index)
        message = dict(self._message)
        message["content"] = [block for _, block in sorted(self._blocks.items())]
        return message


def whole_events(answer: dict[str, Any]) -> bytes:
    """A whole ``message`` as the events of a stream."""
    given = answer.get("usage")
    usage: dict[str, Any] = given if isinstance(given, dict) else {}
    start = {
        **answer,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    out = [typed_event("message_start", message=start)]
    for index, block in enumerate(answer.get("content") or ()):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            begun = {**block, "text": ""}
            out.append(typed_event("content_block_start", index=index, content_block=begun))
            delta = {"type": "text_delta", "text": block.get("text") or ""}
            out.append(typed_event("content_block_delta", index=index, delta=delta))
        elif kind == "tool_use":
            begun = {**block, "input": {}}
            out.append(typed_event("content_block_start", index=index, content_block=begun))
            partial = json.dumps(block.get("input") or {}, ensure_ascii=False)
            delta = {"type": "input_json_delta", "partial_json": partial}
            out.append(typed_event("content_block_delta", index=index, delta=delta))
        elif kind == "thinking":
            begun = {**block, "thinking": "", "signature": ""}
            out.append(typed_event("content_block_start", index=index, content_block=begun))
            delta = {"type": "thinking_delta", "thinking": block.get("thinking") or ""}
            out.append(typed_event("content_block_delta", index=index, delta=delta))
            if isinstance(block.get("signature"), str):
                delta = {"type": "signature_delta", "signature": block["signature"]}
                out.append(typed_event("content_block_delta", index=index, delta=delta))
        else:
            out.append(typed_event("content_block_start", index=index, content_block=block))
        out.append(typed_event("content_block_stop", index=index))
    stop = {"stop_reason": answer.get("stop_reason"), "stop_sequence": answer.get("stop_sequence")}
    counted = {"output_tokens": usage.get("output_tokens")}
    out.append(typed_event("message_delta", delta=stop, usage=counted))
    out.append(typed_event("message_stop"))
    return b"".join(out)


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request as chat messages (llama.cpp's conversion); None if it cannot be read."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": content_text(system)})
    given = body.get("messages")
    if not isinstance(given, list):
        return None
    for message in given:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return None
        role, content = message["role"], message.get("content")
        if not isinstance(content, list):
            messages.append({"role": role, "content": content if isinstance(content, str) else ""})
            continue
        text: list[str] = []
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                text.append(block["text"])
            elif kind == "tool_use":
                arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
                function = {"name": block.get("name") or "", "arguments": arguments}
                calls.append(
                    {"id": block.get("id") or "", "type": "function", "function": function}
                )
            elif kind == "tool_result":
                result = {"role": "tool", "tool_call_id": block.get("tool_use_id") or ""}
                results.append({**result, "content": content_text(block.get("content"))})
        if text or calls:
            turn: dict[str, Any] = {"role": role, "content": "".join(text)}
            if calls:
                turn["tool_calls"] = calls
            messages.append(turn)
        messages.extend(results)
    return messages
