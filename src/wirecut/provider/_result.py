"""What a chat call returns: ``ChatResult`` with its ``ToolCall``s and ``Usage``.

Plain data, safe to pass between threads once ``chat()`` returned it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ChatResult", "ToolCall", "Usage"]


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for.

    ``arguments`` is the raw JSON text exactly as the model produced it (it may
    be invalid or, after a cut, incomplete: parsing it is the caller's call).
    """

    id: str
    name: str
    arguments: str


@dataclass
class Usage:
    """Token counts of one ``chat()`` call, over all its requests.

    ``requests`` counts the HTTP requests sent (retries included).
    ``estimated`` is True when the provider sent no usage and the counts come
    from the received deltas (one content delta counted as one token).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    requests: int = 0
    estimated: bool = False


@dataclass
class ChatResult:
    """The answer of one ``chat()`` call.

    ``interrupted`` is True when the scope cut the request after it was sent;
    ``reason`` is then the scope's reason, and ``text``, ``tool_calls`` and
    ``usage`` hold what had arrived (tool-call arguments may be cut short).
    """

    text: str
    tool_calls: list[ToolCall]
    finish_reason: str | None
    usage: Usage = field(default_factory=Usage)
    interrupted: bool = False
    reason: str | None = None
    model: str | None = None
