"""What a scope can cut, and how a socket and an object are cut.

Every ``cut`` returns quickly: ``InterruptScope.cancel()`` runs them on the
caller's thread and must never block on the work it cuts. Waiting that a cut
needs (a process's kill grace) happens on a helper thread (``_process``).
"""

from __future__ import annotations

import ctypes
import socket
from collections.abc import Callable
from typing import Protocol

__all__ = ["Cuttable", "Interruptible", "ObjectCut", "SocketCut", "cut_socket"]


class Cuttable(Protocol):
    """One registered thing, as the scope sees it when it cancels.

    ``cut`` is called at most once per registration, from whichever thread
    cancels (never while holding the scope's lock). It must be quick and
    safe from any thread. It returns True if it really acted (the scope marks
    the matching ``TimelineEvent`` only then), False if there was nothing left
    to act on.
    """

    def cut(self, reason: str) -> bool: ...


class Interruptible(Protocol):
    """Anything a scope can cut by calling ``interrupt(reason)`` (an agent turn).

    ``interrupt`` must be idempotent, safe from any thread, and quick: it is
    called on the cancelling thread.
    """

    def interrupt(self, reason: str) -> None: ...


def _shutdown_holding_the_gil() -> Callable[[int, int], int] | None:
    """libc's ``shutdown(2)``, called without releasing the GIL (``ctypes.PyDLL``); None if absent.

    ``socket.shutdown()`` releases the GIL around the system call, and the
    thread that the shutdown just woke takes it: in a burst of cancels, each
    further cut then waits for a woken worker to unwind (64 cuts took 38 to
    90 ms, most of it other threads' Python). ``shutdown(2)`` never blocks, so
    holding the GIL through it costs nothing, and the canceller finishes
    every cut before any cut worker runs.
    """
    try:
        function = ctypes.PyDLL(None, use_errno=True).shutdown
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_shutdown = _shutdown_holding_the_gil()


def cut_socket(sock: socket.socket) -> bool:
    """Shut ``sock`` down in both directions; never close it. True if it was shut.

    ``close()`` from another thread does not wake a thread blocked in
    ``recv()`` and the peer sees nothing; ``shutdown(SHUT_RDWR)`` wakes it
    (``recv`` returns b"") and sends the FIN (docs/architecture.md, fact 1).
    Closing is left to the owning thread: an fd closed here could be reused at
    once by another ``open()`` and receive the owner's late writes (fact 3).

    Returns False when nothing was shut: the socket is closed or detached (its
    fd is -1, as a plain socket is once ``ssl.wrap_socket`` took it over),
    was never connected, or the system refused.
    """
    fd = sock.fileno()
    if fd == -1:
        return False
    if _shutdown is not None:
        # The fd stays this socket's while we cut: its owner closes it only
        # after unregistering, which waits for a cut in flight.
        # Not 0: closed meanwhile, never connected, or the peer reset it.
        return _shutdown(fd, socket.SHUT_RDWR) == 0
    try:
        # The plain socket method, also for an ssl.SSLSocket: its own
        # shutdown() unwraps the TLS object under the owner's feet.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        return False  # Closed meanwhile, never connected, or the peer reset it.
    return True


class SocketCut:
    """Cut of a registered socket: ``cut_socket``."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def cut(self, reason: str) -> bool:
        return cut_socket(self.sock)


class ObjectCut:
    """Cut of a registered ``Interruptible``: call its ``interrupt(reason)``."""

    __slots__ = ("obj",)

    def __init__(self, obj: Interruptible) -> None:
        self.obj = obj

    def cut(self, reason: str) -> bool:
        self.obj.interrupt(reason)
        return True
