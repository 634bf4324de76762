"""wirecut.simulator's loopback servers: their record and their stop, on real sockets and threads.

The servers are the far end of the wire for ``probe`` and for the tests of
the client side, so what they record must be what happened: a close is the
peer's only if the peer made it, a request is open while a handler is on it,
and ``stop()`` ends every thread it can and names the ones it cannot.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from _loopback import self_signed
from _support import BOUND
from wirecut.loopback import LoopbackExchange, LoopbackServer

REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
# The read and recvfrom system calls (OpenSSL reads a socket with read()).
_READS = {"x86_64": {"0", "45"}, "aarch64": {"63", "207"}}


def hold(ex: LoopbackExchange) -> None:
    ex.hold(timeout=None)


def thread_named(name: str) -> threading.Thread:
    found = [t for t in threading.enumerate() if t.name == name]
    assert len(found) == 1, [t.name for t in threading.enumerate()]
    return found[0]


def wait_until_reading(thread: threading.Thread) -> None:
    """Wait (bounded) until ``thread`` is blocked reading a socket (Linux).

    No event says "now blocked in the kernel"; the kernel's own record of the
    thread's current system call does.
    """
    numbers = _READS.get(os.uname().machine)
    path = Path(f"/proc/self/task/{thread.native_id}/syscall")
    if numbers is None or not path.exists():
        pytest.skip("cannot see a thread's system call here")
    deadline = time.monotonic() + BOUND
    pause = threading.Event()
    while path.read_text().split()[0] not in numbers:
        assert time.monotonic() < deadline, f"{thread.name} never blocked reading"
        pause.wait(0.001)


def test_a_peer_close_is_recorded_and_a_close_by_stop_is_not() -> None:
    server = LoopbackServer(hold)
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=BOUND) as a,
        socket.create_connection(("127.0.0.1", server.port), timeout=BOUND) as b,
    ):
        a.sendall(REQUEST)
        assert server.wait_requests(1)
        b.sendall(REQUEST)
        assert server.wait_for(lambda: server.open_requests == 2)
        a_conn, b_conn = (r.connection for r in server.requests)

        a.close()
        assert server.wait_closed(a_conn)
        assert server.closes == [a_conn]

        assert server.stop() == []
        assert b.recv(1) == b""  # The stop's shutdown reached b's end...
        assert server.closes == [a_conn]  # ...and is not recorded as b's close.
    assert b_conn not in server.close_times
    assert server.open_requests == 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=BOUND).close()


def test_open_requests_counts_the_requests_a_handler_is_still_on() -> None:
    release = threading.Event()

    def handler(ex: LoopbackExchange) -> None:
        if ex.request.path == "/slow":
            release.wait(BOUND)
        ex.json({"path": ex.request.path})

    with (
        LoopbackServer(handler) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=BOUND) as slow,
        socket.create_connection(("127.0.0.1", server.port), timeout=BOUND) as fast,
    ):
        slow.sendall(b"GET /slow HTTP/1.1\r\n\r\n")
        assert server.wait_for(lambda: server.open_requests == 1)
        fast.sendall(b"GET /fast HTTP/1.1\r\n\r\n")
        assert b'"/fast"' in fast.recv(65536)
        assert server.wait_requests(2)
        assert server.wait_for(lambda: server.open_requests == 1)  # still on /slow
        release.set()
        assert b'"/slow"' in slow.recv(65536)
        assert server.wait_for(lambda: server.open_requests == 0)


def test_stop_names_a_thread_still_running_after_its_bound() -> None:
    never = threading.Event()

    def stubborn(ex: LoopbackExchange) -> None:
        never.wait(BOUND * 4)  # Deaf to the stop's shutdown: it reads nothing.

    server = LoopbackServer(stubborn, name="stubborn")
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=BOUND) as conn:
            conn.sendall(REQUEST)
            assert server.wait_for(lambda: server.open_requests == 1)
            assert server.stop(bound=0.2) == ["stubborn-conn0"]
    finally:
        never.set()
    assert server.stop() == []


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads a thread's system call")
def test_stop_wakes_a_connection_blocked_in_its_tls_handshake(tmp_path: Path) -> None:
    made = self_signed(tmp_path)
    if made is None:
        pytest.skip("no openssl command")
    server = LoopbackServer(hold, ssl_context=made[0], name="tls")
    # A client that connects and never sends its ClientHello: the server's
    # connection thread waits in the handshake's recv.
    with socket.create_connection(("127.0.0.1", server.port), timeout=BOUND) as silent:
        assert server.wait_for(lambda: server.connections == 1)
        wait_until_reading(thread_named("tls-conn0"))
        assert server.stop() == []
        assert silent.recv(1) == b""
    assert server.closes == []
