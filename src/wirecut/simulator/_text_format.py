"""``/v1/completions`` wire shapes (legacy text completions), as llama.cpp emits them.

A stream is ``text_completion`` chunks, one per piece of text; the last one
has ``finish_reason`` and ``usage`` (llama.cpp always adds it), then
``data: [DONE]``. ``TextWire`` is one per response, used by its task only.
"""

from __future__ import annotations

from collections.abc import Sequence

from wirecut.simulator._openai_format import DONE, sse, usage
from wirecut.simulator._pieces import Piece
from wirecut.simulator._wire import Finish, Usage

__all__ = ["TextWire"]


class TextWire:
    """``/v1/completions`` on the wire."""

    def __init__(self, completion_id: str, model: str, created: int) -> None:
        self._id = completion_id
        self._model = model
        self._created = created

    def token(self, piece: Piece) -> bytes:
        return sse(self._chunk(piece.content, None))

    def end(self, finish: Finish, usage_: Usage) -> bytes:
        last = self._chunk("", _finish_reason(finish))
        last["usage"] = usage(usage_.prompt_tokens, usage_.completion_tokens)
        return sse(last) + DONE

    def whole(self, pieces: Sequence[Piece], finish: Finish, usage_: Usage) -> dict[str, object]:
        body = self._chunk("".join(p.content for p in pieces), _finish_reason(finish))
        body["usage"] = usage(usage_.prompt_tokens, usage_.completion_tokens)
        return body

    def _chunk(self, text: str, finish_reason: str | None) -> dict[str, object]:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
        return {
            "id": self._id,
            "object": "text_completion",
            "created": self._created,
            "model": self._model,
            "choices": [choice],
        }


def _finish_reason(finish: Finish) -> str:
    # A text completion has no tool calls: a reply is cut or at its end.
    return "length" if finish is Finish.LENGTH else "stop"
