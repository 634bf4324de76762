"""The lifecycle of one proxied request, as data: every state, event and transition.

Like the console's runner (``console/runner/_lifecycle.py``, after h11's
``_state.py``): the table below is the only place that says which state
follows which, and ``ExchangeLifecycle.fire`` the only place that assigns a
state. An event the table does not allow is a ``LifecycleError`` naming the
request, the state and the event: a bug in the proxy, never something a
client or an upstream can cause.

::

    QUEUED ──admit──▶ UPSTREAM ──finish──▶ DONE
      │                  │                   ▲
      └──cancel──▶ UNWINDING ◀──cancel───────┘ (from UPSTREAM)
                     │  ▲
                     │  └─cancel (a later reason: the first one stays)
                     └──finish──▶ DONE

``admit``: an upstream slot was granted and the relay starts. ``cancel``:
the client left, a cancel by id, the timeout or the shutdown cut it (the
reason is kept only on the transition into UNWINDING: the first reason
wins). ``finish``: the relay returned, or the queue wait ended without a
slot. ``DONE`` means the record was decided: exactly one per request; late
news changes nothing.

Event loop only.
"""

from __future__ import annotations

import enum

__all__ = ["TRANSITIONS", "ExchangeEvent", "ExchangeLifecycle", "ExchangeState", "LifecycleError"]


class ExchangeState(enum.Enum):
    """Where a proxied request is; see the module docstring."""

    QUEUED = "queued"  # waiting in the proxy's FIFO for an upstream slot
    UPSTREAM = "upstream"  # admitted: its relay runs at the upstream
    UNWINDING = "unwinding"  # cut; waiting for the queue wait or the relay to end
    DONE = "done"  # its record is decided; nothing more happens to it


class ExchangeEvent(enum.Enum):
    ADMIT = "admit"  # an upstream slot was granted; the relay starts
    CANCEL = "cancel"  # disconnect, cancel by id, timeout or shutdown: cut it
    FINISH = "finish"  # the relay returned, or the queue wait ended without a slot


_S, _E = ExchangeState, ExchangeEvent

#: (state, event) -> next state. Nothing else moves a request.
TRANSITIONS: dict[tuple[ExchangeState, ExchangeEvent], ExchangeState] = {
    (_S.QUEUED, _E.ADMIT): _S.UPSTREAM,
    (_S.QUEUED, _E.CANCEL): _S.UNWINDING,
    (_S.UPSTREAM, _E.CANCEL): _S.UNWINDING,
    (_S.UPSTREAM, _E.FINISH): _S.DONE,
    (_S.UNWINDING, _E.CANCEL): _S.UNWINDING,  # a second reason: the first one stays
    (_S.UNWINDING, _E.FINISH): _S.DONE,
    # Once decided, late news changes nothing: a cancel that races the end,
    # or the end seen a second time (a server tearing the request down).
    (_S.DONE, _E.CANCEL): _S.DONE,
    (_S.DONE, _E.FINISH): _S.DONE,
}


class LifecycleError(RuntimeError):
    """An event the transition table does not allow in the request's state."""


class ExchangeLifecycle:
    """The state of one proxied request. Event loop only."""

    __slots__ = ("_state", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._state = ExchangeState.QUEUED

    @property
    def state(self) -> ExchangeState:
        return self._state

    def fire(self, event: ExchangeEvent) -> tuple[ExchangeState, ExchangeState]:
        """Apply ``event``; returns (old state, new state) or raises ``LifecycleError``."""
        old = self._state
        new = TRANSITIONS.get((old, event))
        if new is None:
            raise LifecycleError(
                f"proxied request {self.name!r}: event {event.value!r} is not allowed "
                f"in state {old.value!r}"
            )
        self._state = new
        return old, new
