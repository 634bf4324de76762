"""Reading the simulator's event log for the proof tools: who decoded, who closed, when.

The simulator (``wirecut.simulator``) logs every request's life with
``time.monotonic()`` stamps (CLOCK_MONOTONIC, one clock for every process of
the machine), so a client-side cancel time and the simulator's
``t_disconnect`` (the moment its server saw the peer close) can be
subtracted. The log is read in this process (``SimulatorServer``: its waits
wake on the log's condition) or over HTTP from the simulator's own process
(``SimProcess``: its waits poll). Every wait here is bounded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from wirecut.simulator import EventKind, SimEvent

__all__ = ["EventSource", "ProviderSide", "provider_side", "wait_decoding"]


class EventSource(Protocol):
    """A simulator's event log: ``SimulatorServer``, or ``SimProcess`` for another process."""

    def events(self, since: int = 0) -> list[SimEvent]: ...

    def wait_for(
        self, match: Callable[[SimEvent], bool], /, *, timeout: float, since: int = 0
    ) -> SimEvent: ...


def wait_decoding(sim: EventSource, count: int, since: int, timeout: float) -> list[str]:
    """Wait until ``count`` requests received after ``since`` produced their first token.

    Returns their request ids, in the order they started decoding. Raises
    TimeoutError naming how many did within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    decoding: list[str] = []
    cursor = since
    while len(decoding) < count:
        remaining = deadline - time.monotonic()
        try:
            event = sim.wait_for(
                lambda ev: ev.kind == EventKind.FIRST_TOKEN, timeout=max(remaining, 0), since=cursor
            )
        except TimeoutError:
            raise TimeoutError(
                f"only {len(decoding)} of {count} requests started decoding within {timeout} s"
            ) from None
        cursor = event.seq + 1
        if event.request_id is not None and event.request_id not in decoding:
            decoding.append(event.request_id)
    return decoding


@dataclass(frozen=True)
class ProviderSide:
    """What the simulator did with one request after a cancel at ``cancelled_at``.

    ``closed_at`` is when its server saw the peer close (None: not within the
    window); ``freed_at`` when the request's slot was freed (None: not
    within the window); ``n_decoded`` the tokens it had produced by then.
    """

    request_id: str
    cancelled_at: float
    closed_at: float | None
    freed_at: float | None
    finish: str | None
    n_decoded: int

    @property
    def close_ms(self) -> float | None:
        if self.closed_at is None:
            return None
        return max(0.0, (self.closed_at - self.cancelled_at) * 1000)


def provider_side(
    sim: EventSource,
    request_ids: list[str],
    since: int,
    cancelled_at: float,
    window: float,
) -> list[ProviderSide]:
    """Wait (at most ``window`` seconds after the cancel) until each request's slot is freed.

    Returns early once every slot was freed. A request whose server did not
    see the close within the window has ``closed_at`` None, even if it saw
    it later.
    """
    deadline = cancelled_at + window
    pending = set(request_ids)
    cursor = since
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            event = sim.wait_for(
                lambda ev: ev.kind == EventKind.SLOT_FREED and ev.request_id in pending,
                timeout=remaining,
                since=cursor,
            )
        except TimeoutError:
            break
        cursor = event.seq + 1
        pending.discard(event.request_id or "")
    events = sim.events(since)
    return [_side(rid, events, cancelled_at, deadline) for rid in request_ids]


def _side(
    request_id: str, events: list[SimEvent], cancelled_at: float, deadline: float
) -> ProviderSide:
    closed_at = freed_at = None
    finish = None
    n_decoded = 0
    for ev in events:
        if ev.request_id != request_id or ev.t > deadline:
            continue
        if ev.kind == EventKind.TOKEN:
            n_decoded = max(n_decoded, int(ev.detail.get("n", 0)))  # type: ignore[call-overload]
        elif ev.kind == EventKind.PEER_CLOSED:
            t = ev.detail.get("t_disconnect")
            closed_at = t if isinstance(t, float) else ev.t
        elif ev.kind == EventKind.REQUEST_FINISHED:
            finish = str(ev.detail.get("reason"))
        elif ev.kind == EventKind.SLOT_FREED:
            freed_at = ev.t
    return ProviderSide(request_id, cancelled_at, closed_at, freed_at, finish, n_decoded)
