"""``ProxyRecord``: what the proxy writes, one JSON line per finished request.

The shape is fixed by docs/protocol.md ("The proxy"): the same facts as the
console's ``complete`` (status, reason, usage, the unwind timeline), for one
proxied request. Built once per request, on the event loop, by
``ProxyRecord.build``; ``RecordLog`` appends it to ``DATA_DIR/proxy.jsonl``.
"""

from __future__ import annotations

import enum
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from wirecut.provider import Usage
from wirecut.scope import InterruptScope, TimelineEvent

__all__ = [
    "RECORD_FILE",
    "WORKER_EXITED",
    "ProxyRecord",
    "RecordLog",
    "RecordReason",
    "RecordStatus",
]

#: The file under the data directory that holds the records.
RECORD_FILE = "proxy.jsonl"

#: The timeline event the proxy adds to the scope's own: the thread that
#: held the upstream request returned (the console's ``complete`` has it too).
WORKER_EXITED: Literal["worker_exited"] = "worker_exited"

Step = tuple[TimelineEvent | Literal["worker_exited"], float]


class RecordStatus(enum.StrEnum):
    """How a request ended; ``cancelled`` and ``timeout`` mean the answer did not arrive whole."""

    OK = "ok"  # the upstream's answer arrived whole (whatever happened to the client after)
    CANCELLED = "cancelled"  # cut before its answer arrived: the client left, a cancel, a stop
    TIMEOUT = "timeout"  # cut by --request-timeout
    ERROR = "error"  # the upstream refused it, could not be reached, or broke off


class RecordReason(enum.StrEnum):
    """Who ended a request that did not finish by itself."""

    DISCONNECT = "disconnect"  # the client closed its connection
    CANCEL = "cancel"  # POST /v1/requests/{id}/cancel
    TIMEOUT = "timeout"  # --request-timeout passed
    UPSTREAM = "upstream"  # the upstream answered an error, could not be reached, or broke off
    SHUTDOWN = "shutdown"  # the proxy is stopping

    @property
    def status(self) -> RecordStatus:
        """The status of a request this reason ended before its answer arrived."""
        if self is RecordReason.TIMEOUT:
            return RecordStatus.TIMEOUT
        if self is RecordReason.UPSTREAM:
            return RecordStatus.ERROR
        return RecordStatus.CANCELLED


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
    status: RecordStatus
    reason: RecordReason | None
    usage: Usage
    queued_ms: float
    cancel_to_upstream_close_ms: float | None
    timeline: tuple[Step, ...]

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
        if complete:
            status, reason = RecordStatus.OK, None
        elif reason is None:
            status = RecordStatus.ERROR  # The proxy's own failure: nobody ended it.
        else:
            status = reason.status
        steps: list[Step] = []
        close_ms = None
        cancelled_at = scope.cancelled_at
        if cancelled_at is not None and not complete:
            steps = [(event, round(ms, 3)) for event, ms in scope.timeline]
            for event, ms in steps:
                if event is TimelineEvent.SOCKETS_SHUT:
                    close_ms = ms
            if worker_exited_at is not None:
                exited = round(max(0.0, (worker_exited_at - cancelled_at) * 1000), 3)
                steps.append((WORKER_EXITED, exited))
                steps.sort(key=lambda step: step[1])
        return cls(
            id=id,
            model=model,
            stream=stream,
            status=status,
            reason=reason,
            usage=usage,
            queued_ms=round(queued_ms, 3),
            cancel_to_upstream_close_ms=close_ms,
            timeline=tuple(steps),
        )

    def to_json(self) -> dict[str, Any]:
        """The wire shape (a JSON object)."""
        usage = self.usage
        return {
            "id": self.id,
            "model": self.model,
            "stream": self.stream,
            "status": str(self.status),
            "reason": None if self.reason is None else str(self.reason),
            "usage": {
                "prompt_tokens": None if usage.estimated else usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "requests": usage.requests,
            },
            "queued_ms": self.queued_ms,
            "cancel_to_upstream_close_ms": self.cancel_to_upstream_close_ms,
            "timeline": [{"event": str(event), "ms": ms} for event, ms in self.timeline],
        }


class RecordLog:
    """Appends records to ``path`` (created 0600), one JSON line each; None: keeps none.

    Safe from any thread (a lock keeps two lines from interleaving); called
    on the event loop, where one short append costs microseconds.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()  # one line at a time
        self._fd: int | None = None

    def append(self, record: ProxyRecord) -> None:
        if self.path is None:
            return
        line = json.dumps(record.to_json(), separators=(",", ":")) + "\n"
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(self._fd, line.encode())

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
