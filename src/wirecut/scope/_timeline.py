"""The events of a scope's unwind timeline (``InterruptScope.timeline``)."""

from __future__ import annotations

import enum

__all__ = ["TimelineEvent"]


class TimelineEvent(enum.StrEnum):
    """One step of an unwind, named for what the scope itself did or saw.

    A ``StrEnum``, so ``event == "sockets_shut"`` holds and the values can go
    on the wire as they are. An event is marked only when it happened: a cut
    that found nothing to act on marks nothing.
    """

    CANCEL_REQUESTED = "cancel_requested"  # cancel() latched the scope; always the first event
    SOCKETS_SHUT = "sockets_shut"  # at least one connected socket was really shut down
    OBJECTS_INTERRUPTED = "objects_interrupted"  # registered objects had interrupt() called
    PROCESSES_SIGNALLED = "processes_signalled"  # SIGTERM reached at least one process group
    PROCESSES_KILLED = "processes_killed"  # the last signalled group is gone, its leader reaped
    CHILDREN_CANCELLED = "children_cancelled"  # every child scope was cancelled (and cut)
    ESCALATED = "escalated"  # Interrupted was raised asynchronously in owned threads
