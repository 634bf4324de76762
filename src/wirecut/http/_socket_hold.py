"""``SocketHold``: one connection's socket registration with its scope, from connect to close.

The piece every scoped client shares (httpcore, httpcore2, urllib3). The scope
is the one bound when the connection was opened, held weakly so that an idle
pooled connection does not keep a finished scope alive. What is registered
changes over a connection's life, and each move registers the new thing
before it releases the old one, so that a cancel in between cannot miss both:

1. while the TCP connect runs: a wakeup socket that ends the connect when
   the scope cuts it (``connect_tcp``, see ``_connect``);
2. from the connect on: the connected socket itself;
3. through a TLS handshake: a ``dup()`` of it. ``ssl.wrap_socket`` detaches
   the plain socket object before the handshake (its fd becomes -1, and a
   shutdown of it does nothing), while the dup shares the very socket that
   the handshake reads, so cutting the dup ends the handshake;
4. after the handshake: the TLS socket.

A request's socket stays registered until the response is released; an idle
pooled connection is released (not counted in ``scope.live()``, not cut).

Used by the thread that owns the connection. The scope's cut reaches the
registered socket from any thread and only ever shuts it down; the sockets a
hold made itself (wakeup, dup) are closed by the owner, after unregistering
(an fd closed by the cutter could be reused at once: docs/architecture.md, fact 3).
"""

from __future__ import annotations

import socket
import ssl
import weakref
from collections.abc import Iterable
from typing import Any

from wirecut.http._connect import connect_tcp
from wirecut.http._cut import cut_as_interrupted
from wirecut.scope import InterruptScope, Registration

__all__ = ["SocketHold"]


class SocketHold:
    """Registers one connection's socket with the scope of its connect, while in use."""

    __slots__ = ("_owned", "_registration", "_scope_ref", "_sock")

    def __init__(self, scope: InterruptScope | None) -> None:
        self._scope_ref = None if scope is None else weakref.ref(scope)
        self._registration: Registration | None = None
        self._sock: socket.socket | None = None
        # Sockets this hold made and closes when it lets go of them (wakeup, dup).
        self._owned: tuple[socket.socket, ...] = ()

    @property
    def scope(self) -> InterruptScope | None:
        """The scope of the connection (None: none was bound, or it was collected)."""
        return None if self._scope_ref is None else self._scope_ref()

    @property
    def registered(self) -> bool:
        return self._registration is not None

    def connect_tcp(
        self,
        host: str,
        port: int,
        *,
        timeout: float | None,
        source_address: tuple[str, int] | None = None,
        socket_options: Iterable[Any] | None = None,
        nodelay: bool = True,
    ) -> socket.socket:
        """Connect (see ``_connect.connect_tcp``) and register the new socket.

        Cancellation: on a cancelled scope, raises ``Interrupted`` before
        anything is resolved or connected. A cut during the connect ends it
        at once with ``Interrupted``. Name resolution is not cut.
        """
        scope = self.scope
        if scope is None:
            return connect_tcp(
                host,
                port,
                timeout=timeout,
                wakeup=None,
                source_address=source_address,
                socket_options=socket_options,
                nodelay=nodelay,
            )
        wakeup, peer = socket.socketpair()
        self.hold(wakeup, owned=(wakeup, peer))  # Raises Interrupted on a cancelled scope.
        try:
            with cut_as_interrupted(scope):
                sock = connect_tcp(
                    host,
                    port,
                    timeout=timeout,
                    wakeup=wakeup,
                    source_address=source_address,
                    socket_options=socket_options,
                    nodelay=nodelay,
                )
        except BaseException:
            self.release()
            raise
        try:
            self.hold(sock)
        except BaseException:
            # Cancelled right after the connect: the new socket was cut on
            # entry and is ours to close, and the wakeup is still held.
            self.release()
            sock.close()
            raise
        return sock

    def hold(self, sock: socket.socket, *, owned: tuple[socket.socket, ...] = ()) -> None:
        """Register ``sock``, unless it is registered already; the registration moves to it.

        ``owned`` are sockets the hold closes once it lets go of ``sock``. On
        a cancelled scope, ``sock`` is shut down and ``Interrupted`` raised;
        the caller still owns ``sock`` (``owned`` are closed here).
        """
        if self._registration is not None and self._sock is sock:
            return
        scope = self.scope
        if scope is None:
            _close_all(owned)
            return
        try:
            registration = scope.register_socket(sock)
        except BaseException:
            _close_all(owned)
            raise
        self.release()
        self._registration, self._sock, self._owned = registration, sock, owned

    def hold_across_wrap(self, sock: socket.socket) -> None:
        """Register a ``dup()`` of ``sock`` before a TLS wrap detaches ``sock`` (step 3 above).

        The next ``hold`` (the TLS socket) or ``release`` closes the dup. A
        TLS socket (TLS in TLS, through an HTTPS proxy) is not detached by the
        inner wrap: it simply stays registered.
        """
        if self.scope is None or isinstance(sock, ssl.SSLSocket):
            self.hold(sock)
            return
        dup = sock.dup()
        self.hold(dup, owned=(dup,))

    def release(self) -> None:
        """Unregister; waits for a cut in flight, so the owner may close right after."""
        registration, owned = self._registration, self._owned
        self._registration, self._sock, self._owned = None, None, ()
        if registration is not None:
            registration.unregister()
        _close_all(owned)


def _close_all(sockets: tuple[socket.socket, ...]) -> None:
    for sock in sockets:
        sock.close()
