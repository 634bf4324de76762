"""``/v1/responses`` (OpenAI's Responses API) as the proxy reads it.

A stream is named events and no ``[DONE]``: ``response.created`` (it names
the model), the output items' events (each ``*.delta`` carries generated
text), and one last event: ``response.completed`` or
``response.incomplete`` (the answer is whole; its ``response.usage`` has
``input_tokens`` and ``output_tokens``), or ``response.failed`` or ``error``
(the upstream's error). A client that asked for no stream gets the
``response`` object of the last event, its ``output`` filled from the
``response.output_item.done`` events if the upstream left it empty. An
upstream that answered whole (it ignored ``"stream": true``) is turned into
the events the official SDK's stream helper follows.

For counting a prompt with the upstream's chat template, the request becomes
chat messages as llama.cpp converts it (``instructions`` a system message,
a string ``input`` a user message, each item a message).

Pure functions, and ``ResponsesAssembler`` (one per request).
"""

from __future__ import annotations

import itertools
from typing import Any

from wirecut._content import content_text
from wirecut.proxy._events import typed_event
from wirecut.proxy._tally import Tally

__all__ = [
    "END_FAILED",
    "END_WHOLE",
    "READ",
    "ResponsesAssembler",
    "answer_texts",
    "chat_messages",
    "event_texts",
    "look_whole",
    "whole_events",
]

#: The last events of a whole answer, and of a failed one.
END_WHOLE = frozenset({"response.completed", "response.incomplete"})
END_FAILED = frozenset({"response.failed", "error"})
#: The events the proxy parses; every other one passes as it came.
READ = END_WHOLE | END_FAILED | {"response.created"}


def saw(name: str, chunk: dict[str, Any], tally: Tally) -> None:
    """Note in ``tally`` what a parsed event says (the model, the usage, the end)."""
    response = chunk.get("response")
    if not isinstance(response, dict):
        return
    tally.saw_model(response.get("model"))
    if name not in END_WHOLE and name not in END_FAILED:
        return  # The usage is final only in the last event.
    usage = response.get("usage")
    if isinstance(usage, dict):
        tally.report(usage.get("input_tokens"), usage.get("output_tokens"))
    tally.ended = name in END_WHOLE


def event_texts(name: str | None, chunk: dict[str, Any]) -> list[str]:
    """The generated text one event carries (a delta, or a function call's name)."""
    kind = name or chunk.get("type")
    if not isinstance(kind, str):
        return []
    if kind.endswith(".delta"):
        delta = chunk.get("delta")
        return [delta] if isinstance(delta, str) else []
    if kind == "response.output_item.added":
        item = chunk.get("item")
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            return [item["name"]]
    return []


def answer_texts(answer: dict[str, Any]) -> list[str]:
    """The generated text of a whole ``response`` object."""
    texts: list[str] = []
    for item in answer.get("output") or ():
        if not isinstance(item, dict):
            continue
        for key in ("name", "arguments"):
            if isinstance(item.get(key), str):
                texts.append(item[key])
        for group in ("content", "summary"):
            for part in item.get(group) or ():
                if isinstance(part, dict):
                    for key in ("text", "refusal"):
                        if isinstance(part.get(key), str):
                            texts.append(part[key])
    return texts


def look_whole(answer: Any, tally: Tally) -> bool:
    """Whether ``answer`` (an upstream's unstreamed answer) is a response; notes it in ``tally``."""
    if not isinstance(answer, dict) or not isinstance(answer.get("output"), list):
        return False
    tally.saw_whole(answer, answer_texts(answer), ended=answer.get("status") != "failed")
    return True


class ResponsesAssembler:
    """Builds the non-stream answer from the events."""

    def __init__(self) -> None:
        self._items: dict[int, Any] = {}
        self._response: dict[str, Any] = {}

    def add(self, name: str, chunk: dict[str, Any]) -> None:
        if name == "response.output_item.done":
            index = chunk.get("output_index")
            self._items[index if isinstance(index, int) else len(self._items)] = chunk.get("item")
        elif name in END_WHOLE and isinstance(chunk.get("response"), dict):
            self._response = chunk["response"]

    def result(self) -> dict[str, Any]:
        response = dict(self._response)
        if not response.get("output") and self._items:
            response["output"] = [item for _, item in sorted(self._items.items())]
        return response


def whole_events(answer: dict[str, Any]) -> bytes:
    """A whole ``response`` object as the events of a stream (what the SDK's helper follows)."""
    sequence = itertools.count()

    def event(kind: str, **fields: Any) -> bytes:
        return typed_event(kind, sequence_number=next(sequence), **fields)

    begun = {**answer, "status": "in_progress", "output": [], "usage": None}
    out = [event("response.created", response=begun), event("response.in_progress", response=begun)]
    for index, item in enumerate(answer.get("output") or ()):
        if not isinstance(item, dict):
            continue
        kind, item_id = item.get("type"), item.get("id")
        added = {**item, "status": "in_progress"}
        if kind == "message":
            added["content"] = []
        elif kind == "function_call":
            added["arguments"] = ""
        out.append(event("response.output_item.added", output_index=index, item=added))
        where = {"item_id": item_id, "output_index": index}
        if kind == "message":
            for part_index, part in enumerate(item.get("content") or ()):
                if not isinstance(part, dict):
                    continue
                at = {**where, "content_index": part_index}
                text = part.get("text") if part.get("type") == "output_text" else None
                empty = {**part, "text": ""} if isinstance(text, str) else part
                out.append(event("response.content_part.added", **at, part=empty))
                if isinstance(text, str):
                    out.append(event("response.output_text.delta", **at, delta=text, logprobs=[]))
                    out.append(event("response.output_text.done", **at, text=text, logprobs=[]))
                out.append(event("response.content_part.done", **at, part=part))
        elif kind == "function_call":
            arguments = item.get("arguments") if isinstance(item.get("arguments"), str) else ""
            out.append(event("response.function_call_arguments.delta", **where, delta=arguments))
            out.append(event("response.function_call_arguments.done", **where, arguments=arguments))
        out.append(event("response.output_item.done", output_index=index, item=item))
    status = answer.get("status")
    last = {"incomplete": "response.incomplete", "failed": "response.failed"}.get(
        status if isinstance(status, str) else "", "response.completed"
    )
    out.append(event(last, response=answer))
    return b"".join(out)


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request as chat messages (llama.cpp's conversion); None if it cannot be read."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list):
        return None
    for item in items:
        if not isinstance(item, dict):
            return None
        kind = item.get("type", "message")
        if kind == "message" and isinstance(item.get("role"), str):
            messages.append({"role": item["role"], "content": content_text(item.get("content"))})
        elif kind == "function_call":
            call = {"name": item.get("name") or "", "arguments": item.get("arguments") or ""}
            tool_call = {"id": item.get("call_id") or "", "type": "function", "function": call}
            messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call]})
        elif kind == "function_call_output":
            output = content_text(item.get("output"))
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id") or "", "content": output}
            )
    return messages
