"""``InterruptScope``: a latched cancel that cuts everything registered with it.

A host creates one scope per command, binds it around the worker, and every
agent turn, socket, subprocess and thread of that command registers with it.
``cancel()`` cuts all of them, including the ones that try to register after
the cancel: those are cut on entry and their caller gets ``Interrupted``.

Scopes form a tree (a child is cancelled with its parent). Every walk of the
tree (cancel, escalation, the ledger) is a loop, not a recursion: a chain of
nested scopes may be thousands deep.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import itertools
import logging
import math
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, ParamSpec, TypeVar

from wirecut.scope._binding import enter_scope, exit_scope
from wirecut.scope._cuttables import Cuttable, Interruptible, ObjectCut, SocketCut
from wirecut.scope._errors import Interrupted
from wirecut.scope._process import ProcessTarget, ScopedPopen, check_grace
from wirecut.scope._registration import CUT_EVENTS, Kind, Registration, cut_order, kind_of
from wirecut.scope._shield import defer_if_shielded, is_shielded, shielded
from wirecut.scope._threads import ScopeExecutor, raise_in_thread, run_registered, start_thread
from wirecut.scope._timeline import TimelineEvent
from wirecut.scope._timers import SYSTEM_CLOCK, Clock, TimerHandle, is_never

__all__ = ["InterruptScope", "ScopeState"]

_log = logging.getLogger("wirecut.scope")

P = ParamSpec("P")
T = TypeVar("T")


class ScopeState(enum.Enum):
    """The lifecycle of a scope. The only transition is OPEN -> CANCELLED."""

    OPEN = "open"  # work may register; nothing has been cut
    CANCELLED = "cancelled"  # latched: all registered work was cut, and new work is cut on entry


# What a cancel found to cut in one scope: its registrations in cut order,
# and its children.
_Found = tuple[list[Registration], list["InterruptScope"]]


class InterruptScope:
    """A latched cancel for one unit of work and everything it started.

    Safe to use from any thread. ``cancel()`` may be called from any thread
    (not from a signal handler: it takes a lock) and never blocks on the work
    it cuts; the cuts run outside the lock, and whatever one cut raises, every
    other one still runs.

    A child scope (``parent=`` or ``scope.child()``) is cancelled with its
    parent, with the parent's reason, and can be cancelled alone. ``timeout``
    (seconds) makes the scope cancel itself with reason "timeout"; an
    infinite timeout, or one beyond ``threading.TIMEOUT_MAX``, is none.
    ``clock`` (default: the system's monotonic clock; a child shares its
    parent's) runs the timeout and the escalation grace: a ``MockClock`` makes
    them deterministic in tests.

    Used as a context manager, the scope is bound for the block, in the
    thread or task that entered it; several threads may be inside ``with
    scope:`` at once, and the timeout is dropped when the last of them
    leaves. The ``Interrupted`` of a cancelled scope is not swallowed on the
    way out.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        timeout: float | None = None,
        parent: InterruptScope | None = None,
        clock: Clock | None = None,
    ) -> None:
        if timeout is not None and (math.isnan(timeout) or timeout < 0):
            raise ValueError(f"timeout must be a non-negative number of seconds, not {timeout!r}")
        self.name = name
        self.parent = parent
        if clock is None:
            clock = SYSTEM_CLOCK if parent is None else parent._clock
        self._clock: Clock = clock
        # Guards the state, the registrations, the counts, the children, the
        # timeline and the count of open `with` blocks. The condition wakes
        # wait_quiescent() and an unregister() waiting for a cut in flight.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._quiescence_waiters = 0
        self._state = ScopeState.OPEN
        self._reason: str | None = None
        self._cancelled_at: float | None = None
        # Set once cancelled: sleep() and wait() wake on it.
        self._cancelled_event = threading.Event()
        self._registrations: set[Registration] = set()
        self._counts = dict.fromkeys(Kind, 0)
        # Processes are counted by target, not registration: a cut one stays
        # owned until its group was killed and the leader reaped.
        self._processes: set[ProcessTarget] = set()
        self._children: weakref.WeakSet[InterruptScope] = weakref.WeakSet()
        self._timeline: list[tuple[TimelineEvent, float]] = []
        self._timeout_timer: TimerHandle | None = None
        self._escalation_timer: TimerHandle | None = None
        self._entries = 0  # `with scope:` blocks open now, in any thread
        # Set (under the lock) before the first async Interrupted is raised.
        self._escalated = False
        # The commit sections of this scope and its descendants: the names of
        # those that ended well, in order, and how many are open now.
        self._commits: list[str] = []
        self._open_commits = 0
        if parent is not None:
            parent._adopt(self)
        if timeout is not None and not self.cancelled:
            # An endless timeout is "never" for the clock: nothing is queued.
            ref = weakref.ref(self)
            self._timeout_timer = self._clock.call_later(timeout, lambda: _cancel_ref(ref))

    # -- state ---------------------------------------------------------------

    @property
    def state(self) -> ScopeState:
        return self._state

    @property
    def cancelled(self) -> bool:
        """True once ``cancel()`` was called (requested; the cuts may still be running)."""
        return self._state is ScopeState.CANCELLED

    @property
    def reason(self) -> str | None:
        """The first reason given to ``cancel()``, or None while open."""
        return self._reason

    @property
    def cancelled_at(self) -> float | None:
        """``time.monotonic()`` at the cancel, or None while open."""
        return self._cancelled_at

    @property
    def cancelled_here(self) -> bool:
        """True if the scope is cancelled and the cancel reaches the calling thread now.

        Inside a commit section (``committing()``) the cancel waits for the
        section's end: ``cancelled`` is True there (requested), this is False
        (not delivered).
        """
        return self._state is ScopeState.CANCELLED and not is_shielded(threading.get_ident())

    @property
    def committed(self) -> bool:
        """True once a ``committing()`` block of this scope or a descendant ended well.

        Part of the work's effect is durable: a cancel that came after that
        point came too late to undo it (``cancelled`` may be True as well:
        requested, not delivered). ``commits`` names each such block.
        """
        return bool(self._commits)

    @property
    def commits(self) -> tuple[str, ...]:
        """The names of the ``committing()`` blocks here or in a descendant that ended well."""
        with self._lock:
            return tuple(self._commits)

    @property
    def commit_open(self) -> bool:
        """True while a ``committing()`` block of this scope or a descendant runs.

        A host that must report before it ends cannot say that the effect
        did not happen: it may still.
        """
        return self._open_commits > 0

    @property
    def timeline(self) -> list[tuple[TimelineEvent, float]]:
        """The steps of the unwind so far: ``(event, ms since the cancel)``.

        The unwind of this scope's whole subtree: a step taken in a child
        scope after this one was cancelled counts here too. Each event
        appears once, when it first happened, and only if it happened (see
        ``TimelineEvent``). Times are wall-clock milliseconds
        whatever the scope's ``clock``.
        """
        with self._lock:
            if self._cancelled_at is None:
                return []
            return [(event, (t - self._cancelled_at) * 1000) for event, t in self._timeline]

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        extra = f" reason={self._reason!r}" if self._reason else ""
        return f"<InterruptScope{label} {self._state.value}{extra}>"

    # -- cancelling ----------------------------------------------------------

    def cancel(self, reason: str = "cancelled", *, escalate_after: float | None = None) -> bool:
        """Cancel the scope: cut everything registered, and everything that registers later.

        If the scope was already cancelled this does nothing (the first reason
        wins) and returns False; it returns True for the call that cancelled.
        An ``escalate_after`` is honoured on any call, though.

        Every registered thing and every child scope is cut, whatever one cut
        raises: an ``Exception`` from a cut is logged; a ``BaseException``
        (``KeyboardInterrupt``, or the ``Interrupted`` of an ``interrupt()``
        that registers on this very scope) is raised from ``cancel()`` once
        all the cuts ran.

        Escalation is a last resort for pure-Python code that never reaches a
        cooperative point: after ``escalate_after`` seconds (on the scope's
        clock; infinite means never), every thread this scope and its
        children own that is still running its task gets ``Interrupted``
        raised asynchronously (``PyThreadState_SetAsyncExc``). It is only
        delivered when the thread runs Python bytecode (not while it is
        blocked in a system call or C code), it can land in any ``finally``
        block or between any two statements and break invariants there, and
        code may catch and drop it. So it is never the plan: registration and
        ``check()`` are. The ledger (``live()``) tells whether it worked.
        """
        if escalate_after is not None and (math.isnan(escalate_after) or escalate_after < 0):
            raise ValueError(f"escalate_after must be >= 0 seconds, not {escalate_after!r}")
        with self._lock:
            found = self._latch_locked(reason)
        try:
            if found is not None:
                self._cancel_tree(found, reason)
        finally:
            # After the cuts, so that nothing can keep them from running.
            if escalate_after is not None:
                self._schedule_escalation(escalate_after)
        return found is not None

    def _schedule_escalation(self, delay: float) -> None:
        # An endless delay schedules nothing, and leaves the door open to a
        # finite one in a later call.
        if is_never(delay):
            return
        with self._lock:
            if self._escalation_timer is None:
                ref = weakref.ref(self)
                self._escalation_timer = self._clock.call_later(delay, lambda: _escalate_ref(ref))

    def _latch_locked(self, reason: str) -> _Found | None:
        """OPEN -> CANCELLED under the lock; what to cut, or None if already cancelled."""
        if self._state is not ScopeState.OPEN:
            return None
        self._state = ScopeState.CANCELLED
        self._reason = reason
        self._cancelled_at = time.monotonic()
        self._timeline.append((TimelineEvent.CANCEL_REQUESTED, self._cancelled_at))
        # The cancelled state is set; from here on, nothing registers unseen.
        self._cancelled_event.set()
        return sorted(self._registrations, key=cut_order), list(self._children)

    def _cancel_tree(self, found: _Found, reason: str) -> None:
        """Cut this just-latched scope and its whole subtree, then raise what a cut raised."""
        errors: list[BaseException] = []
        pending: list[tuple[InterruptScope, _Found]] = [(self, found)]
        parents: list[InterruptScope] = []
        while pending:
            scope, (registrations, children) = pending.pop()
            if scope._timeout_timer is not None:
                scope._timeout_timer.cancel()
            scope._cut_all(registrations, reason, errors)
            if children:
                parents.append(scope)
            for child in children:
                with child._lock:
                    child_found = child._latch_locked(reason)
                if child_found is not None:
                    pending.append((child, child_found))
        # Deepest first: a parent's children are cancelled once theirs are.
        # Each parent in the tree records it itself, and only this scope
        # passes it on to the ancestors above the tree: a walk up from every
        # parent would cost depth squared (seconds for a chain of thousands).
        for scope in reversed(parents):
            if scope is self:
                scope._mark(TimelineEvent.CHILDREN_CANCELLED)
            else:
                scope._mark_here(TimelineEvent.CHILDREN_CANCELLED, time.monotonic())
        if errors:
            for extra in errors[1:]:
                _log.error("a cut also raised %r", extra)
            raise errors[0]

    def _cut_all(
        self, registrations: list[Registration], reason: str, errors: list[BaseException]
    ) -> None:
        for kind, group in itertools.groupby(registrations, key=kind_of):
            if kind is Kind.THREAD:
                continue  # Threads stop cooperatively, or by escalation.
            acted = False
            for reg in group:
                acted = self._cut_one(reg, reason, errors) or acted
            event = CUT_EVENTS.get(kind)
            if acted and event is not None:
                self._mark(event)

    def _cut_one(self, reg: Registration, reason: str, errors: list[BaseException]) -> bool:
        """Cut ``reg`` unless it ended or its owner is in a commit section; True if it acted.

        A registration whose owner is inside a commit section is cut when
        the section ends (``_shield``), on the owner's thread.
        """
        with self._lock:
            if not reg.active:
                return False  # Unregistered since the cancel: not ours to cut.
            if defer_if_shielded(reg.owner, functools.partial(self._cut_late, reg, reason)):
                return False
            reg._cutting = threading.get_ident()
        try:
            assert reg.cuttable is not None
            return reg.cuttable.cut(reason)
        except Exception:
            _log.exception("cutting %r failed", reg)
        except BaseException as exc:
            errors.append(exc)  # Raised once every cut ran.
        finally:
            with self._lock:
                reg._cutting = 0
                self._cond.notify_all()
        return False

    def _cut_late(self, reg: Registration, reason: str) -> None:
        """The cut of ``reg`` that waited for its owner's commit section to end."""
        errors: list[BaseException] = []
        acted = self._cut_one(reg, reason, errors)
        event = CUT_EVENTS.get(reg.kind)
        if acted and event is not None:
            self._mark(event)
        if errors:
            raise errors[0]

    def _cut_on_entry(self, reg: Registration, reason: str) -> None:
        if reg.cuttable is None:
            return
        try:
            acted = reg.cuttable.cut(reason)
        except Exception:
            _log.exception("cutting %r on entry failed", reg)
            return
        event = CUT_EVENTS.get(reg.kind)
        if acted and event is not None:
            self._mark(event)

    def _mark(self, event: TimelineEvent) -> None:
        """Record ``event`` the first time it happens, here and in each cancelled ancestor.

        A cancel's unwind is that of its whole subtree: the socket of an agent
        turn (a child scope) is shut as part of its host's unwind, and the
        host's timeline says so. An ancestor that is not cancelled (a child
        cut alone) has no unwind to add to.
        """
        now = time.monotonic()
        scope: InterruptScope | None = self
        while scope is not None:
            if scope is self or scope._cancelled_at is not None:
                scope._mark_here(event, now)
            scope = scope.parent

    def _mark_here(self, event: TimelineEvent, now: float) -> None:
        """Record ``event`` at ``now`` in this scope's timeline, unless it is there already."""
        with self._lock:
            if all(seen is not event for seen, _ in self._timeline):
                self._timeline.append((event, now))

    def _process_signalled(self) -> None:
        self._mark(TimelineEvent.PROCESSES_SIGNALLED)

    def _process_killed(self, target: ProcessTarget) -> None:
        with self._lock:
            self._processes.discard(target)
            last = not any(p.killing for p in self._processes)
        if last and target.signalled:
            self._mark(TimelineEvent.PROCESSES_KILLED)
        self._changed()

    def _escalate(self) -> None:
        for scope in self._walk():
            with scope._lock:
                scope._escalated = True
                threads = [
                    reg.target
                    for reg in scope._registrations
                    if reg.kind is Kind.THREAD
                    and reg.in_user_code
                    and not is_shielded(reg.target.ident)
                ]
                # Under the lock: a thread leaving its task takes it first,
                # so it cannot get Interrupted once it has left.
                for thread in threads:
                    raise_in_thread(thread.ident, Interrupted)
            if threads:
                scope._mark(TimelineEvent.ESCALATED)

    def _walk(self) -> Iterator[InterruptScope]:
        """This scope and all its descendants, without recursion."""
        stack: list[InterruptScope] = [self]
        while stack:
            scope = stack.pop()
            yield scope
            with scope._lock:
                stack.extend(scope._children)

    def child(self, name: str | None = None, *, timeout: float | None = None) -> InterruptScope:
        """A new scope cancelled with this one, that can also be cancelled alone."""
        return InterruptScope(name, timeout=timeout, parent=self)

    def _adopt(self, child: InterruptScope) -> None:
        with self._lock:
            if self._state is ScopeState.OPEN:
                self._children.add(child)
                return
            reason = self._reason
        # Born under a cancelled parent: born cancelled.
        child.cancel(reason or "cancelled")

    def close(self) -> None:
        """Drop the timeout timer. Safe to call more than once, from any thread."""
        if self._timeout_timer is not None:
            self._timeout_timer.cancel()

    def __enter__(self) -> InterruptScope:
        enter_scope(self)
        with self._lock:
            self._entries += 1
        return self

    def __exit__(self, *exc_info: object) -> None:
        exit_scope(self)
        with self._lock:
            self._entries -= 1
            last = self._entries == 0
        if last:
            self.close()

    # -- the cooperative points ------------------------------------------------

    def check(self) -> None:
        """Raise ``Interrupted`` if the scope is cancelled (not inside a commit section)."""
        if self._state is ScopeState.CANCELLED and not is_shielded(threading.get_ident()):
            raise Interrupted(self._reason or "cancelled")

    @contextlib.contextmanager
    def committing(self, what: str = "commit") -> Iterator[None]:
        """The point of no return: the block makes (part of) the work's effect durable.

        Safe from any thread that runs this scope's work. Raises
        ``Interrupted`` without running the block if the scope is cancelled.
        Otherwise the block runs to its end whatever happens to the scope
        meanwhile, and ``what`` names it in ``commits`` if it ends without an
        exception. Blocks may nest.

        Cancellation: while the calling thread is inside, a cancel of any
        scope is recorded (``cancelled``, ``reason``, the timeline) and cuts
        everything other threads registered, but nothing this thread
        registered (before the block or in it: the socket its COMMIT goes
        over is not shut under it); ``check()``, ``sleep()`` and ``wait()``
        do not raise in it, and escalation passes it by. When the outermost
        block ends, the kept cuts run and the next cooperative point raises
        ``Interrupted``. Keep the block short: nothing bounds it. A host that
        must report meanwhile sees ``commit_open`` and cannot say that the
        effect did not happen.

        A host reports work whose commit ended and that then returned as
        done, with the cancel as a late one: "cancelled" promises that the
        effect did not happen (trio keeps ``cancel_called`` and
        ``cancelled_caught`` apart for the same reason).
        """
        with shielded():
            # Shielded first: a cancel from here on finds the shield and keeps
            # its cuts; one that came before is seen here.
            if self._state is ScopeState.CANCELLED:
                raise Interrupted(self._reason or "cancelled")
            self._count_commit(+1, None)
            ended_well = False
            try:
                yield
                ended_well = True
            finally:
                self._count_commit(-1, what if ended_well else None)

    def _count_commit(self, change: int, done: str | None) -> None:
        """A commit section opened (+1) or closed (-1, ``done`` its name if it ended well)."""
        scope: InterruptScope | None = self
        while scope is not None:
            with scope._lock:
                scope._open_commits += change
                if done is not None:
                    scope._commits.append(done)
            scope = scope.parent

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` (inf: until cancelled); a cancel raises ``Interrupted`` at once.

        Inside a commit section (``committing()``) a cancel does not end it.
        """
        timeout = _wait_timeout(max(0.0, seconds))
        if is_shielded(threading.get_ident()):
            threading.Event().wait(timeout)
            return
        if self._cancelled_event.wait(timeout):
            self.check()  # The cancel waits if the thread entered a section meanwhile.

    def wait(self, event: threading.Event, timeout: float | None = None) -> bool:
        """``event.wait(timeout)``, except that a cancel ends it at once with ``Interrupted``.

        Returns what ``event.wait`` would: True once the event is set, False on
        timeout. Needs CPython's ``threading.Event`` (a flag and a Condition
        in ``_cond``): raises ``RuntimeError`` for an event without one.
        """
        self.check()
        if event.is_set():
            return True
        # Wait on the event's own condition and let the cancel notify it: one
        # wakeup, no polling.
        cond = _event_condition(event)
        waker = _EventWaker(cond)
        with self.register(waker):
            with cond:
                set_ = cond.wait_for(
                    lambda: event.is_set() or self.cancelled_here,
                    None if timeout is None else _wait_timeout(timeout),
                )
        if event.is_set():
            return True
        self.check()
        return bool(set_)

    # -- registering -------------------------------------------------------------

    def register(self, obj: Interruptible) -> Registration:
        """Register an object whose ``interrupt(reason)`` a cut calls (an agent turn).

        On a cancelled scope, interrupts ``obj`` at once and raises
        ``Interrupted``: a turn that starts after the cancel cannot escape it.
        """
        return self._register(Kind.OBJECT, obj, ObjectCut(obj))

    def register_socket(self, sock: socket.socket) -> Registration:
        """Register a connected socket; a cut is ``shutdown(SHUT_RDWR)``, never ``close()``.

        The owning thread keeps the socket and closes it after leaving the
        registration. On a cancelled scope, shuts it down at once and raises
        ``Interrupted``.
        """
        return self._register(Kind.SOCKET, sock, SocketCut(sock))

    def register_process(
        self, popen: subprocess.Popen[Any], *, grace: float | None = None
    ) -> Registration:
        """Register a child process; a cut kills its process group.

        The cut sends SIGTERM to the group, SIGKILL after ``grace`` seconds
        (default 1), and reaps the leader. On a cancelled scope the kill
        starts at once and ``Interrupted`` is raised.
        """
        target = ProcessTarget(
            popen,
            check_grace(grace),
            on_signalled=self._process_signalled,
            on_killed=self._process_killed,
        )
        return self._register(Kind.PROCESS, target, target)

    def popen(self, argv: list[str], *, grace: float | None = None, **kwargs: Any) -> ScopedPopen:
        """Start ``argv`` in its own session and register it with this scope.

        Returns a ``subprocess.Popen`` whose registration ends when it has
        been waited for or its ``with`` block ends; at that moment the rest of
        its process group is killed, so nothing it started outlives it.
        Raises ``Interrupted`` (without starting anything) on a cancelled scope.
        """
        return ScopedPopen(self, argv, grace=grace, **kwargs)

    def _register(self, kind: Kind, target: Any, cuttable: Cuttable | None) -> Registration:
        reg = Registration(self, kind, target, cuttable)
        with self._lock:
            if kind is Kind.PROCESS:
                # Owned from here until its kill is over, also when it is cut
                # on entry below.
                self._processes.add(target)
            reason = self._reason or "cancelled"
            if self._state is ScopeState.OPEN or (
                # In a commit section: registered, and cut when the section ends.
                cuttable is not None
                and defer_if_shielded(reg.owner, functools.partial(self._cut_late, reg, reason))
            ):
                self._registrations.add(reg)
                self._counts[kind] += 1
                return reg
        reg.active = False
        self._cut_on_entry(reg, reason)
        raise Interrupted(reason)

    # -- the internal interface of registrations and owned threads (``Owner``) -----

    def release(self, reg: Registration) -> None:
        """End ``reg``; for ``Registration`` and the scope's own modules (``Owner``)."""
        self._unregister(reg)

    def task_entered(self, reg: Registration) -> None:
        """The thread of ``reg`` runs the task's code from now on (``Owner``)."""
        with self._lock:
            reg.in_user_code = True

    def task_left(self, reg: Registration) -> bool:
        """The thread of ``reg`` left the task's code; True if escalation may be pending."""
        with self._lock:
            reg.in_user_code = False
            return self._escalated

    def _unregister(self, reg: Registration) -> None:
        me = threading.get_ident()
        with self._lock:
            if not reg.active:
                return
            reg.active = False
            self._registrations.discard(reg)
            self._counts[reg.kind] -= 1
            # A cut running on another thread finishes before we return, so the
            # owner may close the socket right after (fact 3).
            while reg._cutting not in (0, me):
                self._cond.wait()
            if reg.kind is Kind.PROCESS and not reg.target.killing:
                self._processes.discard(reg.target)
        self._changed()

    def _changed(self) -> None:
        """Wake wait_quiescent() here and in every ancestor that waits."""
        scope: InterruptScope | None = self
        while scope is not None:
            if scope._quiescence_waiters:
                with scope._cond:
                    scope._cond.notify_all()
            scope = scope.parent

    # -- threads ---------------------------------------------------------------

    def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` in the calling thread with this scope bound, the thread owned by it.

        This is how a host runs a command on its pool (``pool.submit(scope.run,
        command)``); ``spawn()`` and ``executor()`` go through the same path.

        Cancellation: raises ``Interrupted`` without calling ``fn`` if the
        scope is already cancelled. While ``fn`` runs, the thread counts in
        ``live()["threads"]`` and is a target of escalation.
        """
        reg = self._register(Kind.THREAD, threading.current_thread(), None)
        return run_registered(self, reg, fn, *args, **kwargs)

    def spawn(
        self, fn: Callable[..., T], /, *args: Any, name: str | None = None, **kwargs: Any
    ) -> Future[T]:
        """Start ``fn(*args, **kwargs)`` on a new thread owned by this scope, with it bound there.

        Returns a ``concurrent.futures.Future`` for its result or exception.
        ``name`` names the thread (and so cannot be passed on to ``fn``).

        Cancellation: on a cancelled scope, raises ``Interrupted`` and starts
        nothing. Otherwise the thread runs until ``fn`` returns; it sees the
        cancel at its cooperative points (``check``, ``sleep``, registered
        sockets) or through escalation, and counts in ``live()`` until then.
        """
        return start_thread(self, self._register_thread, fn, args, kwargs, name)

    def _register_thread(self, thread: threading.Thread) -> Registration:
        return self._register(Kind.THREAD, thread, None)

    def executor(self, max_workers: int | None = None) -> ScopeExecutor:
        """A thread pool whose tasks run with the submitting context's scope bound."""
        return ScopeExecutor(self, max_workers)

    # -- the ledger ------------------------------------------------------------

    def live(self) -> dict[str, int]:
        """What this scope and its descendants own right now, by kind.

        Keys: ``threads``, ``sockets``, ``processes``, ``objects``. A cut
        process counts until its group was killed and the leader reaped.
        """
        with self._lock:
            return self._live_locked()

    def wait_quiescent(self, timeout: float | None = None) -> bool:
        """Wait until ``live()`` is all zero; False if ``timeout`` passed first.

        Safe from any thread; wakes when anything of this scope or a
        descendant ends. ``timeout`` is wall-clock seconds (infinite: none).
        """
        if timeout is not None and is_never(timeout):
            timeout = None
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._quiescence_waiters += 1
            try:
                while any(self._live_locked().values()):
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                return True
            finally:
                self._quiescence_waiters -= 1

    def _live_locked(self) -> dict[str, int]:
        # Takes each descendant's lock in turn under ours: ancestor ->
        # descendant is the only nesting order in this module (cancel,
        # _changed and _adopt never hold one scope's lock while taking another's).
        counts = self._own_counts_locked()
        stack = list(self._children)
        while stack:
            scope = stack.pop()
            with scope._lock:
                for key, n in scope._own_counts_locked().items():
                    counts[key] += n
                stack.extend(scope._children)
        return counts

    def _own_counts_locked(self) -> dict[str, int]:
        counts = {kind.value: n for kind, n in self._counts.items()}
        counts[Kind.PROCESS.value] = len(self._processes)
        return counts


def _wait_timeout(seconds: float) -> float | None:
    """A timeout for a threading wait: None for one too long to pass to it."""
    return None if is_never(seconds) else seconds


def _cancel_ref(ref: weakref.ref[InterruptScope]) -> None:
    scope = ref()
    if scope is not None:
        scope.cancel("timeout")


def _escalate_ref(ref: weakref.ref[InterruptScope]) -> None:
    scope = ref()
    if scope is not None:
        scope._escalate()


def _event_condition(event: threading.Event) -> threading.Condition:
    """The Condition inside CPython's ``threading.Event``, which ``scope.wait()`` needs."""
    cond = getattr(event, "_cond", None)
    if not isinstance(cond, threading.Condition):
        raise RuntimeError(
            f"scope.wait() needs a threading.Event that keeps a Condition in `_cond` "
            f"(CPython's does); {event!r} has none"
        )
    return cond


class _EventWaker:
    """Cut for ``scope.wait()``: wake the waiter on the event's condition."""

    __slots__ = ("_cond",)

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond

    def interrupt(self, reason: str) -> None:
        with self._cond:
            self._cond.notify_all()
