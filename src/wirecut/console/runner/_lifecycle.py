"""The lifecycle of one console command, as data: every state, event and transition.

h11's ``_state.py`` is the model: the table below is the only place that says
which state follows which, and ``CommandLifecycle.fire`` the only place that
assigns a state. An event that the table does not allow in the current state
is a ``LifecycleError`` naming the command, the state and the event: a bug in
the runner, never something a client can cause.

::

    QUEUED ──start──▶ RUNNING ──finish──▶ DONE
      │  │                │                 ▲
      │  └──cancel──┐     └──cancel──▶ UNWINDING ──finish / unwind_expired──┘
      │             ▼                   ▲  │
      │          UNWINDING ──start──────┘  (a late start under a cancelled scope
      │                                     raises at once, without running)
      ├──drop (Future.cancel() was True: it never ran)──▶ DONE
      └──reject (the line did not parse)──▶ DONE

``DONE`` means the terminal ``complete`` was decided: exactly one per command.
"""

from __future__ import annotations

import enum
import threading

__all__ = ["CommandEvent", "CommandLifecycle", "CommandState", "LifecycleError"]


class CommandState(enum.Enum):
    QUEUED = "queued"  # accepted, waiting for a worker thread
    RUNNING = "running"  # a worker thread runs it
    UNWINDING = "unwinding"  # its scope was cancelled; waiting (bounded) for the worker
    DONE = "done"  # its complete was decided; nothing more is sent for it


class CommandEvent(enum.Enum):
    START = "start"  # a worker thread picked it up
    CANCEL = "cancel"  # cancel, timeout, disconnect or shutdown: the scope was cancelled
    DROP = "drop"  # cancelled while queued, and Future.cancel() said it never ran
    REJECT = "reject"  # the line did not parse: it completes at once as an error, unrun
    FINISH = "finish"  # the worker returned (normally, with an error, or cut)
    UNWIND_EXPIRED = "unwind_expired"  # the unwind bound passed with the worker still running


_S, _E = CommandState, CommandEvent

#: (state, event) -> next state. Nothing else moves a command.
TRANSITIONS: dict[tuple[CommandState, CommandEvent], CommandState] = {
    (_S.QUEUED, _E.START): _S.RUNNING,
    (_S.QUEUED, _E.CANCEL): _S.UNWINDING,
    (_S.QUEUED, _E.DROP): _S.DONE,
    (_S.QUEUED, _E.REJECT): _S.DONE,
    (_S.RUNNING, _E.CANCEL): _S.UNWINDING,
    (_S.RUNNING, _E.FINISH): _S.DONE,
    (_S.UNWINDING, _E.START): _S.UNWINDING,
    (_S.UNWINDING, _E.CANCEL): _S.UNWINDING,  # a second reason: the first one stays
    (_S.UNWINDING, _E.DROP): _S.DONE,
    (_S.UNWINDING, _E.FINISH): _S.DONE,
    (_S.UNWINDING, _E.UNWIND_EXPIRED): _S.DONE,
    # Once decided, late news changes nothing: a worker that starts or returns
    # after its complete, or a cancel that races it.
    (_S.DONE, _E.START): _S.DONE,
    (_S.DONE, _E.CANCEL): _S.DONE,
    (_S.DONE, _E.FINISH): _S.DONE,
}


class LifecycleError(RuntimeError):
    """An event the transition table does not allow in the command's state."""


class CommandLifecycle:
    """The state of one command. ``fire`` is safe from any thread (worker or event loop)."""

    __slots__ = ("_lock", "_state", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        # Guards the state: the worker thread fires START and the event loop the rest.
        self._lock = threading.Lock()
        self._state = CommandState.QUEUED

    @property
    def state(self) -> CommandState:
        return self._state

    def fire(self, event: CommandEvent) -> tuple[CommandState, CommandState]:
        """Apply ``event``; returns (old state, new state) or raises ``LifecycleError``."""
        with self._lock:
            old = self._state
            new = TRANSITIONS.get((old, event))
            if new is None:
                raise LifecycleError(
                    f"command {self.name!r}: event {event.value!r} is not allowed "
                    f"in state {old.value!r}"
                )
            self._state = new
            return old, new
