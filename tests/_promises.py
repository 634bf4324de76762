"""The checks behind wirecut's promise, shared by the HTTP-level test files."""

from __future__ import annotations

from _loopback import LoopbackServer
from wirecut.scope import InterruptScope


def assert_quiet(scope: InterruptScope) -> None:
    """Nothing the scope owned is left: no thread, socket, process or object."""
    assert scope.wait_quiescent(2), scope.live()
    assert scope.live() == {"threads": 0, "sockets": 0, "processes": 0, "objects": 0}


def assert_cut_reached_the_server(server: LoopbackServer, scope: InterruptScope) -> None:
    """The server saw the one request close, no request came after it, and the scope drained."""
    assert server.wait_closes(1)
    assert len(server.requests) == 1
    assert_quiet(scope)
