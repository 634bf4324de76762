"""``ProxyRecord``: what the proxy writes, one JSON line per finished request.

The shape is fixed by docs/protocol.md ("The proxy"): the same facts as the
console's ``complete``, made of the same parts (``wirecut.record``: the
status, the usage, the unwind timeline), for one proxied request; only the
reasons are the proxy's own. Built once per request, on the event loop, by
``ProxyRecord.build``; ``RecordLog`` (``_record_log``) writes it to
``DATA_DIR/proxy.jsonl``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from wirecut.provider import Usage
from wirecut.record import (
    WORKER_EXITED,
    Ending,
    Status,
    TimelineStep,
    UsageFacts,
    decide,
    unwind_timeline,
    usage_facts,
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


@dataclass(frozen=True)
class ProxyRecord:
    """One finished request (docs/protocol.md, "The proxy").

    ``usage`` reuses the provider's ``Usage``: ``estimated`` is True when the
    upstream sent no usage (it was cut first, or never sends it); the prompt
    count is then unknown (``null`` on the wire) and the completion count is
    the deltas received, one per token as llama.cpp and vLLM stream them.
    ``timeline`` is the scope's unwind (``InterruptScope.timeline``) plus
    ``worker_exited``, empty for a request that was not cut.
    """

    id: str
    model: str | None
    stream: bool
    status: Status
    reason: RecordReason | None
    usage: UsageFacts
    queued_ms: float
    cancel_to_upstream_close_ms: float | None
    timeline: tuple[TimelineStep, ...]

    @classmethod
    def build(
        cls,
        *,
        id: str,
        model: str | None,
        stream: bool,
        complete: bool,
        reason: RecordReason | None,
        usage: Usage,
        queued_ms: float,
        scope: InterruptScope,
        worker_exited_at: float | None,
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
        counts = usage_facts(usage)
        if usage.estimated:  # Counted from the deltas: the prompt's count never came.
            counts = UsageFacts(None, counts.completion_tokens, counts.requests)
        return cls(
            id=id,
            model=model,
            stream=stream,
            status=status,
            reason=reason,
            usage=counts,
            queued_ms=round(queued_ms, 3),
            cancel_to_upstream_close_ms=close_ms,
            timeline=steps,
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
        }
