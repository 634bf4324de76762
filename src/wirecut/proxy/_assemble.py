"""From streamed chunks to what the proxy knows and what a non-stream client gets.

The upstream always streams (docs/proxy.md): ``Tally`` counts what arrived
(the usage the upstream reported, else the deltas received), and
``Assembler`` builds the whole ``chat.completion`` or ``text_completion``
that a client who asked for no stream expects, from the same chunks: every
choice by its ``index``, text fields concatenated, tool calls merged by
their ``index``, log-probabilities appended, the last ``finish_reason``.

Fed by the relay, on the event loop. A streaming client's events are not
all parsed (``_events.look``): ``Tally`` then counts a delta without one.
"""

from __future__ import annotations

import enum
from typing import Any

from wirecut.provider import Usage

__all__ = ["Assembler", "Endpoint", "Tally"]


class Endpoint(enum.StrEnum):
    """Which OpenAI endpoint a request is for (its path under the API base)."""

    CHAT = "chat/completions"  # chat.completion(.chunk): choices[].delta / .message
    TEXT = "completions"  # text_completion: choices[].text


class Tally:
    """What the upstream produced for one request, as far as the proxy saw it."""

    __slots__ = ("deltas", "finished_choices", "model", "provider_usage", "requests")

    def __init__(self) -> None:
        self.requests = 0  # requests whose headers went out to the upstream
        self.deltas = 0  # choices that carried new text or a tool-call part
        self.finished_choices: set[int] = set()  # the indexes that got a finish_reason
        self.model: str | None = None
        self.provider_usage: dict[str, Any] | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        model = chunk.get("model")
        if isinstance(model, str) and model:
            self.model = model
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.provider_usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for position, choice in enumerate(choices):
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason"):
                index = choice.get("index", position)
                self.finished_choices.add(index if isinstance(index, int) else position)
            delta = choice.get("delta")
            if isinstance(delta, dict):
                if (
                    delta.get("content")
                    or delta.get("reasoning_content")
                    or delta.get("tool_calls")
                ):
                    self.deltas += 1
            elif choice.get("text"):
                self.deltas += 1

    def all_finished(self, choices: int) -> bool:
        """True if ``choices`` choices (the request's ``n``) each got a finish_reason."""
        return len(self.finished_choices) >= choices

    def usage(self) -> Usage:
        """The upstream's usage when it sent one, else the deltas received (``estimated``)."""
        reported = self.provider_usage
        if reported is not None:
            prompt = _count(reported.get("prompt_tokens"))
            completion = _count(reported.get("completion_tokens"))
            if prompt is not None and completion is not None:
                return Usage(prompt, completion, prompt + completion, self.requests)
        return Usage(0, self.deltas, self.deltas, self.requests, estimated=True)


def _count(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


class _Choice:
    __slots__ = ("calls", "finish_reason", "logprobs", "other", "role", "texts")

    def __init__(self) -> None:
        self.role = "assistant"
        self.texts: dict[str, list[str]] = {}
        self.other: dict[str, Any] = {}
        self.calls: dict[int, dict[str, Any]] = {}
        self.logprobs: dict[str, Any] | None = None
        self.finish_reason: Any = None


class Assembler:
    """Builds the non-stream answer of ``endpoint`` from its stream chunks."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._top: dict[str, Any] = {}
        self._choices: dict[int, _Choice] = {}
        self._usage: Any = None

    def add(self, chunk: dict[str, Any]) -> None:
        for key in ("id", "created", "model", "system_fingerprint"):
            if chunk.get(key) is not None and key not in self._top:
                self._top[key] = chunk[key]
        if "usage" in chunk and chunk["usage"] is not None:
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for position, raw in enumerate(choices):
            if not isinstance(raw, dict):
                continue
            index = raw.get("index", position)
            choice = self._choices.setdefault(
                index if isinstance(index, int) else position, _Choice()
            )
            if raw.get("finish_reason") is not None:
                choice.finish_reason = raw["finish_reason"]
            if raw.get("logprobs"):
                choice.logprobs = _merge_logprobs(choice.logprobs, raw["logprobs"])
            if self.endpoint is Endpoint.TEXT:
                if isinstance(raw.get("text"), str):
                    choice.texts.setdefault("text", []).append(raw["text"])
                continue
            delta = raw.get("delta")
            if isinstance(delta, dict):
                _merge_delta(choice, delta)

    def result(self) -> dict[str, Any]:
        """The whole answer (a JSON object) as the upstream would have sent it unstreamed."""
        text = self.endpoint is Endpoint.TEXT
        body: dict[str, Any] = {
            "id": self._top.get("id"),
            "object": "text_completion" if text else "chat.completion",
            "created": self._top.get("created"),
            "model": self._top.get("model"),
            "choices": [
                self._text_choice(index, choice) if text else self._chat_choice(index, choice)
                for index, choice in sorted(self._choices.items())
            ],
        }
        if "system_fingerprint" in self._top:
            body["system_fingerprint"] = self._top["system_fingerprint"]
        body["usage"] = self._usage
        return body

    @staticmethod
    def _text_choice(index: int, choice: _Choice) -> dict[str, Any]:
        return {
            "index": index,
            "text": "".join(choice.texts.get("text", ())),
            "logprobs": choice.logprobs,
            "finish_reason": choice.finish_reason,
        }

    @staticmethod
    def _chat_choice(index: int, choice: _Choice) -> dict[str, Any]:
        message: dict[str, Any] = {"role": choice.role}
        content = choice.texts.pop("content", None)
        calls = [call for _, call in sorted(choice.calls.items())]
        # OpenAI's shape: content is null beside tool calls that came alone.
        message["content"] = "".join(content) if content is not None else (None if calls else "")
        for key, parts in choice.texts.items():
            message[key] = "".join(parts)
        for key, value in choice.other.items():
            message.setdefault(key, value)
        if calls:
            message["tool_calls"] = calls
        return {
            "index": index,
            "message": message,
            "logprobs": choice.logprobs,
            "finish_reason": choice.finish_reason,
        }


def _merge_delta(choice: _Choice, delta: dict[str, Any]) -> None:
    for key, value in delta.items():
        if key == "role":
            if isinstance(value, str) and value:
                choice.role = value
        elif key == "tool_calls":
            for position, part in enumerate(value if isinstance(value, list) else ()):
                if isinstance(part, dict):
                    _merge_call(choice.calls, part, position)
        elif key == "function_call" and isinstance(value, dict):
            # The legacy single call: merged like a tool call's function.
            merged = choice.other.setdefault("function_call", {"name": "", "arguments": ""})
            _merge_function(merged, value)
        elif isinstance(value, str):
            choice.texts.setdefault(key, []).append(value)
        elif value is not None:
            choice.other[key] = value


def _merge_call(calls: dict[int, dict[str, Any]], part: dict[str, Any], position: int) -> None:
    index = part.get("index", position)
    if not isinstance(index, int):
        index = position
    call = calls.get(index)
    if call is None:
        call = calls[index] = {
            "id": "",
            "type": "function",
            "function": {"name": "", "arguments": ""},
        }
    # id and name arrive whole in one part (some servers repeat them).
    if part.get("id") and not call["id"]:
        call["id"] = part["id"]
    if part.get("type"):
        call["type"] = part["type"]
    function = part.get("function")
    if isinstance(function, dict):
        _merge_function(call["function"], function)


def _merge_function(into: dict[str, Any], part: dict[str, Any]) -> None:
    if part.get("name") and not into["name"]:
        into["name"] = part["name"]
    arguments = part.get("arguments")
    if isinstance(arguments, str):
        into["arguments"] += arguments


def _merge_logprobs(into: dict[str, Any] | None, part: Any) -> dict[str, Any] | None:
    if not isinstance(part, dict):
        return into
    merged = dict(into or {})
    for key, value in part.items():
        if isinstance(value, list):
            merged[key] = [*(merged.get(key) or []), *value]
        elif key not in merged:
            merged[key] = value
    return merged
