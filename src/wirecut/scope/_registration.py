"""``Registration``: one thing registered with a scope, and the kinds there are."""

from __future__ import annotations

import enum
import threading
from typing import Any, Protocol

from wirecut.scope._cuttables import Cuttable
from wirecut.scope._timeline import TimelineEvent

__all__ = ["CUT_EVENTS", "Kind", "Owner", "Registration", "cut_order", "kind_of"]


class Kind(enum.Enum):
    """What a registration is, for the ledger; cut in this order.

    Sockets first, since a blocked read is what keeps a provider slot busy;
    threads are never cut, only escalated.
    """

    SOCKET = "sockets"  # a connected socket: shut down
    OBJECT = "objects"  # an Interruptible (an agent turn, a wakeable wait): interrupt()
    PROCESS = "processes"  # a child process: its group killed
    THREAD = "threads"  # a thread running the scope's work: escalation only


# The event a cut of each kind marks when it acted. Processes mark their own
# two steps (signalled, then killed on the kill thread); threads are not cut.
CUT_EVENTS = {
    Kind.SOCKET: TimelineEvent.SOCKETS_SHUT,
    Kind.OBJECT: TimelineEvent.OBJECTS_INTERRUPTED,
}
ORDER = {kind: i for i, kind in enumerate(Kind)}


class Owner(Protocol):
    """What a registration, and the thread running a registered task, need of their scope.

    ``InterruptScope`` implements it. The scope's other modules (``_threads``,
    this one) reach the scope through these three methods only, never through
    its lock or its fields: the scope alone decides what its lock guards.
    """

    def release(self, reg: Registration) -> None:
        """End ``reg`` (idempotent); returns once no cut of it runs on another thread."""

    def task_entered(self, reg: Registration) -> None:
        """The thread of ``reg`` starts running the task's own code: escalation may reach it."""

    def task_left(self, reg: Registration) -> bool:
        """The thread of ``reg`` left the task's code; True if an escalation may be pending."""


class Registration:
    """A handle on one registered thing; leaving it (or ``unregister()``) ends it.

    ``unregister()`` is idempotent and safe from any thread. Once it returns, the
    scope will not cut the thing: if a cut was running on another thread at that
    moment, ``unregister()`` waits for it to finish, so an owner may close its
    socket right after.

    ``target`` is what was registered (the socket, the object, the thread, or
    the ``ProcessTarget`` of a process); ``cuttable`` is how the scope cuts it
    (None for a thread); ``owner`` is the ident of the thread that registered
    it, whose commit section keeps a cancel from cutting it.
    """

    __slots__ = (
        "_cutting",
        "_scope",
        "active",
        "cuttable",
        "in_user_code",
        "kind",
        "owner",
        "target",
    )

    def __init__(self, scope: Owner, kind: Kind, target: Any, cuttable: Cuttable | None) -> None:
        self._scope = scope
        self.kind = kind
        self.target = target
        self.cuttable = cuttable
        self.owner = threading.get_ident()
        self.active = True
        # Ident of the thread cutting this registration right now, or 0.
        self._cutting = 0
        # Threads only: escalation may raise in it (it runs the task's code).
        self.in_user_code = False

    def unregister(self) -> None:
        self._scope.release(self)

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._scope.release(self)

    def __repr__(self) -> str:
        state = "active" if self.active else "ended"
        return f"<Registration {self.kind.name.lower()} {state} {self.target!r}>"


def kind_of(reg: Registration) -> Kind:
    return reg.kind


def cut_order(reg: Registration) -> int:
    return ORDER[reg.kind]
