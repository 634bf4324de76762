"""The terminal record of a console command: ``CompleteFacts``, and the rule that decides it.

Every command ends with exactly one ``complete`` frame, and what it says is
the product's promise, so it is one type, built here by named constructors
and serialized once per wire (``to_wire`` for the WebSocket and the Ray
receipt, ``from_wire`` for what comes back). Sinks, observers, the metrics and
the renderers take the type; nothing else builds the dict.

The status rule (docs/protocol.md, "Rules"). ``cancelled`` and ``timeout``
promise that the command's effect did not happen. So the status follows how
the work ended, not whether a cancel was asked (trio keeps ``cancel_called``
and ``cancelled_caught`` apart for the same reason): work that returned
completes ``ok`` even when a cancel came meanwhile (a cancel that reached it
inside its commit section waited for the section's end); that cancel's
reason goes in ``late_cancel`` and ``reason`` stays null. Work cut after a
commit section ended did part of its effect: it completes ``cancelled`` (or
``timeout``) with the committed sections named in ``lifecycle.commits``.
Work still inside a commit section when the unwind bound passed may yet
have its effect: it completes ``error``, never ``cancelled``, with
``lifecycle.commit_open``. ``decide`` is the one place that applies the rule,
for every runner.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from wirecut.record._parts import NO_USAGE, Status, TimelineStep, UsageFacts, make_timeline

__all__ = [
    "COMMIT_OPEN_ERROR",
    "CompleteFacts",
    "EndReason",
    "Ending",
    "LifecycleFacts",
    "Reason",
    "decide",
]


#: The ``error`` of a command reported while its commit section still ran.
COMMIT_OPEN_ERROR = (
    "the cancel came during a commit that had not ended by the unwind bound: "
    "its effect may still happen"
)


class Reason(enum.StrEnum):
    """Who ended a command that did not finish by itself (the ``reason`` of its ``complete``)."""

    USER = "user"  # a cancel frame
    TIMEOUT = "timeout"  # its timeout passed
    DISCONNECT = "disconnect"  # its connection closed
    SHUTDOWN = "shutdown"  # the server is stopping (or a cluster host's lease ended)
    LOST = "lost"  # its remote host was lost: nobody can say how it ended

    @property
    def status(self) -> Status:
        """The status of a command that this reason ended before its effect happened."""
        return _STATUS_BY_REASON[self]


_STATUS_BY_REASON = {
    Reason.USER: Status.CANCELLED,
    Reason.TIMEOUT: Status.TIMEOUT,
    Reason.DISCONNECT: Status.CANCELLED,
    Reason.SHUTDOWN: Status.CANCELLED,
    Reason.LOST: Status.ERROR,
}


class Ending(enum.Enum):
    """How a command's work ended, as its runner saw it."""

    RETURNED = "returned"  # the work returned normally
    FAILED = "failed"  # the work raised an error of its own
    CUT = "cut"  # Interrupted ended it, it never ran, or it had not ended by the unwind bound


class EndReason(Protocol):
    """Who ended a piece of work before its effect happened, and what status that gives.

    The console's ``Reason`` and the proxy's ``RecordReason`` are two sets of
    reasons under the one rule of ``decide``.
    """

    @property
    def status(self) -> Status: ...


R = TypeVar("R", bound=EndReason)


def decide(
    ending: Ending, reason: R | None, *, committed: bool = False, commit_open: bool = False
) -> tuple[Status, R | None, R | None]:
    """``(status, reason, late_cancel)`` of work that ended as ``ending``.

    ``reason`` is the runner's cancel (None: none came); ``committed`` is
    True once a commit section of the work ended well, ``commit_open`` while
    one runs. A lost host is an error whatever the work did, since nobody
    saw it end; so is work whose commit had not ended when it was reported.
    Work cut by a reason ends with that reason's ``status``.
    """
    if reason is Reason.LOST:
        return Status.ERROR, reason, None
    if reason is None:
        # Interrupted with no cancel of the runner's: a scope of the work's
        # own cut it, which is the work failing.
        return (Status.OK if ending is Ending.RETURNED else Status.ERROR), None, None
    if commit_open:
        return Status.ERROR, reason, None  # Its effect may still happen.
    if ending is Ending.RETURNED:
        return Status.OK, None, reason
    if committed and ending is Ending.FAILED:
        return Status.ERROR, None, reason
    # Cut: nothing happened, or only the sections named in lifecycle.commits.
    return reason.status, reason, None


@dataclass(frozen=True, slots=True)
class LifecycleFacts:
    """What was true of a command's worker and resources when its ``complete`` was decided.

    The ``lifecycle`` field of the frame; not to be confused with the
    console runner's ``CommandLifecycle``, the state machine of a command.
    ``None`` is "could not be confirmed either way" (a remote worker whose
    node was lost), never a guess. ``timeline`` is None for a command that
    ended by itself (no cancel came); the others are None where they do not
    apply (``open_threads``: only for a leaked worker; ``node``: only for a
    command that ran on a cluster host).
    """

    worker_exited: bool | None
    open_requests: int | None
    open_processes: int | None
    started: bool | None
    timeline: tuple[TimelineStep, ...] | None = None
    open_threads: int | None = None
    node: str | None = None
    node_ip: str | None = None
    force_killed: bool | None = None
    #: The commit sections that ended well (``InterruptScope.commits``).
    commits: tuple[str, ...] = ()
    #: True when a commit section was still running as the facts were decided.
    commit_open: bool = False

    @classmethod
    def unstarted(cls, *, cancelled: bool) -> LifecycleFacts:
        """No worker ever ran it, nothing was opened (``cancelled``: its cancel is the step)."""
        steps = (TimelineStep("cancel_requested", 0.0),) if cancelled else None
        return cls(True, 0, 0, False, timeline=steps)

    @classmethod
    def unknown(cls) -> LifecycleFacts:
        """Nothing could be confirmed (its host is gone, or it was never heard of)."""
        return cls(None, None, None, None)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "worker_exited": self.worker_exited,
            "open_requests": self.open_requests,
            "open_processes": self.open_processes,
            "started": self.started,
        }
        if self.timeline is not None:
            wire["timeline"] = [step.to_wire() for step in self.timeline]
        if self.open_threads is not None:
            wire["open_threads"] = self.open_threads
        if self.force_killed is not None:
            wire["force_killed"] = self.force_killed
        if self.node is not None:
            wire["node"] = self.node
            wire["node_ip"] = self.node_ip
        if self.commits:
            wire["commits"] = list(self.commits)
        if self.commit_open:
            wire["commit_open"] = True
        return wire

    def step_ms(self, event: str) -> float | None:
        """When ``event`` happened in the unwind (ms from the cancel), or None."""
        for step in self.timeline or ():
            if step.event == event:
                return step.ms
        return None


@dataclass(frozen=True, slots=True)
class CompleteFacts:
    """The fields of one ``complete`` frame (all but ``type`` and ``id``).

    Build it with a named constructor (``ended``, ``unstarted``, ``failed``,
    ``from_wire``) and change it by ``replace``: a value, never mutated.
    """

    status: Status
    error: str | None
    elapsed_ms: float
    reason: Reason | None
    usage: UsageFacts
    lifecycle: LifecycleFacts
    late_cancel: Reason | None = None
    #: Extra fields a runner adds to the wire form (a cluster host's receipt: ``host``).
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def ended(
        cls,
        ending: Ending,
        cancel: Reason | None,
        *,
        error: str | None,
        elapsed_ms: float,
        usage: UsageFacts,
        lifecycle: LifecycleFacts,
    ) -> CompleteFacts:
        """A command whose work ended as ``ending``; ``cancel`` is the runner's reason, if any.

        The status comes from ``decide`` (its commits from ``lifecycle``);
        ``error`` is kept only for a command that ends ``error`` (a cut's
        message is not news).
        """
        status, reason, late = decide(
            ending,
            cancel,
            committed=bool(lifecycle.commits),
            commit_open=lifecycle.commit_open,
        )
        if status is Status.ERROR and reason is not None and lifecycle.commit_open:
            error = COMMIT_OPEN_ERROR
        return cls(
            status,
            error if status is Status.ERROR else None,
            elapsed_ms,
            reason,
            usage,
            lifecycle,
            late_cancel=late,
        )

    @classmethod
    def unstarted(cls, reason: Reason, *, elapsed_ms: float) -> CompleteFacts:
        """Cancelled before any worker took it: it never ran and reached nobody."""
        return cls(
            reason.status,
            None,
            elapsed_ms,
            reason,
            NO_USAGE,
            LifecycleFacts.unstarted(cancelled=True),
        )

    @classmethod
    def failed(
        cls,
        message: str,
        *,
        elapsed_ms: float,
        reason: Reason | None = None,
        lifecycle: LifecycleFacts | None = None,
        usage: UsageFacts = NO_USAGE,
    ) -> CompleteFacts:
        """It failed before (or without) running: a usage error, no host, a bug of the runner's."""
        return cls(
            Status.ERROR,
            message,
            elapsed_ms,
            reason,
            usage,
            lifecycle or LifecycleFacts(True, 0, 0, False),
        )

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> CompleteFacts:
        """Read a ``complete`` frame's fields; KeyError or ValueError if they are not one."""
        life = data["lifecycle"]
        usage = data["usage"]
        steps = life.get("timeline")
        if steps is not None:
            steps = make_timeline((step["event"], step["ms"]) for step in steps)
        known = {"type", "id", "status", "error", "elapsed_ms", "reason", "late_cancel"}
        known |= {"usage", "lifecycle"}
        return cls(
            Status(data["status"]),
            data["error"],
            float(data["elapsed_ms"]),
            None if data["reason"] is None else Reason(data["reason"]),
            UsageFacts(
                usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("requests")
            ),
            LifecycleFacts(
                life["worker_exited"],
                life["open_requests"],
                life["open_processes"],
                life["started"],
                timeline=steps,
                open_threads=life.get("open_threads"),
                node=life.get("node"),
                node_ip=life.get("node_ip"),
                force_killed=life.get("force_killed"),
                commits=tuple(life.get("commits", ())),
                commit_open=bool(life.get("commit_open", False)),
            ),
            late_cancel=None if data.get("late_cancel") is None else Reason(data["late_cancel"]),
            extra={k: v for k, v in data.items() if k not in known},
        )

    def to_wire(self) -> dict[str, Any]:
        """The frame's fields as JSON-ready values (the protocol's order)."""
        return {
            "status": str(self.status),
            "error": self.error,
            "elapsed_ms": round(self.elapsed_ms, 3),
            "reason": None if self.reason is None else str(self.reason),
            "late_cancel": None if self.late_cancel is None else str(self.late_cancel),
            "usage": self.usage.to_wire(),
            "lifecycle": self.lifecycle.to_wire(),
            **self.extra,
        }

    def replace(self, **changes: Any) -> CompleteFacts:
        """A copy with ``changes`` (dataclasses.replace)."""
        return replace(self, **changes)
