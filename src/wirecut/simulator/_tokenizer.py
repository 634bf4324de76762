"""The simulator's one tokenizer and chat template: what every count it reports is made of.

llama.cpp counts ``usage`` with the model's tokenizer and offers the same one
at ``/tokenize``, ``/detokenize`` and ``/apply-template``, so that a proxy
can count what it relayed in tokens, not in chunks. The simulator does the
same with this module: the tokens it decodes, the ``prompt_tokens`` it
reports and what ``/tokenize`` answers are all ``split`` of the same text.

The rule, a pure function of the text:

- a run of non-space ASCII with the whitespace after it is one token (with
  the whitespace before it too, at the start of the text);
- any other run of whitespace is one token;
- every other character is one token per byte of its UTF-8 form, like a
  byte-level BPE's rare characters: such a byte alone is no text, so a
  stream carries the character only once its last byte is decoded (one
  chunk for several tokens, as llama.cpp sends multi-byte text);
- with ``parse_special``, ``<|im_start|>``, ``<|im_end|>`` and
  ``<|endoftext|>`` are one token each.

The template is ChatML (SmolLM2's, the project's local model): a message is
``<|im_start|>ROLE\\nTEXT<|im_end|>\\n`` and the prompt ends with
``<|im_start|>assistant\\n``; ``TEXT`` is the message's text (its text parts
joined; tool calls are not rendered). Like ChatML models the vocabulary adds
no BOS, so ``add_special`` changes nothing.

Ids: a byte (or one ASCII character) is its value, the special tokens follow,
then the simulator's own words; any other piece is a hash of its text, which
``Tokenizer`` remembers (a bounded number) so that ``/detokenize`` can map it
back. The functions are pure and safe from any thread; a ``Tokenizer`` guards
its memory with a lock.
"""

from __future__ import annotations

import re
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from wirecut._content import content_text
from wirecut.simulator._words import MULTIBYTE_WORDS, WORDS

__all__ = [
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "SPECIAL_TOKENS",
    "Token",
    "Tokenizer",
    "UnknownToken",
    "apply_template",
    "count_tokens",
    "split",
]

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"

#: The template ``apply_template`` renders, in the Jinja form ``/props`` shows.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_SPECIAL = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")
# Non-space ASCII with the whitespace after it (and before it, at the start) |
# whitespace | one other character. On ASCII text this is the word rule that
# scripted replies have always been cut by.
_PIECE = re.compile(r"\A\s*[^\s\x80-\U0010ffff]+\s*|[^\s\x80-\U0010ffff]+\s*|\s+|[^\x00-\x7f]")

_FIRST_SPECIAL_ID = 256
_FIRST_WORD_ID = _FIRST_SPECIAL_ID + len(SPECIAL_TOKENS)
# The simulator's own words, with and without their trailing space: fixed ids.
_WORD_IDS: dict[str, int] = {
    piece: _FIRST_WORD_ID + i
    for i, piece in enumerate(sorted({w + s for w in WORDS for s in ("", " ")}))
}
_FIRST_HASHED_ID = 1024
_ID_LIMIT = 2**31  # llama.cpp keeps a token id in a 32-bit int
_FIXED: dict[int, bytes] = {
    **{b: bytes([b]) for b in range(256)},
    **{_FIRST_SPECIAL_ID + i: s.encode() for i, s in enumerate(SPECIAL_TOKENS)},
    **{i: piece.encode() for piece, i in _WORD_IDS.items()},
}
assert max(_FIXED) < _FIRST_HASHED_ID
# Generated multi-byte words are all non-ASCII: they need no ids of their own.
assert all(ord(c) > 0x7F for w in MULTIBYTE_WORDS for c in w)


class UnknownToken(ValueError):
    """``detokenize`` got an id that is no token of this tokenizer (``token`` says which)."""

    def __init__(self, token: int, message: str) -> None:
        super().__init__(message)
        self.token = token


@dataclass(frozen=True, slots=True)
class Token:
    """One token: its id and the bytes it stands for."""

    id: int
    piece: bytes

    def piece_json(self) -> str | list[int]:
        """The piece as llama.cpp's ``/tokenize`` shows it: text, or its bytes if not UTF-8."""
        try:
            return self.piece.decode("utf-8")
        except UnicodeDecodeError:
            return list(self.piece)


def split(text: str, *, parse_special: bool = True) -> list[str | bytes]:
    """``text`` as tokens: a ``str`` for each piece of text, one ``bytes`` per byte of the rest.

    Joining the pieces (the bytes decoded together) gives ``text`` back.
    """
    out: list[str | bytes] = []
    parts = _SPECIAL.split(text) if parse_special else [text]
    for i, part in enumerate(parts):
        if i % 2:  # the capturing split puts each special token at an odd index
            out.append(part)
            continue
        for piece in _PIECE.findall(part):
            if len(piece) == 1 and ord(piece) > 0x7F and not piece.isspace():
                out.extend(bytes([b]) for b in piece.encode())
            else:
                out.append(piece)
    return out


def count_tokens(text: str) -> int:
    """How many tokens ``text`` is (special tokens parsed), without building them."""
    return len(split(text))


def apply_template(messages: Sequence[Mapping[str, object]]) -> str:
    """The ChatML prompt for chat ``messages``, ending with the assistant's turn."""
    turns = [
        f"<|im_start|>{message.get('role')}\n{content_text(message.get('content'))}<|im_end|>\n"
        for message in messages
    ]
    return "".join(turns) + "<|im_start|>assistant\n"


class Tokenizer:
    """``split`` with ids, and back; it remembers the hashed ids it handed out.

    Safe to call from any thread. One per simulator: the ids of words
    outside the simulator's own are known to ``detokenize`` only for text
    this instance tokenized, the latest ``remember`` of them.
    """

    def __init__(self, remember: int = 65_536) -> None:
        if remember < 1:
            raise ValueError(f"remember must be >= 1, got {remember!r}")
        self._remember = remember
        # Guards the memory of hashed ids, which routes on any thread may touch.
        self._lock = threading.Lock()
        self._hashed: OrderedDict[int, bytes] = OrderedDict()

    def tokenize(self, text: str, *, parse_special: bool = True) -> list[Token]:
        """``text`` as ``Token``s (see ``split``)."""
        tokens: list[Token] = []
        parts = _SPECIAL.split(text) if parse_special else [text]
        for i, part in enumerate(parts):
            if i % 2:
                tokens.append(Token(_FIRST_SPECIAL_ID + SPECIAL_TOKENS.index(part), part.encode()))
                continue
            for piece in split(part, parse_special=False):
                tokens.append(self._token(piece))
        return tokens

    def detokenize(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; bytes that are no UTF-8 become U+FFFD, as llama.cpp's do.

        Raises ``UnknownToken`` for an id this tokenizer never gave out.
        """
        return b"".join(self.lookup(token).piece for token in ids).decode("utf-8", "replace")

    def lookup(self, token: int) -> Token:
        """The ``Token`` of id ``token``; ``UnknownToken`` if this tokenizer never gave it out."""
        piece = _FIXED.get(token)
        if piece is None:
            with self._lock:
                piece = self._hashed.get(token)
        if piece is None:
            raise UnknownToken(token, self._unknown(token))
        return Token(token, piece)

    def _token(self, piece: str | bytes) -> Token:
        if isinstance(piece, bytes):
            return Token(piece[0], piece)
        data = piece.encode()
        if len(data) == 1:
            return Token(data[0], data)
        token = _WORD_IDS.get(piece)
        if token is not None:
            return Token(token, data)
        token = _FIRST_HASHED_ID + zlib.crc32(data) % (_ID_LIMIT - _FIRST_HASHED_ID)
        with self._lock:
            self._hashed[token] = data
            self._hashed.move_to_end(token)
            if len(self._hashed) > self._remember:
                self._hashed.popitem(last=False)
        return Token(token, data)

    def _unknown(self, token: int) -> str:
        if not 0 <= token < _ID_LIMIT:
            return f"token {token} is out of range: ids are 0 to {_ID_LIMIT - 1}"
        return (
            f"token {token} is unknown: the simulator knows the ids of words outside its "
            f"own only for the last {self._remember} pieces it tokenized"
        )
