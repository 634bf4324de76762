"""Binding a scope to the running context, and helpers that act on the bound one.

The bound scope lives in a ContextVar, so it follows the code that runs under
``bind_scope()`` and nothing else. A ContextVar does not cross into a new
``threading.Thread`` or an executor's worker by itself (docs/architecture.md,
fact 5): use ``scope.spawn()``, ``scope.executor()`` or ``scope.run()``,
which bind it there.

The module-level helpers act on the bound scope and, with none bound, do the
plain operation and nothing more (``check`` passes, ``sleep`` sleeps, the
``register*`` helpers return a handle that does nothing), so library code can
call them unconditionally and behaves exactly as before outside a host.
"""

from __future__ import annotations

import contextlib
import contextvars
import socket
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wirecut.scope._cuttables import Interruptible
    from wirecut.scope._interrupt_scope import InterruptScope
    from wirecut.scope._registration import Registration

__all__ = [
    "NULL_REGISTRATION",
    "NullRegistration",
    "bind_scope",
    "check",
    "committing",
    "current_scope",
    "enter_scope",
    "exit_scope",
    "register",
    "register_process",
    "register_socket",
    "sleep",
    "wait",
]

_current: contextvars.ContextVar[InterruptScope | None] = contextvars.ContextVar(
    "wirecut_scope", default=None
)


# The ``with scope:`` blocks open in the running context, innermost last, each
# with the token that restores the binding it replaced. Kept per context (not
# on the scope), so that two threads or tasks inside ``with scope:`` at once
# each leave their own block, with their own token.
_entered: contextvars.ContextVar[
    tuple[tuple[InterruptScope, contextvars.Token[InterruptScope | None]], ...]
] = contextvars.ContextVar("wirecut_scope_entered", default=())


def current_scope() -> InterruptScope | None:
    """The scope bound to the running context, or None."""
    return _current.get()


class bind_scope:  # lower case: used like a function, as contextlib.suppress is
    """Bind ``scope`` for the code inside the ``with`` block (None unbinds).

    A class rather than a generator: it runs once per agent turn and request,
    and this is several times cheaper.
    """

    __slots__ = ("_scope", "_token")

    def __init__(self, scope: InterruptScope | None) -> None:
        self._scope = scope

    def __enter__(self) -> InterruptScope | None:
        self._token = _current.set(self._scope)
        return self._scope

    def __exit__(self, *exc_info: object) -> None:
        _current.reset(self._token)


def enter_scope(scope: InterruptScope) -> None:
    """Bind ``scope`` for a ``with scope:`` block in the running context."""
    token = _current.set(scope)
    _entered.set((*_entered.get(), (scope, token)))


def exit_scope(scope: InterruptScope) -> None:
    """End the innermost ``with scope:`` block of the running context.

    Raises ``RuntimeError`` if that block is not ``scope``'s: the block ends
    in another thread or task than the one it began in.
    """
    entered = _entered.get()
    if not entered or entered[-1][0] is not scope:
        raise RuntimeError(
            f"leaving `with {scope!r}:` in a thread or task that did not enter it; "
            "a `with scope:` block must end where it began"
        )
    _entered.set(entered[:-1])
    _current.reset(entered[-1][1])


class NullRegistration:
    """What the helpers return with no scope bound: leaving it does nothing."""

    __slots__ = ()

    def unregister(self) -> None:
        pass

    def __enter__(self) -> NullRegistration:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass


NULL_REGISTRATION = NullRegistration()


def register(obj: Interruptible) -> Registration | NullRegistration:
    """Register an object with ``interrupt(reason)`` on the bound scope."""
    scope = _current.get()
    return NULL_REGISTRATION if scope is None else scope.register(obj)


def register_socket(sock: socket.socket) -> Registration | NullRegistration:
    """Register a socket on the bound scope; a cut shuts it down."""
    scope = _current.get()
    return NULL_REGISTRATION if scope is None else scope.register_socket(sock)


def register_process(
    popen: subprocess.Popen[Any], *, grace: float | None = None
) -> Registration | NullRegistration:
    """Register a process on the bound scope; a cut kills its process group."""
    scope = _current.get()
    return NULL_REGISTRATION if scope is None else scope.register_process(popen, grace=grace)


def check() -> None:
    """Raise ``Interrupted`` if the bound scope is cancelled."""
    scope = _current.get()
    if scope is not None:
        scope.check()


def committing(what: str = "commit") -> contextlib.AbstractContextManager[None]:
    """The bound scope's ``committing(what)`` block; with none bound, a block that does nothing."""
    scope = _current.get()
    return contextlib.nullcontext() if scope is None else scope.committing(what)


def sleep(seconds: float) -> None:
    """Sleep, returning at once with ``Interrupted`` if the bound scope is cancelled."""
    scope = _current.get()
    if scope is None:
        time.sleep(seconds)
    else:
        scope.sleep(seconds)


def wait(event: threading.Event, timeout: float | None = None) -> bool:
    """``event.wait(timeout)`` that raises ``Interrupted`` at once on cancel."""
    scope = _current.get()
    return event.wait(timeout) if scope is None else scope.wait(event, timeout)
