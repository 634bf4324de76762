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
    """Accumulate chunks into a result; ``on_token`` gets the content as it comes.

    With ``join_tokens``, content deltas are handed to ``on_token`` at
    ``send_tokens()``, joined: a reader calls it once per read, so that a read
    that brought several tokens makes one call (one output write, one
    frame), not one each. Without, each delta goes to ``on_token`` as it is
    merged.

    Tool-call deltas are merged by their ``index``: ``id`` and ``name`` are
    taken from the first delta that carries them (servers send them whole,
    some more than once), ``arguments`` fragments are concatenated. Text and
    arguments together past ``max_reply_chars`` raise ``ProviderResponseError``.
    """

    def __init__(
        self,
        on_token: Callable[[str], None] | None = None,
        *,
        max_reply_chars: int | None = None,
        join_tokens: bool = False,
    ) -> None:
        self._on_token = on_token
        self._join_tokens = join_tokens
        self._max_reply_chars = max_reply_chars
        self._text: list[str] = []
        self._unsent: list[str] = []  # content not yet given to on_token
        self._calls: dict[int, _PartialCall] = {}
        self._chars = 0  # of text and tool-call arguments kept
        self._deltas = 0  # streamed deltas that carried something the model produced
        self._whole = False  # a whole (non-streamed) response was merged
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
            if not isinstance(delta, dict):
                raise ProviderResponseError(f"a malformed delta: {delta!r:.200}")
            content = delta.get("content")
            calls = delta.get("tool_calls") or []
            if not isinstance(calls, list):
                raise ProviderResponseError(f"malformed tool calls: {calls!r:.200}")
            if content or calls or delta.get("reasoning_content"):
                # One delta is about one token on llama.cpp, vLLM and Ollama:
                # the estimate of what arrived when no usage comes.
                self._deltas += 1
            if content:
                self._add_text(content)
            for call in calls:
                self._add_call_delta(call)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    def expect_whole(self) -> None:
        """A whole (non-streamed) response is being read: what it used is unknown until merged."""
        self._whole = True

    def add_response(self, response: Any) -> None:
        """Merge a whole (non-streaming) ``chat.completion``."""
        if not isinstance(response, dict):
            raise ProviderResponseError(f"expected a JSON object, got {response!r:.200}")
        if "error" in response:
            raise ProviderResponseError(f"the provider sent an error: {response['error']!r:.200}")
        self._whole = True
        self._common(response)
        choices = _choices(response)
        if not choices:
            raise ProviderResponseError(f"a response without choices: {response!r:.200}")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise ProviderResponseError(f"a choice without a message: {choices[0]!r:.200}")
        if message.get("content"):
            self._add_text(message["content"])
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list) or not all(isinstance(call, dict) for call in calls):
            raise ProviderResponseError(f"malformed tool calls: {calls!r:.200}")
        for index, call in enumerate(calls):
            self._add_call_delta({"index": index, **call})
        reason = choices[0].get("finish_reason")
        self.finish_reason = None if reason is None else str(reason)

    def _common(self, payload: dict[str, Any]) -> None:
        if payload.get("model"):
            self.model = str(payload["model"])
        usage = payload.get("usage")
        if isinstance(usage, dict):
            prompt = _count(usage.get("prompt_tokens"))
            completion = _count(usage.get("completion_tokens"))
            total = _count(usage.get("total_tokens"))
            if total is None and prompt is not None and completion is not None:
                total = prompt + completion
            self.provider_usage = Usage(prompt, completion, total)

    def _add_text(self, content: Any) -> None:
        if not isinstance(content, str):
            raise ProviderResponseError(f"content is not text: {content!r:.200}")
        self._keep(len(content))
        self._text.append(content)
        if self._on_token is not None:
            if self._join_tokens:
                self._unsent.append(content)
            else:
                self._on_token(content)

    def send_tokens(self) -> None:
        """Give ``on_token`` the content that came since the last call, joined (if any)."""
        if self._unsent:
            text = self._unsent[0] if len(self._unsent) == 1 else "".join(self._unsent)
            self._unsent.clear()
            assert self._on_token is not None
            self._on_token(text)

    def _keep(self, chars: int) -> None:
        self._chars += chars
        if self._max_reply_chars is not None and self._chars > self._max_reply_chars:
            raise ProviderResponseError(
                f"the reply is longer than {self._max_reply_chars} characters"
                " (ResponseLimits.reply_chars)"
            )

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
        if not isinstance(function, dict):
            raise ProviderResponseError(f"a malformed tool call: {delta!r:.200}")
        if function.get("name") and not call.name:
            call.name = str(function["name"])
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            # Some servers send a parsed object in whole responses.
            arguments = json.dumps(arguments)
        if arguments:
            self._keep(len(arguments))
            call.arguments.append(arguments)

    @property
    def text(self) -> str:
        return "".join(self._text)

    def tool_calls(self) -> list[ToolCall]:
        return [
            ToolCall(call.id or f"call_{index}", call.name, "".join(call.arguments))
            for index, call in sorted(self._calls.items())
        ]

    def usage(self) -> Usage:
        """The usage of the one request this accumulated (``requests == 1``).

        The provider's own counts if it sent them (a count it left out is
        None). Else the streamed deltas estimate the completion tokens
        (``estimated``; zero if nothing arrived) and the prompt tokens are
        unknown; a whole response without usage leaves both unknown.
        """
        if self.provider_usage is not None:
            usage = self.provider_usage
            return Usage(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens, 1)
        if self._whole:
            return Usage(None, None, None, 1)
        return Usage(None, self._deltas, None, 1, estimated=self._deltas > 0)

    def result(
        self, usage: Usage, *, interrupted: bool = False, reason: str | None = None
    ) -> ChatResult:
        """The result of a ``chat()`` whose requests together used ``usage``."""
        return ChatResult(
            text=self.text,
            tool_calls=self.tool_calls(),
            finish_reason=self.finish_reason,
            usage=usage,
            interrupted=interrupted,
            reason=reason,
            model=self.model,
        )


def _count(value: Any) -> int | None:
    """A token count from the provider's ``usage``; None if absent or not a count."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53:
        return value
    return None


def _choices(payload: dict[str, Any]) -> list[dict[str, Any]]:
    choices = payload.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise ProviderResponseError(f"malformed choices: {choices!r:.200}")
    return choices
