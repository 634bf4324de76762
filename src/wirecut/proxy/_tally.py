"""``Tally``: what the upstream produced for one request, as far as the proxy saw it.

The relay feeds it as the answer passes: the model the upstream named, the
usage it reported (prompt and completion apart: Anthropic's stream reports
the prompt first and the completion at its end), the choices that finished,
the events that carried generated output (``deltas``: the count of last
resort), when the first of them came, and the answer's bytes
(``Transcript``), kept only so that, when the upstream never said its usage
(a cut, a broken stream), the text can be counted in tokens afterwards
(``_usage``), off the request path.

Event loop only; fed by one relay.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from wirecut._json import JSONError, loads
from wirecut.proxy._events import parse_block

__all__ = ["KEEP_BYTES", "Tally", "Transcript"]

#: Raw answer bytes a transcript holds before it reduces them to their text.
KEEP_BYTES = 256 * 1024

#: What an API's event holds of generated text: ``(event name, parsed data) -> texts``.
TextsOf = Callable[[str | None, dict[str, Any]], list[str]]


class Transcript:
    """The generated text of one answer, kept cheaply until it is known whether it is needed.

    ``feed`` only keeps a reference to the bytes that came (no parse: it is
    on every token's way); past ``KEEP_BYTES`` they are reduced to their
    text, and ``text()`` reduces the rest. ``texts_of`` says which text an
    event carries (an API's ``Dialect.texts``). An answer that came whole
    (not as events) is given as its texts (``add_texts``).
    """

    __slots__ = ("_raw", "_rest", "_size", "_texts", "_texts_of")

    def __init__(self, texts_of: TextsOf) -> None:
        self._texts_of = texts_of
        self._raw: list[bytes] = []
        self._size = 0
        self._rest = b""  # an event begun in the bytes reduced so far
        self._texts: list[str] = []

    def feed(self, data: bytes) -> None:
        """Keep what one read of the upstream brought (event stream bytes)."""
        self._raw.append(data)
        self._size += len(data)
        if self._size > KEEP_BYTES:
            self._reduce()

    def add_texts(self, texts: list[str]) -> None:
        self._texts.extend(texts)

    def text(self) -> str:
        """Every text the kept events carried, in order (an event left open is not)."""
        self._reduce()
        return "".join(self._texts)

    def _reduce(self) -> None:
        buffer = self._rest + b"".join(self._raw)
        self._raw.clear()
        self._size = 0
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        blocks = buffer.split(b"\n\n")
        self._rest = blocks.pop()
        texts_of = self._texts_of
        for block in blocks:
            event = parse_block(block)
            if event is None:
                continue
            name, payload = event
            try:
                chunk = loads(payload)
            except JSONError:
                continue  # [DONE], or no JSON: no text in it
            if isinstance(chunk, dict):
                self._texts.extend(
                    texts_of(None if name is None else name.decode("latin-1"), chunk)
                )


class Tally:
    """What the upstream produced for one request (see the module docstring)."""

    __slots__ = (
        "completion_tokens",
        "deltas",
        "ended",
        "finished_choices",
        "first_token_at",
        "model",
        "prompt_tokens",
        "requests",
        "sent_after_cut",
        "transcript",
    )

    def __init__(self, texts_of: TextsOf) -> None:
        self.requests = 0  # requests whose headers went out to the upstream
        self.deltas = 0  # events that carried generated output (text, a tool call's part)
        self.finished_choices: set[int] = set()  # the indexes that got a finish_reason
        self.ended = False  # the API's own last event came (Responses, Messages)
        self.model: str | None = None
        #: The counts the upstream reported (None: it did not, or not yet).
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.first_token_at: float | None = None  # time.monotonic() of the first delta
        self.sent_after_cut = False  # a request went out after the request was cut
        self.transcript = Transcript(texts_of)

    def saw_model(self, model: object) -> None:
        if isinstance(model, str) and model:
            self.model = model

    def report(self, prompt: object = None, completion: object = None) -> None:
        """Counts the upstream reported; a value that is no count is ignored."""
        if (count := _count(prompt)) is not None:
            self.prompt_tokens = count
        if (count := _count(completion)) is not None:
            self.completion_tokens = count

    def saw_whole(self, answer: dict[str, Any], texts: list[str], *, ended: bool) -> None:
        """A named-event API's answer that came whole: its model, its usage, its ``texts``.

        Both the Responses and the Messages API name the counts ``input_tokens``
        and ``output_tokens``; ``ended``: whether it is a whole answer, not a failed one.
        """
        self.saw_model(answer.get("model"))
        usage = answer.get("usage")
        if isinstance(usage, dict):
            self.report(usage.get("input_tokens"), usage.get("output_tokens"))
        self.deltas += sum(1 for text in texts if text)
        self.transcript.add_texts(texts)
        self.ended = ended

    def first_token(self) -> None:
        """A delta came: note when, if it is the first."""
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()

    def add(self, chunk: dict[str, Any]) -> None:
        """One chat or text completion chunk (parsed)."""
        self.saw_model(chunk.get("model"))
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.report(usage.get("prompt_tokens"), usage.get("completion_tokens"))
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

    @property
    def reported(self) -> bool:
        """True if the upstream said both counts."""
        return self.prompt_tokens is not None and self.completion_tokens is not None


def _count(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None
