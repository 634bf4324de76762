"""Binding a scope to the running context, and helpers that act on the bound one.

The bound scope lives in a ContextVar, so it follows the code that runs under
``bind_scope()`` and nothing else. A ContextVar does not cross into a new
``threading.Thread`` or an executor's worker by itself (DESIGN fact 5): use
``scope.spawn()``, ``scope.executor()`` or ``scope.run()``, which bind it there.

The module-level helpers act on the bound scope and, with none bound, do the
plain operation and nothing more (``check`` passes, ``sleep`` sleeps, the
``register*`` helpers return a handle that does nothing), so library code can
call them unconditionally and behaves exactly as before outside a host.
"""

from __future__ import annotations

import contextvars
import socket
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wirecut.scope._interrupt_scope import Interruptible, InterruptScope, Registration

__all__ = [
    "NULL_REGISTRATION",
    "NullRegistration",
    "bind_scope",
    "check",
    "current_scope",
    "register",
    "register_process",
    "register_socket",
    "sleep",
    "wait",
]

_current: contextvars.ContextVar[InterruptScope | None] = contextvars.ContextVar(
    "wirecut_scope", default=None
)


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
