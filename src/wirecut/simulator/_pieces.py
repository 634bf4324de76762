"""A reply as tokens (``Piece``), and back to the text a stream sends (``TextJoiner``).

Every reply, generated or scripted, is a sequence of pieces, one per token,
as the simulator's tokenizer splits its text (``_tokenizer``). A token that
is one byte of a multi-byte character carries no text of its own: the
joiner holds it until the character is whole, as llama.cpp holds back
incomplete UTF-8, so one chunk then carries several tokens. Pure values and
a per-request joiner; use from one thread at a time.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from dataclasses import dataclass, replace

from wirecut.simulator._tokenizer import split

__all__ = ["Piece", "ScriptedToolCall", "TextJoiner", "text_pieces"]


@dataclass(frozen=True, slots=True)
class ScriptedToolCall:
    """One tool call of a scripted reply; ``arguments`` is a JSON string."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Piece:
    """One token of a reply: some content, a tool call's header, or argument text.

    ``partial`` is one byte of a multi-byte character (of the content, or of
    the arguments of call ``tool_index``): a token with no text by itself.
    """

    content: str = ""
    tool_index: int | None = None
    tool_header: ScriptedToolCall | None = None
    arguments: str = ""
    partial: bytes = b""


def text_pieces(text: str, tool_index: int | None = None) -> Iterator[Piece]:
    """``text`` as content tokens, or as argument tokens of call ``tool_index``."""
    for token in split(text):
        if isinstance(token, bytes):
            yield Piece(tool_index=tool_index, partial=token)
        elif tool_index is None:
            yield Piece(content=token)
        else:
            yield Piece(tool_index=tool_index, arguments=token)


class TextJoiner:
    """Turns tokens into the pieces of text a stream can send; one per request."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # The token whose bytes are pending: its field is where their text goes.
        self._pending: Piece | None = None

    def feed(self, piece: Piece) -> Piece | None:
        """The text ``piece`` completes, or None while a character is still incomplete."""
        if not piece.partial:
            return piece
        self._pending = piece
        text = self._decoder.decode(piece.partial)
        if not text:
            return None
        self._pending = None
        return _with_text(piece, text)

    def flush(self) -> Piece | None:
        """What is left of an incomplete character, as U+FFFD (the reply was cut in it)."""
        pending, self._pending = self._pending, None
        text = self._decoder.decode(b"", final=True)
        if pending is None or not text:
            return None
        return _with_text(pending, text)


def _with_text(piece: Piece, text: str) -> Piece:
    if piece.tool_index is None:
        return replace(piece, content=text, partial=b"")
    return replace(piece, arguments=text, partial=b"")
