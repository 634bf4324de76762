"""``content_text``: a message's content as plain text, as llama.cpp's chat template reads it.

The Responses and Messages APIs give content as a string or as a list of
parts; for counting a prompt with the upstream's chat template
(``_responses.chat_messages``, ``_messages.chat_messages``) only the text
parts count. Pure function.
"""

from __future__ import annotations

__all__ = ["content_text"]


def content_text(content: object) -> str:
    """``content`` if it is a string, its parts' ``text`` joined if a list; else empty."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""
