"""What every terminal record of wirecut shares: a status, usage, and an unwind timeline.

The console's ``complete`` (``CompleteFacts``, ``_complete``) and the
proxy's record (``wirecut.proxy.ProxyRecord``) say the same facts about
different work, so they are made of these: ``Status`` (``cancelled`` and
``timeout`` promise that the effect did not happen), ``UsageFacts`` (``None``
for a count nobody could know, never 0) and the ``TimelineStep``s of a
scope's unwind, read in one place (``unwind_timeline``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wirecut.provider import Usage
    from wirecut.scope import InterruptScope

__all__ = [
    "NO_USAGE",
    "WORKER_EXITED",
    "Status",
    "TimelineStep",
    "UsageFacts",
    "make_timeline",
    "unwind_timeline",
    "usage_facts",
]

#: The step a host adds to a scope's own: the thread that ran the work returned.
WORKER_EXITED = "worker_exited"


class Status(enum.StrEnum):
    """How a command ended (the ``status`` of its ``complete``)."""

    OK = "ok"  # it did what it was asked; a late cancel may be noted beside it
    ERROR = "error"  # it failed, or its remote host was lost
    CANCELLED = (
        "cancelled"  # cut by a user, a disconnect or the shutdown: its effect did not happen
    )
    TIMEOUT = "timeout"  # cut by its timeout: its effect did not happen


@dataclass(frozen=True, slots=True)
class TimelineStep:
    """One step of a command's unwind, in milliseconds from its cancel."""

    event: str
    ms: float

    def to_wire(self) -> dict[str, Any]:
        return {"event": self.event, "ms": round(self.ms, 3)}


def make_timeline(steps: Iterable[tuple[str, float]]) -> tuple[TimelineStep, ...]:
    """Steps sorted by time (none before the cancel), from ``(event, ms)`` pairs."""
    made = [TimelineStep(str(event), max(float(ms), 0.0)) for event, ms in steps]
    return tuple(sorted(made, key=lambda step: step.ms))


@dataclass(frozen=True, slots=True)
class UsageFacts:
    """What the provider produced for a command; ``None``: a count nobody could know."""

    prompt_tokens: int | None = 0
    completion_tokens: int | None = 0
    requests: int | None = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "requests": self.requests,
        }

    def __add__(self, other: UsageFacts) -> UsageFacts:
        return UsageFacts(
            _add(self.prompt_tokens, other.prompt_tokens),
            _add(self.completion_tokens, other.completion_tokens),
            _add(self.requests, other.requests),
        )


#: The usage of work that asked nothing of any provider.
NO_USAGE = UsageFacts()


def usage_facts(usage: Usage) -> UsageFacts:
    """The record's counts of a provider ``Usage`` (an unknown count stays ``None``)."""
    return UsageFacts(usage.prompt_tokens, usage.completion_tokens, usage.requests)


def unwind_timeline(
    scope: InterruptScope, worker_exited_at: float | None
) -> tuple[TimelineStep, ...] | None:
    """The unwind of ``scope`` as steps from its cancel, and the worker's exit (None: no cancel).

    ``worker_exited_at`` (``time.monotonic()``) adds ``worker_exited``; None
    leaves it out (the worker never ran, or has not returned).
    """
    cancelled_at = scope.cancelled_at
    if cancelled_at is None:
        return None
    pairs: list[tuple[str, float]] = [(str(event), ms) for event, ms in scope.timeline]
    if worker_exited_at is not None:
        pairs.append((WORKER_EXITED, (worker_exited_at - cancelled_at) * 1000))
    return make_timeline(pairs)


def _add(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b
