"""A TCP connect that a cut ends at once.

A blocking ``connect()`` cannot be woken from another thread: shutting down a
socket that is still connecting is not something every system (or the scope's
socket cut) does. So the connect is started non-blocking and waited on with
``poll()`` together with a wakeup socket that the scope cuts: the wakeup is
one end of a ``socketpair``, registered with the scope like any socket, and its
shutdown makes it readable at once. A provider whose listen backlog is full
(the SYN is dropped and retried for minutes) no longer holds a cancelled
worker for the whole connect timeout.

Name resolution (``getaddrinfo``) stays outside: the C resolver cannot be
interrupted. It runs before the connect and is bounded only by the system's
resolver settings; see docs/cancellation-limits.md.

Used by the thread that opens the connection (``SocketHold.connect_tcp``).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import time
from collections.abc import Iterable
from typing import Any

__all__ = ["CONNECT_CUT", "connect_tcp"]

#: The errno of the ``OSError`` raised when the wakeup ended the connect.
CONNECT_CUT = errno.ECANCELED
#: The longest single ``poll()`` (its timeout is a C int of milliseconds).
_POLL_MAX_MS = 2**31 - 1


def connect_tcp(
    host: str,
    port: int,
    *,
    timeout: float | None,
    wakeup: socket.socket | None,
    source_address: tuple[str, int] | None = None,
    socket_options: Iterable[Any] | None = None,
    nodelay: bool = True,
) -> socket.socket:
    """Connect to ``host:port`` like ``socket.create_connection``; return a blocking socket.

    Each address ``getaddrinfo`` gives is tried in turn, each with the whole
    ``timeout`` (as ``create_connection`` does). ``socket_options`` are set
    before the connect. Raises ``TimeoutError`` on a timeout, ``OSError`` for
    a refused or failed connect (the last address's error), and
    ``OSError(CONNECT_CUT)`` as soon as ``wakeup`` becomes readable.

    Cancellation: ends at once, with ``OSError(CONNECT_CUT)``, when the
    wakeup is shut down or written to, whichever address it was trying; the
    half-open socket is closed here. Name resolution is not cut.
    """
    if host.startswith("["):
        host = host.strip("[]")
    addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, kind, proto, _, address in addresses:
        if wakeup is not None and _readable(wakeup):
            # Cut during the resolution or a failed attempt: send no SYN.
            raise OSError(CONNECT_CUT, "the connect was cut")
        sock = socket.socket(family, kind, proto)
        try:
            for option in socket_options or ():
                sock.setsockopt(*option)
            if source_address is not None:
                sock.bind(source_address)
            _connect(sock, address, timeout, wakeup)
            sock.setblocking(True)
            if nodelay and family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            sock.close()
            if exc.errno == CONNECT_CUT:
                raise
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise error or OSError(f"getaddrinfo found no address for {host!r}")


def _readable(sock: socket.socket) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _connect(
    sock: socket.socket, address: Any, timeout: float | None, wakeup: socket.socket | None
) -> None:
    sock.setblocking(False)
    code = sock.connect_ex(address)
    if code == 0:
        return
    if code not in (errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
        raise OSError(code, os.strerror(code))
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    if wakeup is not None:
        poller.register(wakeup, select.POLLIN)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        # poll() takes milliseconds; round up so that a tiny timeout still waits.
        ms = None if remaining is None else min(int(remaining * 1000) + 1, _POLL_MAX_MS)
        events = poller.poll(ms)
        if wakeup is not None and any(fd == wakeup.fileno() for fd, _ in events):
            raise OSError(CONNECT_CUT, "the connect was cut")
        if events:
            break
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError("timed out")
    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if code != 0:
        raise OSError(code, os.strerror(code))
