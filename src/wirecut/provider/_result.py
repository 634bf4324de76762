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
    """Token counts of one ``chat()`` call, or of many summed with ``add``.

    ``requests`` counts the HTTP requests sent (retries included, and a
    request that failed or was cut). A token count that cannot be known is
    None, never 0: the prompt tokens of a request cut before the provider's
    usage came, or of one answered with an error status. ``estimated`` is
    True when a completion count comes from the streamed deltas (one delta
    counted as one token) because the provider sent no usage.

    Not thread-safe: whoever sums from several threads holds a lock.
    """

    prompt_tokens: int | None = 0
    completion_tokens: int | None = 0
    total_tokens: int | None = 0
    requests: int = 0
    estimated: bool = False

    def add(self, other: Usage) -> None:
        """Add ``other``'s counts to these; a sum with an unknown count is unknown."""
        self.prompt_tokens = _plus(self.prompt_tokens, other.prompt_tokens)
        self.completion_tokens = _plus(self.completion_tokens, other.completion_tokens)
        self.total_tokens = _plus(self.total_tokens, other.total_tokens)
        self.requests += other.requests
        self.estimated = self.estimated or other.estimated


def _plus(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


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
