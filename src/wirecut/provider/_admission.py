"""Admission: no more requests in flight to a provider than it has slots; the rest wait in line.

llama.cpp starts queued requests whose client already left (docs/architecture.md,
fact 11): only a queue in front of it, that admits no more than its slots,
keeps dead work off the engine. A request waits its turn here, and one whose
work is cancelled while it waits leaves the line and never reaches the provider.

``AdmissionLine`` is the line's bookkeeping and does no waiting of its own:
who is in flight, who waits in which order, who gets a freed place. A host
wraps it in its own way of waiting (an ``AdmissionHost``): ``SlotGate``
here, for worker threads (the wait is the bound scope's, so a cancel ends
it), and an event loop's futures for a server on asyncio.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import wirecut.scope as ws
from wirecut.provider._slots import SlotCount

__all__ = ["AdmissionHost", "AdmissionLine", "SlotGate"]

W = TypeVar("W")

#: Seconds between two attempts to learn the slots of a provider that did not say yet.
RELEARN_INTERVAL = 5.0


def _check_slots(slots: int | None) -> int | None:
    if slots is not None and (not isinstance(slots, int) or isinstance(slots, bool) or slots < 1):
        raise ValueError(f"slots must be a whole number >= 1 or None, not {slots!r}")
    return slots


class AdmissionLine(Generic[W]):
    """A FIFO line in front of ``slots`` places (None: unlimited), with no waiting of its own.

    A waiter is any object the host can wake (an event, a future). A freed
    place goes straight to the oldest waiter, so a newcomer never overtakes
    the line; a waiter that gives up leaves it, and a place handed to it
    meanwhile goes on to the next one. Not thread-safe: the host calls it
    under its own lock, or from one event loop.
    """

    def __init__(self, slots: int | None) -> None:
        self._slots = _check_slots(slots)
        self.in_flight = 0
        self._waiting: deque[W] = deque()

    @property
    def slots(self) -> int | None:
        return self._slots

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def _free(self) -> bool:
        return self._slots is None or self.in_flight < self._slots

    def try_enter(self, waiter: W) -> bool:
        """True: a place was free and nobody waited, ``waiter`` is in flight now.

        False: ``waiter`` joined the end of the line; a later ``leave()`` or
        ``resize()`` returns it when it gets a place, or the host ``withdraw``s it.
        """
        if not self._waiting and self._free():
            self.in_flight += 1
            return True
        self._waiting.append(waiter)
        return False

    def withdraw(self, waiter: W) -> bool:
        """``waiter`` gives up: True if it still waited (it left the line).

        False if it was handed a place meanwhile (``leave()`` or ``resize()``
        returned it): it is in flight, and the host must ``leave()`` to pass
        the place on.
        """
        try:
            self._waiting.remove(waiter)
        except ValueError:
            return False
        return True

    def leave(self) -> list[W]:
        """A request in flight ended: the waiters that get a place now (the host wakes them)."""
        if self.in_flight <= 0:
            raise RuntimeError("AdmissionLine.leave() without a request in flight")
        self.in_flight -= 1
        return self._admit()

    def resize(self, slots: int | None) -> list[W]:
        """Now ``slots`` places: the waiters that get one (more places may free some)."""
        self._slots = _check_slots(slots)
        return self._admit()

    def _admit(self) -> list[W]:
        admitted: list[W] = []
        while self._waiting and self._free():
            admitted.append(self._waiting.popleft())
            self.in_flight += 1
        return admitted


class AdmissionHost(Generic[W]):
    """The base of a host of an ``AdmissionLine`` (its way of waiting): the line and its counts.

    The counts are single reads, for people and metrics: safe from any
    thread, and as fresh as the read.
    """

    def __init__(self, slots: int | None) -> None:
        self._line: AdmissionLine[W] = AdmissionLine(slots)

    @property
    def slots(self) -> int | None:
        return self._line.slots

    @property
    def in_flight(self) -> int:
        return self._line.in_flight

    @property
    def queued(self) -> int:
        return self._line.queued


class SlotGate(AdmissionHost[threading.Event]):
    """At most ``slots`` requests at once through the gate (None: unlimited), the rest in line.

    Safe to share between threads and to call from any of them. Wrap each
    request to the provider in ``with gate.admitted():``. ``learn``, if
    given, tells the provider's slots (``provider_slots``): ``learn_slots()``
    asks it, and while it has not said (it was unreachable, or loading its
    model), a request asks again at most every ``relearn_interval`` seconds
    before it takes its turn; meanwhile the gate is unlimited.

    Cancellation: ``admitted()`` waits with the bound scope
    (``wirecut.scope.wait``): a cancel ends the wait at once with
    ``Interrupted``, the waiter leaves the line, and a place handed to it
    meanwhile goes on to the next waiter. A cancelled request never leaves
    the line onto the provider. With no scope bound the wait is plain.
    """

    def __init__(
        self,
        slots: int | None = None,
        *,
        source: str | None = None,
        learn: Callable[[], SlotCount] | None = None,
        relearn_interval: float = RELEARN_INTERVAL,
    ) -> None:
        # One lock for the line: taken for a few operations at a time, never
        # while waiting or while talking to the provider.
        self._lock = threading.Lock()
        super().__init__(slots)
        self._learn = learn
        self._relearn_interval = relearn_interval
        self._settled = learn is None
        self._learnt_at: float | None = None
        self._learning = False
        #: Where the slot count came from, for people ("/slots", "the embedded server").
        self.source = source

    @property
    def settled(self) -> bool:
        """True when the slot count is final: given, or the provider said (or has no slots)."""
        return self._settled

    def health(self) -> dict[str, int | str | None]:
        """``{"slots": N | None, "source": "/slots" | None, "in_flight": n, "queued": n}``."""
        with self._lock:
            return {
                "slots": self._line.slots,
                "source": self.source,
                "in_flight": self._line.in_flight,
                "queued": self._line.queued,
            }

    def describe(self) -> str:
        """For people: "at most 2 in flight, the others wait in line (slots from /slots)"."""
        slots = self._line.slots
        if slots is not None:
            return f"at most {slots} in flight, the others wait in line (slots from {self.source})"
        if not self._settled:
            return "no limit until the provider says how many slots it has"
        return "no limit (the provider does not say how many slots it has)"

    def set_slots(self, slots: int | None, source: str | None = None) -> None:
        """Now ``slots`` places; waiters that get one are woken. Any thread."""
        with self._lock:
            admitted = self._line.resize(slots)
            self.source = source
        for waiter in admitted:
            waiter.set()

    def learn_slots(self) -> SlotCount | None:
        """Ask the provider for its slots (``learn``) and apply the answer; blocks on the network.

        None when the gate has no ``learn`` or another thread is asking now.
        An answer that is not final (``settled`` False) leaves the gate
        unlimited and is asked again later.
        """
        if self._learn is None:
            return None
        with self._lock:
            if self._learning:
                return None
            self._learning = True
        try:
            count = self._learn()
        finally:
            with self._lock:
                self._learning = False
                self._learnt_at = time.monotonic()
        if count.settled:
            self._settled = True
            self.set_slots(count.slots, count.source)
        return count

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """Wait for a place (in line), hold it for the block, then give it to the next waiter.

        Raises ``Interrupted`` without entering the block if the bound scope is
        cancelled before or while it waits.
        """
        self._enter()
        try:
            yield
        finally:
            self._leave()

    def _enter(self) -> None:
        ws.check()  # A cancelled request does not even join the line.
        if not self._settled and self._relearn_due():
            self.learn_slots()
        waiter = threading.Event()
        with self._lock:
            if self._line.try_enter(waiter):
                return
        try:
            ws.wait(waiter)
            # Handed a place just as the cancel came: the cancel wins.
            ws.check()
        except BaseException:
            with self._lock:
                withdrawn = self._line.withdraw(waiter)
            if not withdrawn:
                self._leave()  # It was handed a place it will not use: pass it on.
            raise

    def _relearn_due(self) -> bool:
        learnt_at = self._learnt_at
        return learnt_at is None or time.monotonic() - learnt_at >= self._relearn_interval

    def _leave(self) -> None:
        with self._lock:
            admitted = self._line.leave()
        for waiter in admitted:
            waiter.set()
