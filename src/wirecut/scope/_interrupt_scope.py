"""``InterruptScope``: a latched cancel that cuts everything registered with it.

A host creates one scope per command, binds it around the worker, and every
agent turn, socket, subprocess and thread of that command registers with it.
``cancel()`` cuts all of them, including the ones that try to register after
the cancel: those are cut on entry and their caller gets ``Interrupted``.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import enum
import logging
import math
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec, Protocol, TypeVar

from wirecut.scope._binding import bind_scope, current_scope
from wirecut.scope._cuttables import ProcessTarget, cut_socket
from wirecut.scope._errors import Interrupted
from wirecut.scope._timers import TimerHandle, call_later

__all__ = ["InterruptScope", "Interruptible", "Registration", "ScopeExecutor", "ScopeState"]

_log = logging.getLogger("wirecut.scope")

P = ParamSpec("P")
T = TypeVar("T")

#: Default time a cut process group gets between SIGTERM and SIGKILL.
DEFAULT_KILL_GRACE = 1.0


class Interruptible(Protocol):
    """Anything a scope can cut by calling ``interrupt(reason)`` (an agent turn).

    ``interrupt`` must be idempotent, safe from any thread, and quick: it is
    called on the cancelling thread.
    """

    def interrupt(self, reason: str) -> None: ...


class ScopeState(enum.Enum):
    """The lifecycle of a scope. The only transition is OPEN -> CANCELLED."""

    OPEN = "open"  # work may register; nothing has been cut
    CANCELLED = "cancelled"  # latched: all registered work was cut, and new work is cut on entry


class _Kind(enum.Enum):
    # Cut in this order: sockets first, since a blocked read is what keeps
    # a provider slot busy; threads are cooperative and only escalated.
    SOCKET = "sockets"
    OBJECT = "objects"
    PROCESS = "processes"
    THREAD = "threads"


class Registration:
    """A handle on one registered thing; leaving it (or ``unregister()``) ends it.

    ``unregister()`` is idempotent and safe from any thread. Once it returns, the
    scope will not cut the thing: if a cut was running on another thread at that
    moment, ``unregister()`` waits for it to finish, so an owner may close its
    socket right after.
    """

    __slots__ = ("_cutting", "_scope", "active", "in_user_code", "kind", "target")

    def __init__(self, scope: InterruptScope, kind: _Kind, target: Any) -> None:
        self._scope = scope
        self.kind = kind
        self.target = target
        self.active = True
        # Ident of the thread cutting this registration right now, or 0.
        self._cutting = 0
        # Threads only: escalation may raise in it (it runs the task's code).
        self.in_user_code = False

    def unregister(self) -> None:
        self._scope._unregister(self)

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._scope._unregister(self)

    def __repr__(self) -> str:
        state = "active" if self.active else "ended"
        return f"<Registration {self.kind.name.lower()} {state} {self.target!r}>"


class InterruptScope:
    """A latched cancel for one unit of work and everything it started.

    Safe to use from any thread. ``cancel()`` may be called from any thread
    (not from a signal handler: it takes a lock) and never blocks on the work
    it cuts; the cuts run outside the lock, and one failing cut does not stop
    the others.

    A child scope (``parent=`` or ``scope.child()``) is cancelled with its
    parent, with the parent's reason, and can be cancelled alone. ``timeout``
    (seconds) makes the scope cancel itself with reason "timeout".

    Used as a context manager, the scope is bound for the block; leaving it
    drops its timeout. The ``Interrupted`` of a cancelled scope is not
    swallowed on the way out.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        timeout: float | None = None,
        parent: InterruptScope | None = None,
    ) -> None:
        if timeout is not None and (math.isnan(timeout) or timeout < 0):
            raise ValueError(f"timeout must be a non-negative number of seconds, not {timeout!r}")
        self.name = name
        self.parent = parent
        # Guards the state, the registrations, the counts and the children.
        # The condition wakes wait_quiescent() when something unregisters.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._quiescence_waiters = 0
        self._state = ScopeState.OPEN
        self._reason: str | None = None
        self._cancelled_at: float | None = None
        # Set once cancelled: sleep() and wait() wake on it.
        self._cancelled_event = threading.Event()
        self._registrations: set[Registration] = set()
        self._counts = dict.fromkeys(_Kind, 0)
        # Processes are counted by target, not registration: a cut one stays
        # owned until its group was killed and the leader reaped.
        self._processes: set[ProcessTarget] = set()
        self._children: weakref.WeakSet[InterruptScope] = weakref.WeakSet()
        self._timeline: list[tuple[str, float]] = []
        self._timeout_timer: TimerHandle | None = None
        self._escalation_timer: TimerHandle | None = None
        self._bindings: list[contextlib.AbstractContextManager[Any]] = []
        # Set (under the lock) before the first async Interrupted is raised.
        self._escalated = False
        self.deadline = None if timeout is None else time.monotonic() + timeout
        if parent is not None:
            parent._adopt(self)
        if timeout is not None and not self.cancelled:
            ref = weakref.ref(self)
            self._timeout_timer = call_later(timeout, lambda: _cancel_ref(ref, "timeout"))

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
    def timeline(self) -> list[tuple[str, float]]:
        """The steps of the unwind so far: ``(event, ms since the cancel)``."""
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

        Escalation is a last resort for pure-Python code that never reaches a
        cooperative point: after ``escalate_after`` seconds, every thread this
        scope owns that is still running its task gets ``Interrupted`` raised
        asynchronously (``PyThreadState_SetAsyncExc``). It is only delivered
        when the thread runs Python bytecode (not while it is blocked in a
        system call or C code), it can land in any ``finally`` block or
        between any two statements and break invariants there, and code may
        catch and drop it. So it is never the plan: registration and
        ``check()`` are. The ledger (``live()``) tells whether it worked.
        """
        if escalate_after is not None and (math.isnan(escalate_after) or escalate_after < 0):
            raise ValueError(f"escalate_after must be >= 0 seconds, not {escalate_after!r}")
        with self._lock:
            first = self._state is ScopeState.OPEN
            if first:
                self._state = ScopeState.CANCELLED
                self._reason = reason
                self._cancelled_at = time.monotonic()
                self._timeline.append(("cancel_requested", self._cancelled_at))
                snapshot = sorted(self._registrations, key=_cut_order)
                children = list(self._children)
            if escalate_after is not None and self._escalation_timer is None:
                ref = weakref.ref(self)
                self._escalation_timer = call_later(escalate_after, lambda: _escalate_ref(ref))
        if not first:
            return False
        self._cancelled_event.set()
        if self._timeout_timer is not None:
            self._timeout_timer.cancel()
        assert self._reason is not None
        self._cut_all(snapshot, self._reason)
        for child in children:
            child.cancel(self._reason)
        if children:
            self._mark("children_cancelled")
        return True

    def _cut_all(self, snapshot: list[Registration], reason: str) -> None:
        done: set[_Kind] = set()
        for reg in snapshot:
            if reg.kind is _Kind.THREAD:
                continue  # Threads stop cooperatively, or by escalation.
            me = threading.get_ident()
            with self._lock:
                if not reg.active:
                    continue  # Unregistered since the snapshot: not ours to cut.
                reg._cutting = me
            try:
                self._cut_one(reg, reason)
            except Exception:
                _log.exception("cutting %r failed", reg)
            finally:
                with self._lock:
                    reg._cutting = 0
                    self._cond.notify_all()
            done.add(reg.kind)
        for kind, event in _CUT_EVENTS.items():
            if kind in done:
                self._mark(event)

    def _cut_one(self, reg: Registration, reason: str) -> None:
        if reg.kind is _Kind.SOCKET:
            cut_socket(reg.target)
        elif reg.kind is _Kind.OBJECT:
            reg.target.interrupt(reason)
        elif reg.kind is _Kind.PROCESS:
            target: ProcessTarget = reg.target
            with self._lock:
                # Owned until the kill is over, whatever the owner unregisters.
                target.killing = True
                self._processes.add(target)
            target.signal(signal.SIGTERM)
            # Marked before the kill thread starts, so that it comes before
            # "processes_killed" in the timeline.
            self._mark("processes_signalled", once=True)
            target.start_kill(lambda: self._kill_done(target))

    def _kill_done(self, target: ProcessTarget) -> None:
        with self._lock:
            self._processes.discard(target)
            last = not any(p.killing for p in self._processes)
        if last:
            self._mark("processes_killed")
        self._changed()

    def _mark(self, event: str, *, once: bool = False) -> None:
        with self._lock:
            if not (once and any(seen == event for seen, _ in self._timeline)):
                self._timeline.append((event, time.monotonic()))

    def _escalate(self) -> None:
        with self._lock:
            self._escalated = True
            threads = [
                reg.target
                for reg in self._registrations
                if reg.kind is _Kind.THREAD and reg.in_user_code
            ]
            children = list(self._children)
            for thread in threads:
                _raise_in_thread(thread.ident, Interrupted)
        if threads:
            self._mark("escalated")
        for child in children:
            child._escalate()

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
        """Drop the timeout timer. Safe to call more than once."""
        if self._timeout_timer is not None:
            self._timeout_timer.cancel()

    def __enter__(self) -> InterruptScope:
        binding = bind_scope(self)
        binding.__enter__()
        self._bindings.append(binding)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._bindings.pop().__exit__(*exc_info)
        self.close()

    # -- the cooperative points ------------------------------------------------

    def check(self) -> None:
        """Raise ``Interrupted`` if the scope is cancelled."""
        if self._state is ScopeState.CANCELLED:
            raise Interrupted(self._reason or "cancelled")

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``; on cancel, return at once by raising ``Interrupted``."""
        if self._cancelled_event.wait(max(0.0, seconds)):
            raise Interrupted(self._reason or "cancelled")

    def wait(self, event: threading.Event, timeout: float | None = None) -> bool:
        """``event.wait(timeout)``, except that a cancel ends it at once with ``Interrupted``.

        Returns what ``event.wait`` would: True once the event is set, False on
        timeout.
        """
        self.check()
        if event.is_set():
            return True
        # Wait on the event's own condition (CPython's Event is a flag and a
        # Condition), and let the cancel notify it: one wakeup, no polling.
        cond: threading.Condition = event._cond  # type: ignore[attr-defined]
        waker = _EventWaker(cond)
        with self.register(waker):
            with cond:
                set_ = cond.wait_for(lambda: event.is_set() or self.cancelled, timeout)
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
        return self._register(_Kind.OBJECT, obj)

    def register_socket(self, sock: socket.socket) -> Registration:
        """Register a connected socket; a cut is ``shutdown(SHUT_RDWR)``, never ``close()``.

        The owning thread keeps the socket and closes it after leaving the
        registration. On a cancelled scope, shuts it down at once and raises
        ``Interrupted``.
        """
        return self._register(_Kind.SOCKET, sock)

    def register_process(
        self, popen: subprocess.Popen[Any], *, grace: float | None = None
    ) -> Registration:
        """Register a child process; a cut kills its process group.

        The cut sends SIGTERM to the group, SIGKILL after ``grace`` seconds
        (default 1), and reaps the leader. On a cancelled scope the kill
        starts at once and ``Interrupted`` is raised.
        """
        grace = DEFAULT_KILL_GRACE if grace is None else grace
        return self._register(_Kind.PROCESS, ProcessTarget(popen, grace))

    def popen(self, argv: list[str], *, grace: float | None = None, **kwargs: Any) -> ScopedPopen:
        """Start ``argv`` in its own session and register it with this scope.

        Returns a ``subprocess.Popen`` whose registration ends when it has
        been waited for or its ``with`` block ends; at that moment the rest of
        its process group is killed, so nothing it started outlives it.
        Raises ``Interrupted`` (without starting anything) on a cancelled scope.
        """
        self.check()
        return ScopedPopen(self, argv, grace=grace, **kwargs)

    def _register(self, kind: _Kind, target: Any) -> Registration:
        reg = Registration(self, kind, target)
        with self._lock:
            if self._state is ScopeState.OPEN:
                self._registrations.add(reg)
                self._counts[kind] += 1
                if kind is _Kind.PROCESS:
                    self._processes.add(target)
                return reg
            reason = self._reason or "cancelled"
        reg.active = False
        self._cut_one(reg, reason)
        raise Interrupted(reason)

    def _unregister(self, reg: Registration) -> None:
        me = threading.get_ident()
        with self._lock:
            if not reg.active:
                return
            reg.active = False
            self._registrations.discard(reg)
            self._counts[reg.kind] -= 1
            if reg.kind is _Kind.PROCESS and not reg.target.killing:
                self._processes.discard(reg.target)
            # A cut running on another thread finishes before we return, so the
            # owner may close the socket right after (fact 3).
            while reg._cutting not in (0, me):
                self._cond.wait()
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
        reg = self._register(_Kind.THREAD, threading.current_thread())
        return self._run_registered(reg, fn, *args, **kwargs)

    def _run_registered(
        self, reg: Registration, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        # The one place that binds a scope around work in a thread.
        try:
            with bind_scope(self):
                self.check()
                with self._lock:
                    reg.in_user_code = True
                try:
                    return fn(*args, **kwargs)
                finally:
                    with self._lock:
                        reg.in_user_code = False
                    if self._escalated:
                        # An escalation may be set but not yet delivered: drop
                        # it rather than let it land in our bookkeeping.
                        _raise_in_thread(threading.get_ident(), None)
        finally:
            self._unregister(reg)

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
        future: Future[T] = Future()
        future.set_running_or_notify_cancel()

        def main() -> None:
            try:
                future.set_result(self._run_registered(reg, fn, *args, **kwargs))
            except BaseException as exc:  # Interrupted included: the future carries it.
                future.set_exception(exc)

        thread = threading.Thread(target=main, name=name or _thread_name(self), daemon=True)
        # Registered before start() so that wait_quiescent() cannot miss it.
        reg = self._register(_Kind.THREAD, thread)
        try:
            thread.start()
        except BaseException:
            self._unregister(reg)
            raise
        return future

    def executor(self, max_workers: int | None = None) -> ScopeExecutor:
        """A thread pool whose tasks run with the submitting context's scope bound."""
        return ScopeExecutor(self, max_workers)

    # -- the ledger ------------------------------------------------------------

    def live(self) -> dict[str, int]:
        """What this scope and its children own right now, by kind.

        Keys: ``threads``, ``sockets``, ``processes``, ``objects``. A cut
        process counts until its group was killed and the leader reaped.
        """
        with self._lock:
            return self._live_locked()

    def wait_quiescent(self, timeout: float | None = None) -> bool:
        """Wait until ``live()`` is all zero; False if ``timeout`` passed first."""
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
        # Takes the children's locks under ours: parent -> child is the only
        # nesting order in this module (cancel and _changed never nest).
        counts = {kind.value: n for kind, n in self._counts.items()}
        counts["processes"] = len(self._processes)
        for child in list(self._children):
            for key, n in child.live().items():
                counts[key] += n
        return counts


_CUT_EVENTS = {_Kind.SOCKET: "sockets_shut", _Kind.OBJECT: "agents_interrupted"}
_ORDER = {kind: i for i, kind in enumerate(_Kind)}


def _thread_name(scope: InterruptScope) -> str:
    return f"wirecut-{scope.name}" if scope.name else "wirecut-scope"


def _cut_order(reg: Registration) -> int:
    return _ORDER[reg.kind]


def _cancel_ref(ref: weakref.ref[InterruptScope], reason: str) -> None:
    scope = ref()
    if scope is not None:
        scope.cancel(reason)


def _escalate_ref(ref: weakref.ref[InterruptScope]) -> None:
    scope = ref()
    if scope is not None:
        scope._escalate()


def _raise_in_thread(ident: int | None, exc_type: type[BaseException] | None) -> None:
    """Schedule ``exc_type`` in thread ``ident`` (None clears a pending one)."""
    if ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(ident), None if exc_type is None else ctypes.py_object(exc_type)
        )


class _EventWaker:
    """Cut for ``scope.wait()``: wake the waiter on the event's condition."""

    __slots__ = ("_cond",)

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond

    def interrupt(self, reason: str) -> None:
        with self._cond:
            self._cond.notify_all()


class ScopedPopen(subprocess.Popen[Any]):
    """A ``subprocess.Popen`` started by ``scope.popen()``: its own session, registered.

    Its registration ends when it has been waited for (``wait``,
    ``communicate``, ``run``-style use, or the ``with`` block); then whatever is
    left of its process group is killed.
    """

    def __init__(
        self, scope: InterruptScope, argv: list[str], *, grace: float | None, **kwargs: Any
    ) -> None:
        kwargs["start_new_session"] = True
        super().__init__(argv, **kwargs)
        self._registration: Registration | None = None
        try:
            self._registration = scope.register_process(self, grace=grace)
        except Interrupted:
            # Cancelled while it started: the cut on entry kills it within
            # the grace. Close its pipes and reap it here, as the caller
            # never gets the object to do so.
            with self:
                pass
            raise

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self._release()
        return code

    def __exit__(self, *exc_info: Any) -> None:
        super().__exit__(*exc_info)
        self._release()

    def _release(self) -> None:
        registration = self._registration
        if registration is not None and registration.active:
            registration.unregister()
            target: ProcessTarget = registration.target
            if target.own_group:
                target.kill_remaining()


class ScopeExecutor(ThreadPoolExecutor):
    """A thread pool whose every task runs under ``scope.run()``.

    A task runs with the scope bound in the submitting context (a child scope,
    say), else the executor's own scope, and in a copy of the submitting
    context, like ``asyncio.to_thread``.

    Cancellation: ``submit()`` on a cancelled scope raises ``Interrupted``; a
    task that was queued when the cancel came completes with ``Interrupted``
    without running. Running tasks see the cancel at their cooperative points.
    """

    def __init__(self, scope: InterruptScope, max_workers: int | None = None) -> None:
        super().__init__(max_workers, thread_name_prefix=_thread_name(scope))
        self.scope = scope

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        scope = current_scope() or self.scope
        scope.check()
        context = contextvars.copy_context()
        return super().submit(context.run, scope.run, fn, *args, **kwargs)  # type: ignore[arg-type]
