"""The four APIs the proxy relays, each as a ``Dialect``: what of its stream the proxy reads.

``/v1/chat/completions`` and ``/v1/completions`` stream ``data:`` events
and end with ``[DONE]``; ``/v1/responses`` (OpenAI's Responses API,
``_responses``) and ``/v1/messages`` (Anthropic's Messages API,
``_messages``) stream named events (``event: TYPE``) and end with their own
last event, with no ``[DONE]``. The relay is the same for all four (the
cut, the admission, the records); a dialect tells it, event by event:

- ``fast(block)``: whether the event may pass as it came without a parse
  (most: a token), and whether it carried generated output (a delta);
- ``look(name, chunk)``: for the few it must parse (the first, a usage, an
  end, an error), what they mean (``Look``);
- how a non-stream answer is built from the events (``assembler``), how an
  answer the upstream sent whole becomes a stream (``whole_events``), which
  text an event carries (``texts``, for counting tokens after a cut), the
  request's prompt for the upstream's chat template (``prompt``), and the
  shape of the proxy's own errors (Anthropic's for ``/v1/messages``).

Pure; one dialect object per API, shared by every request (no state).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from wirecut.proxy import _messages, _responses
from wirecut.proxy._assemble import Assembler
from wirecut.proxy._events import DELTA, PARSE, dumps, encode, typed_event
from wirecut.proxy._tally import Tally

__all__ = ["Dialect", "Endpoint", "EventAssembler", "Look", "Prompt", "dialect_of"]


class Endpoint(enum.StrEnum):
    """An API the proxy serves: its path under the API base."""

    CHAT = "chat/completions"  # chat.completion(.chunk): choices[].delta / .message
    TEXT = "completions"  # text_completion: choices[].text
    RESPONSES = "responses"  # OpenAI's Responses API: named events, response.completed
    MESSAGES = "messages"  # Anthropic's Messages API: named events, message_stop

    @property
    def route(self) -> str:
        """The path clients send it to."""
        return "/v1/" + self.value


class Look(enum.Enum):
    """What a parsed event means to the relay."""

    PASS = "pass"  # passed to the client as it came
    HIDE = "hide"  # not passed (the usage chunk the proxy asked for, not the client)
    COMPLETE = "complete"  # passed, and the answer is whole: the request ends here
    FAILED = "failed"  # passed, and the upstream said it failed: the request ends here


class EventAssembler(Protocol):
    """Builds a non-stream answer from parsed events."""

    def add(self, name: str, chunk: dict[str, Any]) -> None: ...

    def result(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Prompt:
    """A request's prompt, for counting it in tokens with the upstream's tokenizer.

    ``template``: a body for ``/apply-template`` (chat messages); ``text``: a
    prompt that goes as it is; ``tokens``: a prompt already in tokens.
    """

    template: bytes | None = None
    text: str | None = None
    tokens: int | None = None


class Dialect:
    """The OpenAI chat and text completions (the base the named APIs override)."""

    #: The event names that need a parse (named APIs); None: decided by ``PARSE``.
    read: frozenset[str] | None = None

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    def fast(self, block: bytes, tally: Tally) -> bool:
        """True if ``block`` passes as it came (a delta counted in ``tally``); False: parse it."""
        if block.startswith(b"data: ") and b"\n" not in block and PARSE.search(block) is None:
            if DELTA.search(block) is not None:
                tally.deltas += 1
            return True
        return False

    def look(
        self, name: str | None, chunk: dict[str, Any], choices_hidden: bool, tally: Tally
    ) -> Look:
        """What a parsed event means; ``choices_hidden``: the client did not ask for usage."""
        if name == "error" or "error" in chunk:
            return Look.FAILED
        tally.add(chunk)
        if choices_hidden and chunk.get("choices") == [] and chunk.get("usage") is not None:
            return Look.HIDE  # The usage chunk the proxy asked for, not the client.
        return Look.PASS

    def done_is_whole(self, tally: Tally, choices: int) -> bool:
        """Whether ``[DONE]`` ends a whole answer (chat and text: always)."""
        return True

    def whole(self, tally: Tally, choices: int) -> bool:
        """Whether a stream that ended without its last event still brought a whole answer."""
        return tally.all_finished(choices)

    def assembler(self) -> EventAssembler:
        return _ChatAssembler(self.endpoint)

    def texts(self, name: str | None, chunk: dict[str, Any]) -> list[str]:
        """The generated text one event carries."""
        texts: list[str] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if isinstance(choice.get("text"), str):
                texts.append(choice["text"])
            delta = choice.get("delta")
            if isinstance(delta, dict):
                texts.extend(_message_texts(delta))
        return texts

    @property
    def prompt_needs_body(self) -> bool:
        """Whether ``prompt`` reads the parsed body (chat's goes to the template as it came)."""
        return self.endpoint is not Endpoint.CHAT

    def prompt(self, body: dict[str, Any], raw: bytes) -> Prompt | None:
        """The prompt of a request (``body`` parsed from ``raw``), None if it cannot be read."""
        if self.endpoint is Endpoint.CHAT:
            return Prompt(template=raw)  # llama.cpp's /apply-template takes the chat body.
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return Prompt(text=prompt)
        if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
            return Prompt(tokens=len(prompt))
        return None

    # -- an answer the upstream sent whole ----------------------------------------------

    def look_whole(self, answer: Any, tally: Tally) -> bool:
        """Whether ``answer`` is this API's whole answer; notes what it says in ``tally``."""
        if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
            return False
        tally.add({"model": answer.get("model"), "usage": answer.get("usage")})
        for position, choice in enumerate(answer["choices"]):
            if isinstance(choice, dict):
                message = choice.get("message")
                texts = (
                    _message_texts(message)
                    if isinstance(message, dict)
                    else [choice["text"]]
                    if isinstance(choice.get("text"), str)
                    else []
                )
                tally.transcript.add_texts(texts)
                tally.deltas += any(texts)
                index = choice.get("index", position)
                tally.finished_choices.add(index if isinstance(index, int) else position)
        return True

    def whole_failed(self, answer: dict[str, Any]) -> bool:
        return False

    def whole_events(self, answer: dict[str, Any], include_usage: bool) -> bytes:
        """``answer`` as the events of a stream, ending with ``[DONE]``."""
        chat = self.endpoint is Endpoint.CHAT
        common = {key: answer.get(key) for key in ("id", "created", "model")}
        common["object"] = "chat.completion.chunk" if chat else "text_completion"
        out = []
        for choice in answer["choices"]:
            if not isinstance(choice, dict):
                continue
            part = {key: value for key, value in choice.items() if key != "message"}
            if chat:
                part["delta"] = choice.get("message") or {}
            out.append(encode(None, dumps({**common, "choices": [part]})))
        if include_usage and answer.get("usage") is not None:
            out.append(encode(None, dumps({**common, "choices": [], "usage": answer["usage"]})))
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)

    # -- the proxy's own errors ---------------------------------------------------------

    def error_body(
        self, message: str, type_: str, *, param: str | None = None, code: str | None = None
    ) -> bytes:
        """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
        error = {"message": message, "type": type_, "param": param, "code": code}
        return dumps({"error": error})

    def error_event(self, message: str, type_: str, code: str | None = None) -> bytes:
        """The same error as the last event of a stream (the openai SDK raises it)."""
        return b"data: " + self.error_body(message, type_, code=code) + b"\n\n"


class _NamedDialect(Dialect):
    """An API of named events (``event: TYPE``) whose own last event ends a whole answer."""

    #: The last events of a whole answer, and of a failed one.
    complete: frozenset[str]
    failed: frozenset[str]
    #: Notes in the tally what a parsed event says (the API module's ``saw``).
    saw: Callable[[str, dict[str, Any], Tally], None]

    def look(
        self, name: str | None, chunk: dict[str, Any], choices_hidden: bool, tally: Tally
    ) -> Look:
        kind = name or chunk.get("type")
        if not isinstance(kind, str):
            return Look.PASS
        tally.deltas += _is_delta(kind)  # One that ``fast`` did not see.
        self.saw(kind, chunk, tally)
        if kind in self.failed:
            return Look.FAILED
        return Look.COMPLETE if kind in self.complete else Look.PASS

    def fast(self, block: bytes, tally: Tally) -> bool:
        if not block.startswith(b"event: "):
            return False  # No name on its first line: parse it (the name is in its data).
        end = block.find(b"\n", 7)
        if end < 0:
            return False
        name = block[7:end].decode("latin-1").strip()
        assert self.read is not None
        if name in self.read:
            return False
        if _is_delta(name):
            tally.deltas += 1
        return True

    def done_is_whole(self, tally: Tally, choices: int) -> bool:
        return tally.ended

    def whole(self, tally: Tally, choices: int) -> bool:
        return tally.ended


class _ResponsesDialect(_NamedDialect):
    read = _responses.READ
    complete = _responses.END_WHOLE
    failed = _responses.END_FAILED
    saw = staticmethod(_responses.saw)

    def assembler(self) -> EventAssembler:
        return _responses.ResponsesAssembler()

    def texts(self, name: str | None, chunk: dict[str, Any]) -> list[str]:
        return _responses.event_texts(name, chunk)

    def prompt(self, body: dict[str, Any], raw: bytes) -> Prompt | None:
        return _template(_responses.chat_messages(body))

    def look_whole(self, answer: Any, tally: Tally) -> bool:
        return _responses.look_whole(answer, tally)

    def whole_failed(self, answer: dict[str, Any]) -> bool:
        return answer.get("status") == "failed"

    def whole_events(self, answer: dict[str, Any], include_usage: bool) -> bytes:
        return _responses.whole_events(answer)

    def error_event(self, message: str, type_: str, code: str | None = None) -> bytes:
        # The Responses API's own error event (the SDK yields it as an ``error`` event).
        return typed_event("error", code=code or type_, message=message, param=None)


class _MessagesDialect(_NamedDialect):
    read = _messages.READ
    complete = frozenset({"message_stop"})
    failed = frozenset({"error"})
    saw = staticmethod(_messages.saw)

    def assembler(self) -> EventAssembler:
        return _messages.MessagesAssembler()

    def texts(self, name: str | None, chunk: dict[str, Any]) -> list[str]:
        return _messages.event_texts(name, chunk)

    def prompt(self, body: dict[str, Any], raw: bytes) -> Prompt | None:
        return _template(_messages.chat_messages(body))

    def look_whole(self, answer: Any, tally: Tally) -> bool:
        return _messages.look_whole(answer, tally)

    def whole_events(self, answer: dict[str, Any], include_usage: bool) -> bytes:
        return _messages.whole_events(answer)

    def error_body(
        self, message: str, type_: str, *, param: str | None = None, code: str | None = None
    ) -> bytes:
        """Anthropic's error object: ``{"type": "error", "error": {"type", "message"}}``."""
        kind = _ANTHROPIC_TYPES.get(type_, type_)
        return dumps({"type": "error", "error": {"type": kind, "message": message}})

    def error_event(self, message: str, type_: str, code: str | None = None) -> bytes:
        return encode(b"error", self.error_body(message, type_))


# The proxy's error types where Anthropic's API names them differently.
_ANTHROPIC_TYPES = {
    "server_error": "api_error",
    "upstream_error": "api_error",
    "unavailable": "overloaded_error",
}


class _ChatAssembler:
    def __init__(self, endpoint: Endpoint) -> None:
        self._assembler = Assembler(text=endpoint is Endpoint.TEXT)

    def add(self, name: str, chunk: dict[str, Any]) -> None:
        self._assembler.add(chunk)

    def result(self) -> dict[str, Any]:
        return self._assembler.result()


def _is_delta(name: str) -> bool:
    return name.endswith(".delta") or name == "content_block_delta"


def _message_texts(message: dict[str, Any]) -> list[str]:
    texts = [
        message[key]
        for key in ("content", "reasoning_content")
        if isinstance(message.get(key), str)
    ]
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            texts.extend(
                function[key] for key in ("name", "arguments") if isinstance(function.get(key), str)
            )
    return texts


def _template(messages: list[dict[str, Any]] | None) -> Prompt | None:
    return None if messages is None else Prompt(template=dumps({"messages": messages}))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_DIALECTS = {
    Endpoint.CHAT: Dialect(Endpoint.CHAT),
    Endpoint.TEXT: Dialect(Endpoint.TEXT),
    Endpoint.RESPONSES: _ResponsesDialect(Endpoint.RESPONSES),
    Endpoint.MESSAGES: _MessagesDialect(Endpoint.MESSAGES),
}


def dialect_of(endpoint: Endpoint) -> Dialect:
    """The dialect of ``endpoint`` (one shared object each)."""
    return _DIALECTS[endpoint]
