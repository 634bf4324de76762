"""Deterministic reply text: the same messages always give the same words.

Pure functions; call from anywhere.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator, Sequence

__all__ = ["count_prompt_tokens", "word_stream"]

# Plain lowercase words so that tests can assert on text without escaping.
WORDS: tuple[str, ...] = (
    "the", "slot", "is", "busy", "token", "after", "token", "a", "model", "writes",
    "slowly", "while", "nobody", "reads", "cancel", "means", "the", "socket", "closes",
    "and", "then", "provider", "sees", "peer", "gone", "frees", "its", "queue", "moves",
    "on", "wire", "cut", "prompt", "decode", "stream", "reply", "word", "by", "quiet",
    "fast", "late", "early", "thread", "returns", "scope", "holds", "every", "request",
)  # fmt: skip


def word_stream(messages: Sequence[object]) -> Iterator[str]:
    """An endless stream of tokens ("word ") seeded by the request's messages."""
    canonical = json.dumps(messages, sort_keys=True, ensure_ascii=True, default=str)
    seed = int.from_bytes(hashlib.sha256(canonical.encode()).digest()[:8], "big")
    # A private Random: the global one is shared with the rest of the process.
    rng = random.Random(seed)
    while True:
        yield rng.choice(WORDS) + " "


def count_prompt_tokens(messages: Sequence[object]) -> int:
    """A rough prompt size for ``usage``: whitespace-separated words of the text parts."""
    total = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            total += len(content.split())
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += len(part["text"].split())
    return max(total, 1)
