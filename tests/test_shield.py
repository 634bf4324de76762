"""The commit section is a shield: a cancel waits for the end of the thread's COMMIT.

Through a real loopback socket: a worker registers its connection, sends a
COMMIT, and the server acknowledges only once the test has cancelled the
scope. With the shield the acknowledgement arrives and the scope is
``committed``; the cut comes when the section ends, and the cancel reaches
the worker at its next cooperative point.
"""

from __future__ import annotations

import socket
import threading

import pytest

from _acker import SlowAcker
from _support import BOUND
from wirecut.scope import Interrupted, InterruptScope, MockClock


def commit_over(sock: socket.socket) -> bytes:
    sock.sendall(b"COMMIT\n")
    return sock.recv(16)


def test_a_cancel_during_a_commit_leaves_its_socket_alone_until_the_section_ends(
    acker: SlowAcker,
) -> None:
    scope = InterruptScope("command")
    seen: dict[str, object] = {}
    section_over = threading.Event()
    go_on = threading.Event()

    def work() -> None:
        with socket.create_connection(acker.address) as sock:
            with scope.register_socket(sock):  # registered before the section
                with scope.committing("write"):
                    seen["ack"] = commit_over(sock)
                    seen["check_inside"] = _raises(scope.check)
                section_over.set()
                go_on.wait(BOUND)
                seen["check_after"] = _raises(scope.check)
                seen["read_after"] = sock.recv(16)  # shut at the section's end: EOF

    future = scope.spawn(work)
    assert acker.got_commit.wait(BOUND)
    assert scope.commit_open
    scope.cancel("user")
    assert not acker.peer_closed.is_set()  # the COMMIT's socket was not shut
    acker.ack.set()
    assert section_over.wait(BOUND)
    assert acker.peer_closed.wait(BOUND)  # the kept cut came with the section's end
    go_on.set()
    future.result(BOUND)
    assert seen == {
        "ack": b"OK\n",
        "check_inside": False,
        "check_after": True,
        "read_after": b"",
    }
    assert scope.committed
    assert scope.commits == ("write",)
    assert not scope.commit_open
    assert scope.wait_quiescent(BOUND)
    events = [event for event, _ in scope.timeline]
    assert events == ["cancel_requested", "sockets_shut"]


def _raises(fn: object) -> bool:
    try:
        fn()  # type: ignore[operator]
    except Interrupted:
        return True
    return False


def test_nested_sections_keep_the_cut_until_the_outermost_ends(acker: SlowAcker) -> None:
    scope = InterruptScope()
    inner_over = threading.Event()
    outer_may_end = threading.Event()
    seen: list[object] = []

    def work() -> None:
        with socket.create_connection(acker.address) as sock, scope.register_socket(sock):
            with scope.committing("outer"):
                with scope.committing("inner"):
                    seen.append(commit_over(sock))
                inner_over.set()
                outer_may_end.wait(BOUND)
                seen.append(acker.peer_closed.is_set())  # still open between the two ends
            seen.append(acker.peer_closed.wait(BOUND))

    future = scope.spawn(work)
    assert acker.got_commit.wait(BOUND)
    scope.cancel("user")
    acker.ack.set()
    assert inner_over.wait(BOUND)
    outer_may_end.set()
    future.result(BOUND)
    assert seen == [b"OK\n", False, True]
    assert scope.commits == ("inner", "outer")


def test_sleep_and_wait_inside_a_section_do_not_raise_on_a_cancel() -> None:
    scope = InterruptScope()
    inside = threading.Event()
    cancelled = threading.Event()
    woke = threading.Event()
    seen: list[object] = []

    def work() -> None:
        with scope.committing():
            inside.set()
            assert cancelled.wait(BOUND)
            seen.append(scope.wait(woke, BOUND))  # set by the test after the cancel
            scope.sleep(0)
            seen.append(scope.cancelled_here)
        seen.append(scope.cancelled_here)
        scope.sleep(3600)  # outside: the cancel ends it at once

    future = scope.spawn(work)
    assert inside.wait(BOUND)
    scope.cancel("user")
    cancelled.set()
    woke.set()
    with pytest.raises(Interrupted):
        future.result(BOUND)
    assert seen == [True, False, True]


def test_what_a_section_registers_on_a_cancelled_scope_is_cut_at_its_end() -> None:
    scope = InterruptScope()
    a, b = socket.socketpair()
    with a, b:
        inside = threading.Event()
        cancelled = threading.Event()
        registered = threading.Event()
        leave = threading.Event()

        def work() -> None:
            with scope.committing():
                inside.set()
                assert cancelled.wait(BOUND)
                with scope.register_socket(a):  # no Interrupted, no cut on entry
                    registered.set()
                    leave.wait(BOUND)
                    a.sendall(b"still open")

        future = scope.spawn(work)
        assert inside.wait(BOUND)
        scope.cancel("user")
        cancelled.set()
        assert registered.wait(BOUND)
        leave.set()
        future.result(BOUND)
        assert b.recv(64) == b"still open"


def test_a_cancel_during_one_threads_commit_still_cuts_the_other_threads() -> None:
    scope = InterruptScope()
    inside = threading.Event()
    release = threading.Event()
    a, b = socket.socketpair()
    with a, b:

        def committer() -> None:
            with scope.committing():
                inside.set()
                release.wait(BOUND)

        reading_now = threading.Event()

        def reader() -> bytes:
            with scope.register_socket(a):
                reading_now.set()
                return a.recv(16)

        committing = scope.spawn(committer)
        reading = scope.spawn(reader)
        assert inside.wait(BOUND)
        assert reading_now.wait(BOUND)
        scope.cancel("user")
        assert reading.result(BOUND) == b""  # shut down while the other thread commits
        assert not committing.done()
        release.set()
        committing.result(BOUND)


def test_a_section_that_fails_names_no_commit_and_closes() -> None:
    scope = InterruptScope()
    open_inside: list[bool] = []

    def fail() -> None:
        with scope.committing("write"):
            open_inside.append(scope.commit_open)
            raise ValueError("disk full")

    with pytest.raises(ValueError, match="disk full"):
        fail()
    assert open_inside == [True]
    assert (scope.committed, scope.commits, scope.commit_open) == (False, (), False)


def test_a_childs_commit_is_its_parents_too() -> None:
    parent = InterruptScope(clock=MockClock())
    child = parent.child()
    with child.committing("step 1"):
        assert parent.commit_open
    assert parent.commits == ("step 1",)
    assert not parent.commit_open
