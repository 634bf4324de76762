"""The simulator's event log: what happened to each request, and when.

Tests and benchmarks read it to prove claims such as "the provider saw the
peer close and freed the slot within one token". Every event carries a
``time.monotonic()`` timestamp taken under the log's lock, so timestamps never
decrease in ``seq`` order.

Appended from the server's event-loop thread; read, waited on and cleared from
any thread.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["EventKind", "EventLog", "SimEvent"]


class EventKind(enum.StrEnum):
    """What an event records; a ``StrEnum`` so ``ev.kind == "peer_closed"`` works."""

    # The request was parsed and accepted (detail: route, stream, client,
    # scripted, max_tokens).
    REQUEST_RECEIVED = "request_received"
    # No slot was free; the request waits in the FIFO queue (detail: position).
    REQUEST_QUEUED = "request_queued"
    # The request took a slot (detail: slot).
    SLOT_ACQUIRED = "slot_acquired"
    # With prompt_tokens_per_second: one batch of the prompt was processed
    # (detail: slot, n_prompt = prompt tokens processed so far, of = the
    # prompt's size). A client that closed is noticed only between these.
    PROMPT_BATCH = "prompt_batch"
    # The prompt time passed and the first token was produced (detail: slot).
    FIRST_TOKEN = "first_token"
    # One more token was decoded (detail: slot, n = tokens so far).
    TOKEN = "token"
    # The simulator observed that the client closed the connection
    # (detail: where = "queue" | "prompt" | "decode", n_decoded, t_disconnect).
    PEER_CLOSED = "peer_closed"
    # The request is over (detail: reason = "stop" | "length" | "tool_calls" |
    # "peer_closed" | "shutdown" | "error", n_decoded). Every request ends
    # with one, before its slot_freed.
    REQUEST_FINISHED = "request_finished"
    # The slot is free again or handed to the next queued request (detail: slot).
    SLOT_FREED = "slot_freed"


@dataclass(frozen=True, slots=True)
class SimEvent:
    """One entry of the log. ``seq`` numbers are never reused, even after a clear."""

    seq: int
    t: float
    kind: EventKind
    request_id: str | None
    detail: Mapping[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        """The shape served at ``GET /sim/events``."""
        return {
            "seq": self.seq,
            "t": self.t,
            "kind": str(self.kind),
            "request_id": self.request_id,
            "detail": dict(self.detail),
        }

    @classmethod
    def from_json(cls, item: Mapping[str, object]) -> SimEvent:
        """An event read back from ``GET /sim/events`` (another process's log)."""
        seq, t, request_id, detail = item["seq"], item["t"], item["request_id"], item["detail"]
        if not isinstance(seq, int) or not isinstance(t, int | float):
            raise ValueError(f"not a simulator event: {item!r}")
        return cls(
            seq=seq,
            t=float(t),
            kind=EventKind(str(item["kind"])),
            request_id=request_id if isinstance(request_id, str) else None,
            detail=detail if isinstance(detail, Mapping) else {},
        )


class EventLog:
    """A thread-safe, bounded, append-only list of ``SimEvent``.

    Safe to call from any thread. ``wait_for`` blocks the calling thread on a
    condition that every append notifies: no polling.
    """

    def __init__(self, max_events: int = 200_000) -> None:
        if max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events!r}")
        self._max_events = max_events
        # One condition guards the list and the counter, and wakes waiters on append.
        self._cond = threading.Condition()
        self._events: list[SimEvent] = []
        self._next_seq = 0

    def append(self, kind: EventKind, request_id: str | None, **detail: object) -> SimEvent:
        """Record an event now and wake every ``wait_for``."""
        with self._cond:
            event = SimEvent(
                seq=self._next_seq,
                t=time.monotonic(),
                kind=kind,
                request_id=request_id,
                detail=MappingProxyType(detail),
            )
            self._next_seq += 1
            self._events.append(event)
            # A long endless run logs a token event per token: keep memory bounded
            # by dropping the oldest tenth at once (seq numbers stay absolute).
            if len(self._events) > self._max_events:
                del self._events[: max(1, self._max_events // 10)]
            self._cond.notify_all()
        return event

    def snapshot(self, since: int = 0) -> list[SimEvent]:
        """Events with ``seq >= since``, oldest first."""
        with self._cond:
            return self._events[self._position(since) :]

    def clear(self) -> None:
        """Forget every event; later events keep counting ``seq`` upward."""
        with self._cond:
            self._events.clear()

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next event will get: pass it as ``since`` to skip the past."""
        with self._cond:
            return self._next_seq

    def wait_for(
        self,
        predicate: Callable[[SimEvent], bool],
        timeout: float,
        since: int = 0,
    ) -> SimEvent:
        """Block until an event with ``seq >= since`` satisfies ``predicate``; return it.

        Events already in the log count. Raises ``TimeoutError`` after
        ``timeout`` seconds, naming the last few events seen.
        """
        deadline = time.monotonic() + timeout
        cursor = since
        with self._cond:
            while True:
                for event in self._events[self._position(cursor) :]:
                    if predicate(event):
                        return event
                cursor = self._next_seq
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    tail = ", ".join(f"{e.seq}:{e.kind}:{e.request_id}" for e in self._events[-8:])
                    raise TimeoutError(
                        f"no matching simulator event within {timeout} s (last: {tail or 'none'})"
                    )
                self._cond.wait(remaining)

    def _position(self, seq: int) -> int:
        # Caller holds the lock. seq numbers are dense in the list, so the
        # position is an offset from the oldest kept one.
        if not self._events:
            return 0
        return min(max(0, seq - self._events[0].seq), len(self._events))
