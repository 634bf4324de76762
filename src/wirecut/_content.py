"""``content_text``: a message's content as plain text, as llama.cpp's chat template reads it.

The Responses and Messages APIs give content as a string or as a list of
parts, and llama.cpp's conversion to chat messages keeps only the text
parts: the simulator does that conversion as llama.cpp does, and the proxy
does it to count a prompt with the upstream's chat template.

A pure function; call it from any thread. Imports nothing from the project,
so every layer may use it.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["content_text"]


def content_text(content: object) -> str:
    """``content`` if it is a string, its parts' ``text`` joined if a list; else empty."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""
