"""``ProxyRecord``: what the proxy writes, one JSON line per finished request.

The shape is fixed by docs/protocol.md ("The proxy"): the same facts as the
console's ``complete``, made of the same parts (``wirecut.record``: the
status, the unwind timeline), for one proxied request; the reasons are the
proxy's own, and so is the usage (``BilledUsage``: counts a team can bill,
each saying where it came from). A record also says when the request
arrived (wall clock), how long it took and its time to first token, so that
it can be matched to a front-end's logs, and which client key and upstream
served it. Built once per request, on the event loop, by
``ProxyRecord.build``; ``RecordLog`` (``_record_log``) writes it to
``DATA_DIR/proxy.jsonl``.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import Any

from wirecut.proxy._usage import BilledUsage
from wirecut.record import (
    WORKER_EXITED,
    Ending,
    Status,
    TimelineStep,
    decide,
    unwind_timeline,
)
from wirecut.scope import InterruptScope, TimelineEvent

__all__ = [
    "RECORD_FILE",
    "WORKER_EXITED",
    "ProxyRecord",
    "RecordReason",
]

#: The file under the data directory that holds the records.
RECORD_FILE = "proxy.jsonl"


class RecordReason(enum.StrEnum):
    """Who ended a request that did not finish by itself.

    The proxy's own reasons, under the console's rule (``wirecut.record.decide``):
    a request's ``status`` is one of ``Status`` (``cancelled`` and ``timeout``
    mean the answer did not arrive whole; ``error``: the upstream refused it,
    could not be reached, or broke off).
    """

    DISCONNECT = "disconnect"  # the client closed its connection
    CANCEL = "cancel"  # POST /v1/requests/{id}/cancel
    TIMEOUT = "timeout"  # --request-timeout passed
    UPSTREAM = "upstream"  # the upstream answered an error, could not be reached, or broke off
    SHUTDOWN = "shutdown"  # the proxy is stopping

    @property
    def status(self) -> Status:
        """The status of a request this reason ended before its answer arrived."""
        if self is RecordReason.TIMEOUT:
            return Status.TIMEOUT
        if self is RecordReason.UPSTREAM:
            return Status.ERROR
        return Status.CANCELLED


@dataclasses.dataclass(frozen=True)
class ProxyRecord:
    """One finished request (docs/protocol.md, "The proxy").

    ``usage``: ``BilledUsage`` (the upstream's counts, or the proxy's,
    marked ``estimated``). ``timeline`` is the scope's unwind
    (``InterruptScope.timeline``) plus ``worker_exited``, empty for a
    request that was not cut. ``arrived_at`` is the wall-clock time of the
    request's arrival (ISO 8601, UTC); ``duration_ms`` runs from there to
    the end of its relay (or of its wait, for one cut while queued);
    ``ttft_ms`` to the first event that carried generated output (None:
    none came). ``key`` names the client key it came with (None: no named
    keys), ``upstream`` the upstream it was routed to, ``route`` the API.
    """

    id: str
    model: str | None
    stream: bool
    status: Status
    reason: RecordReason | None
    usage: BilledUsage
    queued_ms: float
    cancel_to_upstream_close_ms: float | None
    timeline: tuple[TimelineStep, ...]
    route: str = "/v1/chat/completions"
    key: str | None = None
    upstream: str | None = None
    arrived_at: str | None = None
    duration_ms: float | None = None
    ttft_ms: float | None = None

    @classmethod
    def build(
        cls,
        *,
        id: str,
        model: str | None,
        stream: bool,
        complete: bool,
        reason: RecordReason | None,
        usage: BilledUsage,
        queued_ms: float,
        scope: InterruptScope,
        worker_exited_at: float | None,
        route: str = "/v1/chat/completions",
        key: str | None = None,
        upstream: str | None = None,
        arrived_wall: float | None = None,
        duration_ms: float | None = None,
        ttft_ms: float | None = None,
    ) -> ProxyRecord:
        """The record of a request whose answer arrived whole (``complete``) or not.

        A complete answer is ``ok`` with no reason, even if a cancel came too
        late to stop it; an incomplete one without a reason is the proxy's
        own failure (``error``). ``worker_exited_at`` (``time.monotonic()``) adds the
        ``worker_exited`` step to a cut request's timeline.
        """
        # A cancel that came after the whole answer is no news in the record.
        status, reason, _late = decide(Ending.RETURNED if complete else Ending.CUT, reason)
        steps: tuple[TimelineStep, ...] = ()
        close_ms = None
        if not complete:
            steps = unwind_timeline(scope, worker_exited_at) or ()
            for step in steps:
                if step.event == TimelineEvent.SOCKETS_SHUT:
                    close_ms = round(step.ms, 3)
        return cls(
            id=id,
            model=model,
            stream=stream,
            status=status,
            reason=reason,
            usage=usage,
            queued_ms=round(queued_ms, 3),
            cancel_to_upstream_close_ms=close_ms,
            timeline=steps,
            route=route,
            key=key,
            upstream=upstream,
            arrived_at=None if arrived_wall is None else iso8601(arrived_wall),
            duration_ms=None if duration_ms is None else round(duration_ms, 3),
            ttft_ms=None if ttft_ms is None else round(ttft_ms, 3),
        )

    def to_json(self) -> dict[str, Any]:
        """The wire shape (a JSON object)."""
        return {
            "id": self.id,
            "model": self.model,
            "stream": self.stream,
            "status": str(self.status),
            "reason": None if self.reason is None else str(self.reason),
            "usage": self.usage.to_wire(),
            "queued_ms": self.queued_ms,
            "cancel_to_upstream_close_ms": self.cancel_to_upstream_close_ms,
            "timeline": [step.to_wire() for step in self.timeline],
            "route": self.route,
            "key": self.key,
            "upstream": self.upstream,
            "arrived_at": self.arrived_at,
            "duration_ms": self.duration_ms,
            "ttft_ms": self.ttft_ms,
        }

    def with_usage(self, usage: BilledUsage) -> ProxyRecord:
        """This record with ``usage`` (counted after the record was decided)."""
        return dataclasses.replace(self, usage=usage)


def iso8601(wall: float) -> str:
    """``time.time()`` as ISO 8601 in UTC, to the millisecond (``2026-12-07T06:42:04.123Z``)."""
    moment = datetime.datetime.fromtimestamp(wall, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
