"""What every scoped HTTP client promises, checked the same way for each.

``test_h1.py`` (``H1Transport``), ``test_http.py`` (``wirecut.http.client``)
and ``test_adapters.py`` (``requests``) name their own tests and call these
with their client: the socket accounting and the cut through real sockets
must hold for each alike.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

import httpx
import pytest

from _loopback import Exchange, LoopbackServer
from _promises import assert_cut_reached_the_server, assert_quiet
from _support import BOUND
from wirecut.scope import Interrupted, InterruptScope, bind_scope


def ok(ex: Exchange) -> None:
    ex.json({"path": ex.request.path})


def hold(ex: Exchange) -> None:
    ex.hold()


def stream_then_stall(ex: Exchange) -> None:
    ex.start_chunked()
    ex.chunk(b"hello")
    ex.hold()


def assert_an_idle_connection_is_not_counted_and_is_reused(client: httpx.Client) -> None:
    scope = InterruptScope("t")
    with LoopbackServer(ok) as server, bind_scope(scope):
        client.get(f"{server.url}/1")
        assert scope.live()["sockets"] == 0
        client.get(f"{server.url}/2")
        assert server.connections == 1
        assert scope.live()["sockets"] == 0


def assert_a_cut_in_the_header_wait_reaches_the_server(client: httpx.Client) -> None:
    scope = InterruptScope("t")
    with LoopbackServer(hold) as server:
        future = scope.spawn(client.get, f"{server.url}/slow")
        assert server.wait_requests(1)
        assert scope.live()["sockets"] == 1
        scope.cancel("stop")
        with pytest.raises(Interrupted) as info:
            future.result(BOUND)
        assert info.value.reason == "stop"
        assert_cut_reached_the_server(server, scope)


def assert_a_cut_in_a_stream_wakes_the_reader(client: httpx.Client) -> None:
    scope = InterruptScope("t")
    first = threading.Event()
    received: list[bytes] = []

    def worker() -> None:
        with client.stream("GET", f"{server.url}/s") as response:
            for chunk in response.iter_raw():
                received.append(chunk)
                first.set()

    with LoopbackServer(stream_then_stall) as server:
        future = scope.spawn(worker)
        assert first.wait(BOUND)
        scope.cancel("stop")
        with pytest.raises(Interrupted):
            future.result(BOUND)
        assert received == [b"hello"]
        assert_cut_reached_the_server(server, scope)


def assert_the_socket_stays_registered_between_chunks(client: httpx.Client) -> None:
    """Counted from the head to the body's end, between chunks too; released at the end."""
    scope = InterruptScope("t")
    between = threading.Event()
    go_on = threading.Event()
    seen: list[int] = []

    def two_chunks(ex: Exchange) -> None:
        ex.start_chunked()
        ex.chunk(b"one")
        go_on.wait(BOUND)
        ex.chunk(b"two")
        ex.end_chunked()

    def worker() -> bytes:
        parts = []
        with client.stream("GET", f"{server.url}/s") as response:
            for chunk in response.iter_raw():
                parts.append(chunk)
                seen.append(scope.live()["sockets"])
                between.set()
        seen.append(scope.live()["sockets"])
        return b"".join(parts)

    with LoopbackServer(two_chunks) as server:
        future = scope.spawn(worker)
        assert between.wait(BOUND)
        assert scope.live()["sockets"] == 1  # Headers and a chunk in, the body not done.
        go_on.set()
        assert future.result(BOUND) == b"onetwo"
        assert seen == [1, 1, 0]


def assert_a_cancelled_scopes_idle_connection_is_closed_without_gc(
    get: Callable[[str], object], handler: Callable[[Exchange], None]
) -> None:
    """``get(url)`` leaves its connection idle in the scope's pool; the cancel closes it."""
    scope = InterruptScope("t")
    requested = threading.Event()

    def worker() -> None:
        get(f"{server.url}/1")  # Done: its connection idles in the scope's pool.
        requested.set()
        scope.wait(threading.Event())  # Then blocked elsewhere until the cancel.

    gc.disable()  # Only the close wirecut makes may count, not a collection.
    try:
        with LoopbackServer(handler) as server:
            future = scope.spawn(worker)
            assert requested.wait(BOUND)
            assert server.closes == []
            scope.cancel("stop")
            with pytest.raises(Interrupted):
                future.result(BOUND)
            assert server.wait_closes(1)
            assert_quiet(scope)
    finally:
        gc.enable()
