"""Reading JSON that came from outside: one error type, bounded nesting.

``json.loads`` parses ``[[[[…`` a thousand levels deep by recursing in C
until it raises ``RecursionError``, which is not a ``ValueError`` and so
slips past every ``except ValueError`` that guards a parse; and a value that
did parse a few hundred levels deep raises ``RecursionError`` later, in
whatever walks it recursively (``repr`` in an error message, a JSON-schema
validator, ``json.dumps``). ``loads`` turns both into a ``JSONError`` (a
``ValueError``) at the boundary. No real message from a provider, a model's
tool call or a plan nests anywhere near ``MAX_DEPTH``.

A pure function; call it from any thread. Imports nothing from the project,
so every layer may use it.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "JSONError", "loads"]

#: How deeply arrays and objects may nest in a value ``loads`` returns.
MAX_DEPTH = 64


class JSONError(ValueError):
    """The text is not JSON, or its arrays and objects nest deeper than allowed."""


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``text``; ``JSONError`` (one line) if it is not JSON or nests past ``max_depth``.

    An array or object at the top is depth 1. Raises nothing else.
    """
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONError(f"JSON nested more than {max_depth} levels deep") from None
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for bytes
        raise JSONError(f"not JSON ({exc})") from None
    if _brackets(text) > max_depth and _nests_deeper(value, max_depth):
        raise JSONError(f"JSON nested more than {max_depth} levels deep")
    return value


def _brackets(text: str | bytes) -> int:
    """How many arrays and objects ``text`` opens at most: a bound on its depth.

    Counted in C, so the walk in Python is only needed for a text that could
    nest too deeply (a streamed chunk opens about five).
    """
    if isinstance(text, str):
        return text.count("[") + text.count("{")
    return text.count(b"[") + text.count(b"{")


def _nests_deeper(value: Any, max_depth: int) -> bool:
    # Iterative on purpose: a recursive walk is what this guards against.
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False
