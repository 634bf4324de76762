"""From streamed chunks to the non-stream answer of a chat or text completion.

The upstream always streams (docs/proxy.md): ``Assembler`` builds the whole
``chat.completion`` or ``text_completion`` that a client who asked for no
stream expects, from the chunks: every choice by its ``index``, text fields
concatenated, tool calls merged by their ``index``, log-probabilities
appended, the last ``finish_reason``.

Fed by the relay, on the event loop (one per request).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Assembler"]


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
    """Builds the non-stream answer from stream chunks (``text``: a text completion)."""

    def __init__(self, *, text: bool) -> None:
        self.text = text
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
            if self.text:
                if isinstance(raw.get("text"), str):
                    choice.texts.setdefault("text", []).append(raw["text"])
                continue
            delta = raw.get("delta")
            if isinstance(delta, dict):
                _merge_delta(choice, delta)

    def result(self) -> dict[str, Any]:
        """The whole answer (a JSON object) as the upstream would have sent it unstreamed."""
        text = self.text
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
