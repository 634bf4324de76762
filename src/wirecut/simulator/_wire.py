"""How a reply goes on the wire: one ``Wire`` per generation route.

The decode loop (``_completion``) is the same for every route; a ``Wire``
turns what it produces into the route's bytes: a stream's events, piece by
piece and at the end, or the whole non-stream body. A ``Wire`` holds the
state of one response (which blocks are open, event numbers) and is used by
that response's task only.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from wirecut.simulator._pieces import Piece

__all__ = ["ErrorBody", "Finish", "Usage", "Wire"]

#: ``(message, type, param)`` to a route's error body (OpenAI's or Anthropic's shape).
ErrorBody = Callable[[str, str, str | None], dict[str, object]]


class Finish(enum.Enum):
    """Why a reply ended, in chat-completions words; each route names it its way."""

    # It reached its own end (generated length, or the script's last token).
    STOP = "stop"
    # max_tokens (or the route's name for it) cut it.
    LENGTH = "length"
    # A scripted reply that ends with tool calls reached its end.
    TOOL_CALLS = "tool_calls"


@dataclass(frozen=True, slots=True)
class Usage:
    """The token counts of one reply, as the simulator's tokenizer counts them."""

    prompt_tokens: int
    completion_tokens: int


class Wire(Protocol):
    """One response's encoder; see the module docstring."""

    def token(self, piece: Piece) -> bytes:
        """The stream bytes that carry ``piece`` (the first also opens the reply)."""
        ...

    def end(self, finish: Finish, usage: Usage) -> bytes:
        """The stream's last bytes: what closes the reply, with its usage."""
        ...

    def whole(self, pieces: Sequence[Piece], finish: Finish, usage: Usage) -> dict[str, object]:
        """The non-stream body for a reply made of ``pieces``."""
        ...
