"""``ChatAccumulator``: builds one ``ChatResult`` from chat-completion chunks.

Fed by the thread that reads the response, one chunk (a parsed SSE ``data``
payload, or a whole non-streaming response) at a time. It keeps everything
received so far, so that a cut request still returns its partial text,
tool-call fragments and usage.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from wirecut.provider._errors import ProviderResponseError
from wirecut.provider._result import ChatResult, ToolCall, Usage

__all__ = ["ChatAccumulator"]


class _PartialCall:
    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []


class ChatAccumulator:
    """Accumulate chunks into a result; ``on_token`` gets each content delta.

    Tool-call deltas are merged by their ``index``: ``id`` and ``name`` are
    taken from the first delta that carries them (servers send them whole,
    some more than once), ``arguments`` fragments are concatenated.
    """

    def __init__(self, on_token: Callable[[str], None] | None = None) -> None:
        self._on_token = on_token
        self._text: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        self._deltas = 0
        self.finish_reason: str | None = None
        self.model: str | None = None
        self.provider_usage: Usage | None = None

    def add_chunk(self, chunk: Any) -> None:
        """Merge one streamed ``chat.completion.chunk``."""
        if not isinstance(chunk, dict):
            raise ProviderResponseError(f"expected a JSON object in the stream, got {chunk!r:.200}")
        if "error" in chunk:
            raise ProviderResponseError(f"the provider sent an error: {chunk['error']!r:.200}")
        self._common(chunk)
        for choice in _choices(chunk):
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content:
                self._add_text(content)
            for call in delta.get("tool_calls") or ():
                self._add_call_delta(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def add_response(self, response: Any) -> None:
        """Merge a whole (non-streaming) ``chat.completion``."""
        if not isinstance(response, dict):
            raise ProviderResponseError(f"expected a JSON object, got {response!r:.200}")
        if "error" in response:
            raise ProviderResponseError(f"the provider sent an error: {response['error']!r:.200}")
        self._common(response)
        choices = _choices(response)
        if not choices:
            raise ProviderResponseError(f"a response without choices: {response!r:.200}")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise ProviderResponseError(f"a choice without a message: {choices[0]!r:.200}")
        if message.get("content"):
            self._add_text(message["content"])
        for index, call in enumerate(message.get("tool_calls") or ()):
            self._add_call_delta({"index": index, **call})
        self.finish_reason = choices[0].get("finish_reason")

    def _common(self, payload: dict[str, Any]) -> None:
        if payload.get("model"):
            self.model = str(payload["model"])
        usage = payload.get("usage")
        if isinstance(usage, dict):
            prompt = int(usage.get("prompt_tokens") or 0)
            completion = int(usage.get("completion_tokens") or 0)
            total = int(usage.get("total_tokens") or prompt + completion)
            self.provider_usage = Usage(prompt, completion, total)

    def _add_text(self, content: Any) -> None:
        if not isinstance(content, str):
            raise ProviderResponseError(f"content is not text: {content!r:.200}")
        self._text.append(content)
        self._deltas += 1
        if self._on_token is not None:
            self._on_token(content)

    def _add_call_delta(self, delta: Any) -> None:
        if not isinstance(delta, dict):
            raise ProviderResponseError(f"a malformed tool call: {delta!r:.200}")
        index = delta.get("index", len(self._calls))
        if not isinstance(index, int):
            raise ProviderResponseError(f"a tool call without an integer index: {delta!r:.200}")
        call = self._calls.setdefault(index, _PartialCall())
        if delta.get("id") and not call.id:
            call.id = str(delta["id"])
        function = delta.get("function") or {}
        if function.get("name") and not call.name:
            call.name = str(function["name"])
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments.append(arguments)
        elif arguments is not None:
            # Some servers send a parsed object in whole responses.
            call.arguments.append(json.dumps(arguments))

    @property
    def text(self) -> str:
        return "".join(self._text)

    def tool_calls(self) -> list[ToolCall]:
        return [
            ToolCall(call.id or f"call_{index}", call.name, "".join(call.arguments))
            for index, call in sorted(self._calls.items())
        ]

    def usage(self, requests: int) -> Usage:
        """The provider's usage if it sent one, else an estimate from the deltas."""
        if self.provider_usage is not None:
            usage = self.provider_usage
            return Usage(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens, requests)
        return Usage(0, self._deltas, self._deltas, requests, estimated=True)

    def result(
        self, requests: int, *, interrupted: bool = False, reason: str | None = None
    ) -> ChatResult:
        return ChatResult(
            text=self.text,
            tool_calls=self.tool_calls(),
            finish_reason=self.finish_reason,
            usage=self.usage(requests),
            interrupted=interrupted,
            reason=reason,
            model=self.model,
        )


def _choices(payload: dict[str, Any]) -> list[dict[str, Any]]:
    choices = payload.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise ProviderResponseError(f"malformed choices: {choices!r:.200}")
    return choices
