"""Facts of the platform (Linux, CPython) that wirecut's design stands on.

These tests check the operating system and Python, not wirecut: no change to
wirecut can make them fail, and none of them imports it. They are here so
that a platform on which a fact does not hold says so plainly, instead of
showing up as a mysterious failure of the scope's own tests. Each names the
fact of docs/architecture.md it measures, and what in wirecut relies on it.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import select
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from _support import BOUND

_RECVFROM = {"x86_64": 45, "aarch64": 207}


def join(thread: threading.Thread) -> None:
    thread.join(BOUND)
    assert not thread.is_alive(), f"{thread.name} did not end within {BOUND} s"


def _wait_until_in_recvfrom(thread: threading.Thread) -> None:
    """Wait (bounded) until ``thread`` is blocked in the recvfrom system call.

    No event says "now blocked in the kernel"; the kernel's own record of the
    thread's current system call does.
    """
    number = _RECVFROM.get(os.uname().machine)
    if number is None:
        pytest.skip("recvfrom's system call number is unknown on this machine")
    path = Path(f"/proc/self/task/{thread.native_id}/syscall")
    deadline = time.monotonic() + BOUND
    pause = threading.Event()
    while path.read_text().split()[0] != str(number):
        assert time.monotonic() < deadline, "the reader never blocked in recv"
        pause.wait(0.001)


def _blocked_reader(sock: socket.socket) -> tuple[threading.Thread, threading.Event, list[bytes]]:
    returned = threading.Event()
    got: list[bytes] = []

    def reader() -> None:
        with contextlib.suppress(OSError):
            got.append(sock.recv(100))
        returned.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    _wait_until_in_recvfrom(thread)
    return thread, returned, got


def test_close_from_another_thread_does_not_wake_recv() -> None:
    # Fact 1: the reason a cut is shutdown(), never close().
    a, b = socket.socketpair()
    thread, returned, _ = _blocked_reader(a)
    a.close()
    assert not returned.wait(0.2)  # the reader sleeps on
    b.settimeout(0.2)
    with pytest.raises(TimeoutError):
        b.recv(1)  # and the peer saw no close
    b.close()  # only the peer leaving wakes the reader now
    assert returned.wait(BOUND)
    join(thread)


def test_shutdown_from_another_thread_wakes_recv_and_the_peer_sees_eof() -> None:
    # Fact 1, the other half: what cut_socket() does.
    a, b = socket.socketpair()
    with a, b:
        thread, returned, got = _blocked_reader(a)
        a.shutdown(socket.SHUT_RDWR)
        assert returned.wait(BOUND)
        assert got == [b""]
        b.settimeout(BOUND)
        assert b.recv(1) == b""
        join(thread)


def test_a_detached_socket_has_no_fd_and_cannot_be_shut_down() -> None:
    # What a TLS wrap leaves of the plain socket (fact 7); cut_socket() says
    # False for it, and the timeline then says nothing was shut.
    a, b = socket.socketpair()
    with b, socket.socket(fileno=a.detach()) as owner:
        assert a.fileno() == -1
        with pytest.raises(OSError, match="Bad file descriptor"):
            a.shutdown(socket.SHUT_RDWR)
        owner.sendall(b"x")  # the connection itself is untouched
        assert b.recv(1) == b"x"


def test_a_context_var_does_not_cross_into_a_plain_thread() -> None:
    # Fact 5: the reason scope.spawn(), scope.run() and the executor exist.
    var: contextvars.ContextVar[str | None] = contextvars.ContextVar("fact", default=None)
    seen: list[str | None] = []
    token = var.set("bound here")
    try:
        thread = threading.Thread(target=lambda: seen.append(var.get()))
        thread.start()
        join(thread)
    finally:
        var.reset(token)
    assert seen == [None]


def test_a_threading_event_keeps_a_condition_in_cond() -> None:
    # scope.wait() waits on the event's own condition, so that a cancel can
    # wake it without setting the event (it fails loudly where this is false).
    assert isinstance(threading.Event()._cond, threading.Condition)  # type: ignore[attr-defined]


def test_a_wait_longer_than_timeout_max_overflows() -> None:
    # Why an infinite or huge scope timeout must mean "no timeout" rather
    # than be passed on to a wait.
    with pytest.raises(OverflowError):
        threading.Event().wait(threading.TIMEOUT_MAX * 2)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd on this platform")
def test_a_killed_process_stays_a_zombie_until_reaped_and_its_pidfd_is_readable() -> None:
    # Fact 8: a zombie has exited (count it as dead) and a pidfd says so
    # without polling; the kill waits on one.
    proc = subprocess.Popen(["sleep", "300"])
    with proc:
        fd = os.pidfd_open(proc.pid)
        try:
            assert select.select([fd], [], [], 0)[0] == []  # running: not readable
            os.kill(proc.pid, signal.SIGKILL)
            assert select.select([fd], [], [], BOUND)[0] == [fd]
            stat = Path(f"/proc/{proc.pid}/stat").read_text()
            assert stat[stat.rindex(")") + 2] == "Z"  # exited, not yet reaped
        finally:
            os.close(fd)
        assert proc.wait(BOUND) == -signal.SIGKILL
