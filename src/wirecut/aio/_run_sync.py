"""``run_sync``: run sync work on a thread from asyncio, so that cancelling the task cuts it.

``asyncio.to_thread``, ``loop.run_in_executor`` and ``anyio.to_thread.run_sync``
all answer a cancelled task by abandoning the thread: the awaiting task gets
``CancelledError`` at once while the thread, its blocked read and the
provider's slot run on (docs/architecture.md, fact 4). ``run_sync`` runs the
work under an ``InterruptScope`` instead; a cancel of the awaiting task cancels
the scope (the sockets are shut, the processes killed, the waits woken), waits
a bounded time for the thread to return, and only then raises
``CancelledError``, carrying what was true at that moment (``Unwind``).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, TypeVar, TypeVarTuple

from wirecut.scope import InterruptScope, TimelineEvent, bind_scope

__all__ = ["CANCEL_REASON", "Unwind", "run_sync", "unwind_of"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: The reason ``run_sync`` gives the scope when the awaiting task is cancelled
#: (the first reason wins: a host that cancelled the scope first keeps its own).
CANCEL_REASON = "cancelled"

# The attribute of a CancelledError that carries its Unwind. A subclass of
# CancelledError would be neater, but Python 3.11's asyncio.timeout() tells
# its own cancel apart with `exc_type is CancelledError`: a subclass would
# escape it as a cancel instead of becoming TimeoutError.
_UNWIND_ATTRIBUTE = "wirecut_unwind"


@dataclass(frozen=True)
class Unwind:
    """What was true when ``run_sync`` raised ``CancelledError`` (see ``unwind_of``).

    - ``started``: ``fn`` had begun running (False: the cancel came while it
      was still queued in an executor, or before its thread ran it).
    - ``worker_exited``: the thread had returned from ``fn`` (or never ran it)
      by the time ``CancelledError`` was raised; False means it was still
      running at the ``unwind_timeout`` bound, and it is counted in
      ``open["threads"]``.
    - ``cancel_to_exit_ms``: from the cancel to ``fn``'s return; None when it
      did not start or had not returned.
    - ``timeline``: the scope's unwind (``InterruptScope.timeline``) at that
      moment: ``(event, ms since the cancel)``.
    - ``open``: ``scope.live()`` at that moment (threads, sockets, processes,
      objects still owned).
    - ``future``: the ``concurrent.futures.Future`` of the call: its result or
      exception once the thread returned (a cut ``ChatClient.chat`` returns
      its partial answer there).
    """

    scope: InterruptScope
    started: bool
    worker_exited: bool
    cancel_to_exit_ms: float | None
    timeline: tuple[tuple[TimelineEvent, float], ...]
    open: Mapping[str, int]
    future: Future[Any] = field(repr=False)

    def summary(self) -> str:
        """One line for a log or an exception note."""
        if not self.started:
            return f"wirecut: {self.scope!r} cancelled before its work started"
        if not self.worker_exited:
            return (
                f"wirecut: {self.scope!r} cancelled; its thread was still running at the "
                f"unwind bound ({dict(self.open)})"
            )
        return (
            f"wirecut: {self.scope!r} cancelled; its thread returned "
            f"{self.cancel_to_exit_ms:.1f} ms after the cancel"
        )


def unwind_of(exc: BaseException) -> Unwind | None:
    """The ``Unwind`` that ``run_sync`` attached to ``exc``, or None.

    Follows ``__context__``: a task awaiting another task that ``run_sync``
    ran in gets a new ``CancelledError`` whose context is the original one.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        unwind = getattr(current, _UNWIND_ATTRIBUTE, None)
        if isinstance(unwind, Unwind):
            return unwind
        seen.add(id(current))
        current = current.__context__
    return None


class _Call:
    """When ``fn`` began and ended in its thread (written there, read on the loop)."""

    __slots__ = ("exited_at", "started_at")

    def __init__(self) -> None:
        self.started_at: float | None = None
        self.exited_at: float | None = None

    def run(self, scope: InterruptScope, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        # In the caller's copied context, like asyncio.to_thread, with the
        # scope bound inside it (context.run would otherwise hide a binding
        # made outside).
        with bind_scope(scope):
            scope.check()
            self.started_at = time.monotonic()
            try:
                return fn(*args)
            finally:
                self.exited_at = time.monotonic()


async def run_sync(
    fn: Callable[[*Ts], T],
    /,
    *args: *Ts,
    scope: InterruptScope | None = None,
    unwind_timeout: float = 10.0,
    executor: Executor | None = None,
) -> T:
    """Run ``fn(*args)`` on a thread under ``scope`` and return its result.

    Call from a coroutine on a running event loop. A drop-in for
    ``asyncio.to_thread(fn, *args)``, ``loop.run_in_executor(executor, fn,
    *args)`` and ``anyio.to_thread.run_sync(fn, *args)``: ``fn`` runs in a
    copy of the caller's context (as with ``to_thread``), with ``scope``
    bound there, so every request, subprocess and thread it starts through
    wirecut registers with it. Keyword arguments for ``fn`` go through
    ``functools.partial``. ``scope`` defaults to a new ``InterruptScope``
    named after ``fn``. ``executor`` (default: a new thread owned by the
    scope) runs it on a pool of your own instead.

    ``unwind_timeout`` (seconds, finite, >= 0) bounds the wait for the thread
    after a cancel; it is a ``ValueError`` otherwise.

    Cancellation: if the awaiting task is cancelled, the scope is cancelled
    (reason ``"cancelled"``, unless it was already cancelled with another
    one), which cuts what ``fn`` is blocked in; then ``run_sync`` waits up to
    ``unwind_timeout`` seconds for the thread to return (a second cancel of
    the task does not shorten that wait) and raises the ``CancelledError``.
    ``unwind_of(exc)`` gives the facts at that moment (``Unwind``): whether
    the thread returned, how long it took, the scope's timeline, what it
    still owns; the same line is added as a note to the exception. Work
    queued in ``executor`` that had not started is dropped and never runs.
    A thread that has not returned by the bound is not abandoned silently:
    ``Unwind.worker_exited`` is False and the scope still counts it.

    If ``scope`` is cancelled by someone else (not by cancelling the task),
    nothing is raised by ``run_sync`` itself: ``fn`` sees the cut and returns
    or raises (``wirecut.scope.Interrupted``) as it does, and ``run_sync``
    passes that on. On an already cancelled scope ``fn`` never runs and
    ``Interrupted`` is raised.
    """
    if (
        not isinstance(unwind_timeout, int | float)
        or isinstance(unwind_timeout, bool)
        or math.isnan(unwind_timeout)
        or unwind_timeout < 0
        or unwind_timeout > threading.TIMEOUT_MAX
    ):
        raise ValueError(
            f"unwind_timeout must be a number of seconds >= 0 and finite, not {unwind_timeout!r}"
        )
    if scope is None:
        scope = InterruptScope(getattr(fn, "__name__", None))
    call = _Call()
    context = contextvars.copy_context()
    if executor is None:
        future: Future[T] = scope.spawn(context.run, call.run, scope, fn, args)
    else:
        scope.check()
        future = executor.submit(_in_pool, context, scope, call, fn, args)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError as exc:
        await _unwind(scope, future, call, exc, unwind_timeout)
        raise


def _in_pool(
    context: contextvars.Context,
    scope: InterruptScope,
    call: _Call,
    fn: Callable[..., T],
    args: tuple[Any, ...],
) -> T:
    # scope.run owns the pool's thread for the scope's ledger while fn runs.
    return context.run(scope.run, call.run, scope, fn, args)


async def _unwind(
    scope: InterruptScope,
    future: Future[Any],
    call: _Call,
    exc: asyncio.CancelledError,
    unwind_timeout: float,
) -> None:
    """Cut, wait for the thread (bounded), and attach the facts to ``exc``."""
    never_ran = future.cancel()  # True only for queued work (fact 4).
    scope.cancel(CANCEL_REASON)
    if not never_ran and not future.done():
        loop = asyncio.get_running_loop()
        deadline = loop.time() + unwind_timeout
        done = asyncio.wrap_future(future)
        # Whenever it ends: its exception (the cut work's Interrupted) is the
        # caller's to read in Unwind.future, and this wrapper must not log it
        # as "never retrieved".
        done.add_done_callback(_consume)
        while not done.done():
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                await asyncio.wait({done}, timeout=remaining)
            except asyncio.CancelledError:
                continue  # Cancelled again: the bound, not the second cancel, ends the wait.
    # Read after the wait: a thread that had not reached fn when the scope
    # was cancelled leaves at once with Interrupted, without starting it.
    started = call.started_at is not None
    exited = never_ran or future.done()
    cancelled_at = scope.cancelled_at
    to_exit = None
    if started and call.exited_at is not None and cancelled_at is not None:
        to_exit = max(0.0, (call.exited_at - cancelled_at) * 1000)
    unwind = Unwind(
        scope=scope,
        started=started,
        worker_exited=exited,
        cancel_to_exit_ms=to_exit,
        timeline=tuple(scope.timeline),
        open=scope.live(),
        future=future,
    )
    setattr(exc, _UNWIND_ATTRIBUTE, unwind)
    exc.add_note(unwind.summary())


def _consume(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()
