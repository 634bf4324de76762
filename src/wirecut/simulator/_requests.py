"""Per-request lifecycle and summary (``GET /sim/requests``).

The event loop drives each request through ``RequestLedger.move``; any thread
may read ``summaries()``. The lifecycle::

    QUEUED -> PROMPT -> DECODING -> FINISHED
    (QUEUED | PROMPT | DECODING) -> PEER_CLOSED | ABORTED | FAILED
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass

__all__ = ["RequestLedger", "RequestState", "RequestSummary"]


class RequestState(enum.StrEnum):
    """Where a generation request is."""

    # Accepted; waiting for a free slot (possibly for no time at all).
    QUEUED = "queued"
    # Holds a slot; the prompt time is passing, no token yet.
    PROMPT = "prompt"
    # Holds a slot and produces tokens.
    DECODING = "decoding"
    # The whole reply was produced and sent.
    FINISHED = "finished"
    # The simulator observed the client close the connection and stopped.
    PEER_CLOSED = "peer_closed"
    # The simulator shut down under the request.
    ABORTED = "aborted"
    # The simulator failed serving it (its own bug): the client got a 500 in
    # the OpenAI error shape, or a stream cut short.
    FAILED = "failed"


_ENDED_EARLY = frozenset({RequestState.PEER_CLOSED, RequestState.ABORTED, RequestState.FAILED})
_TERMINAL = _ENDED_EARLY | {RequestState.FINISHED}
_ALLOWED: dict[RequestState, frozenset[RequestState]] = {
    RequestState.QUEUED: _ENDED_EARLY | {RequestState.PROMPT},
    # PROMPT -> FINISHED: a reply of zero tokens (reply_tokens=0).
    RequestState.PROMPT: _ENDED_EARLY | {RequestState.DECODING, RequestState.FINISHED},
    RequestState.DECODING: _ENDED_EARLY | {RequestState.FINISHED},
}


@dataclass(frozen=True, slots=True)
class RequestSummary:
    """A consistent copy of one request's record."""

    id: str
    state: RequestState
    stream: bool
    n_decoded: int
    closed_by_peer: bool
    slot: int | None
    finish_reason: str | None
    # time.monotonic() at receipt, and at the terminal state (None until then).
    t_start: float
    t_end: float | None
    # The path it came by ("/v1/chat/completions", "/v1/responses", ...).
    route: str = "/v1/chat/completions"

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "route": self.route,
            "state": str(self.state),
            "stream": self.stream,
            "n_decoded": self.n_decoded,
            "closed_by_peer": self.closed_by_peer,
            "slot": self.slot,
            "finish_reason": self.finish_reason,
            "t_start": self.t_start,
            "t_end": self.t_end,
        }


@dataclass(slots=True)
class _Record:
    id: str
    stream: bool
    route: str
    t_start: float
    state: RequestState = RequestState.QUEUED
    n_decoded: int = 0
    slot: int | None = None
    finish_reason: str | None = None
    t_end: float | None = None

    def summary(self) -> RequestSummary:
        return RequestSummary(
            id=self.id,
            state=self.state,
            stream=self.stream,
            n_decoded=self.n_decoded,
            closed_by_peer=self.state is RequestState.PEER_CLOSED,
            slot=self.slot,
            finish_reason=self.finish_reason,
            t_start=self.t_start,
            t_end=self.t_end,
            route=self.route,
        )


class RequestLedger:
    """Every request since the last ``clear``, with ids ``req-1``, ``req-2``, ...

    Mutated from the event loop; read from any thread. Ids are never reused.
    """

    def __init__(self) -> None:
        # Guards the records against a torn read by summaries() in another thread.
        self._lock = threading.Lock()
        self._records: dict[str, _Record] = {}
        self._counter = 0

    def open(self, stream: bool, route: str = "/v1/chat/completions") -> str:
        """Register a new request that came by ``route``, in state QUEUED; return its id."""
        with self._lock:
            self._counter += 1
            request_id = f"req-{self._counter}"
            self._records[request_id] = _Record(
                id=request_id, stream=stream, route=route, t_start=time.monotonic()
            )
            return request_id

    def move(
        self,
        request_id: str,
        state: RequestState,
        *,
        slot: int | None = None,
        finish_reason: str | None = None,
    ) -> None:
        """Move a request to ``state``; an illegal transition is a RuntimeError."""
        with self._lock:
            # clear() keeps in-flight records, so a moving request is always here.
            record = self._records[request_id]
            if state not in _ALLOWED.get(record.state, frozenset()):
                raise RuntimeError(
                    f"request {request_id}: cannot go from {record.state} to {state}"
                )
            record.state = state
            if slot is not None:
                record.slot = slot
            if finish_reason is not None:
                record.finish_reason = finish_reason
            if state in _TERMINAL:
                record.t_end = time.monotonic()

    def set_decoded(self, request_id: str, n_decoded: int) -> None:
        with self._lock:
            record = self._records.get(request_id)
            if record is not None:
                record.n_decoded = n_decoded

    def summaries(self) -> list[RequestSummary]:
        """Every request, oldest first; any thread."""
        with self._lock:
            return [record.summary() for record in self._records.values()]

    def clear(self) -> None:
        """Forget finished requests; in-flight ones stay (ids keep counting)."""
        with self._lock:
            self._records = {
                rid: rec for rid, rec in self._records.items() if rec.state not in _TERMINAL
            }
