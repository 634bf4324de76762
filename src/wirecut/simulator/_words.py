"""Deterministic reply text: the same messages always give the same words.

Pure functions; call from anywhere.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator, Sequence

__all__ = ["MULTIBYTE_WORDS", "WORDS", "word_stream"]

# Plain lowercase words so that tests can assert on text without escaping.
WORDS: tuple[str, ...] = (
    "the", "slot", "is", "busy", "token", "after", "token", "a", "model", "writes",
    "slowly", "while", "nobody", "reads", "cancel", "means", "the", "socket", "closes",
    "and", "then", "provider", "sees", "peer", "gone", "frees", "its", "queue", "moves",
    "on", "wire", "cut", "prompt", "decode", "stream", "reply", "word", "by", "quiet",
    "fast", "late", "early", "thread", "returns", "scope", "holds", "every", "request",
)  # fmt: skip

# Words whose every character is several bytes of UTF-8 and so several tokens
# (docs/protocol.md, "The simulator's tokenizer"): a stream carries each
# character in one chunk once its last byte is decoded.
MULTIBYTE_WORDS: tuple[str, ...] = ("日本", "データ", "данные", "κόσμος", "🙂", "éàü")


def word_stream(messages: Sequence[object], multibyte_every: int = 0) -> Iterator[str]:
    """An endless stream of words ("word ") seeded by the request's messages.

    With ``multibyte_every`` N > 0, every Nth word is one of ``MULTIBYTE_WORDS``.
    """
    canonical = json.dumps(messages, sort_keys=True, ensure_ascii=True, default=str)
    seed = int.from_bytes(hashlib.sha256(canonical.encode()).digest()[:8], "big")
    # A private Random: the global one is shared with the rest of the process.
    rng = random.Random(seed)
    n = 0
    while True:
        n += 1
        if multibyte_every and n % multibyte_every == 0:
            yield rng.choice(MULTIBYTE_WORDS) + " "
        else:
            yield rng.choice(WORDS) + " "
