"""Threads a scope owns: running work with the scope bound, spawning, the executor.

A ContextVar does not cross into a new ``threading.Thread`` or an executor's
worker by itself (docs/architecture.md, fact 5), so every thread a scope owns
runs its work through ``run_registered``: the one place that binds a scope
around work in a thread, counts the thread in the ledger, and makes it a
target of escalation while (and only while) it runs the task's own code.
"""

from __future__ import annotations

import contextvars
import ctypes
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from wirecut.scope._binding import bind_scope, current_scope

if TYPE_CHECKING:
    from wirecut.scope._interrupt_scope import InterruptScope
    from wirecut.scope._registration import Registration

__all__ = [
    "ScopeExecutor",
    "raise_in_thread",
    "run_registered",
    "start_thread",
    "thread_name",
]

P = ParamSpec("P")
T = TypeVar("T")


def thread_name(scope: InterruptScope) -> str:
    return f"wirecut-{scope.name}" if scope.name else "wirecut-scope"


def raise_in_thread(ident: int | None, exc_type: type[BaseException] | None) -> None:
    """Schedule ``exc_type`` in thread ``ident`` (None clears a pending one).

    ``PyThreadState_SetAsyncExc``: delivered when that thread next runs
    Python bytecode, never while it is blocked in a system call or C code.
    """
    if ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(ident), None if exc_type is None else ctypes.py_object(exc_type)
        )


def run_registered(
    scope: InterruptScope,
    reg: Registration,
    fn: Callable[P, T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """Run ``fn`` in this thread with ``scope`` bound, then end ``reg`` (this thread's).

    Cancellation: raises ``Interrupted`` without calling ``fn`` on a
    cancelled scope. ``reg.in_user_code`` is True exactly while ``fn`` runs,
    and escalation targets only such threads.
    """
    try:
        with bind_scope(scope):
            scope.check()
            scope.task_entered(reg)
            try:
                return fn(*args, **kwargs)
            finally:
                if scope.task_left(reg):
                    # An escalation may be set but not yet delivered: drop it
                    # rather than let it land in our bookkeeping.
                    raise_in_thread(threading.get_ident(), None)
    finally:
        scope.release(reg)


def start_thread(
    scope: InterruptScope,
    reg_thread: Callable[[threading.Thread], Registration],
    fn: Callable[..., T],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    name: str | None,
) -> Future[T]:
    """Start ``fn(*args, **kwargs)`` on a new thread registered through ``reg_thread``."""
    future: Future[T] = Future()
    future.set_running_or_notify_cancel()

    def main() -> None:
        try:
            future.set_result(run_registered(scope, reg, fn, *args, **kwargs))
        except BaseException as exc:  # Interrupted included: the future carries it.
            future.set_exception(exc)

    thread = threading.Thread(target=main, name=name or thread_name(scope), daemon=True)
    # Registered before start() so that wait_quiescent() cannot miss it.
    reg = reg_thread(thread)
    try:
        thread.start()
    except BaseException:
        scope.release(reg)
        raise
    return future


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
        super().__init__(max_workers, thread_name_prefix=thread_name(scope))
        self.scope = scope

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        scope = current_scope() or self.scope
        scope.check()
        context = contextvars.copy_context()
        return super().submit(context.run, scope.run, fn, *args, **kwargs)  # type: ignore[arg-type]
