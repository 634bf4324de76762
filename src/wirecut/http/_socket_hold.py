"""``SocketHold``: one connection's socket registration with its scope.

The piece every scoped client shares (httpcore, httpcore2, urllib3): the scope
is the one bound when the connection was opened, held weakly so that an idle
pooled connection does not keep a finished scope alive; the socket is
registered while a request uses it, and the registration can move to a new
socket object (the TLS wrap detaches the plain one, DESIGN fact 7).

Used by the thread that owns the connection; the scope's cut reaches the
socket from any thread and only shuts it down (DESIGN facts 1 and 3).
"""

from __future__ import annotations

import socket
import weakref

from wirecut.scope import Interrupted, InterruptScope, Registration

__all__ = ["SocketHold", "raise_if_cancelled"]


def raise_if_cancelled(scope: InterruptScope | None, exc: BaseException | None) -> None:
    """Raise ``Interrupted(scope.reason)`` from ``exc`` if ``scope`` is cancelled.

    Called where an I/O error or an unexpected EOF surfaces: under a cancelled
    scope it is the cut's doing, and the caller should see the cut.
    """
    if scope is not None and scope.cancelled:
        raise Interrupted(scope.reason or "cancelled") from exc


class SocketHold:
    """Registers one connection's socket with the scope of its connect, while in use."""

    __slots__ = ("_registration", "_scope_ref", "_sock")

    def __init__(self, scope: InterruptScope | None) -> None:
        self._scope_ref = None if scope is None else weakref.ref(scope)
        self._registration: Registration | None = None
        self._sock: socket.socket | None = None

    @property
    def scope(self) -> InterruptScope | None:
        """The scope of the connection (None: none was bound, or it was collected)."""
        return None if self._scope_ref is None else self._scope_ref()

    @property
    def registered(self) -> bool:
        return self._registration is not None

    def hold(self, sock: socket.socket) -> None:
        """Register ``sock``, unless it is registered already.

        A registration of another socket object moves to this one: the new
        one is registered first, so that a cancel in between cannot miss
        both. On a cancelled scope, shuts ``sock`` down and raises
        ``Interrupted`` (the caller still owns and closes it).
        """
        if self._registration is not None and self._sock is sock:
            return
        scope = self.scope
        if scope is None:
            return
        registration = scope.register_socket(sock)
        self.release()
        self._registration, self._sock = registration, sock

    def release(self) -> None:
        """Unregister; waits for a cut in flight, so the owner may close right after."""
        registration, self._registration, self._sock = self._registration, None, None
        if registration is not None:
            registration.unregister()

    def raise_if_cut(self, exc: BaseException | None) -> None:
        """Raise ``Interrupted`` from ``exc`` if the connection's scope was cancelled."""
        raise_if_cancelled(self.scope, exc)
