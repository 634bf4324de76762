"""AsyncH1Client: HTTP/1.1 on the event loop, through real sockets, threads and cuts.

The server side is the simulator's ``LoopbackServer`` (raw sockets, a thread
per connection, its own record of the requests and of each peer close): what
the server saw is read from it, never assumed. Waits are bounded and wake on
the event.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest

from _loopback import Exchange, FullBacklog, LoopbackServer
from _promises import assert_quiet
from wirecut.http import AsyncH1Client
from wirecut.scope import Interrupted, InterruptScope

BOUND = 5.0
T = TypeVar("T")


def run(main: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(BOUND * 2):
            return await main()

    return asyncio.run(bounded())


def ok(ex: Exchange) -> None:
    ex.json({"path": ex.request.path})


def stream_then_hold(ex: Exchange) -> None:
    ex.start_chunked()
    ex.chunk(b"hello")
    ex.hold()


async def body_of(client: AsyncH1Client, target: str, **kwargs: Any) -> bytes:
    response = await client.send("GET", target, **kwargs)
    try:
        parts = []
        while data := await response.receive():
            parts.append(data)
        return b"".join(parts)
    finally:
        response.close()


def test_requests_in_sequence_share_one_keep_alive_connection() -> None:
    async def main() -> list[bytes]:
        client = AsyncH1Client(server.url)
        try:
            return [await body_of(client, f"/{n}") for n in range(3)]
        finally:
            client.close()

    with LoopbackServer(ok) as server:
        bodies = run(main)
        assert server.connections == 1
    assert bodies == [b'{"path": "/0"}', b'{"path": "/1"}', b'{"path": "/2"}']


def test_a_post_sends_its_body_with_its_length() -> None:
    async def main() -> int:
        client = AsyncH1Client(server.url)
        try:
            response = await client.send(
                "POST", "/p", [("Content-Type", "application/json")], b'{"a": 1}'
            )
            response.close()
            return response.status_code
        finally:
            client.close()

    with LoopbackServer(ok) as server:
        status = run(main)
    assert status == 200
    (request,) = server.requests
    assert request.json() == {"a": 1}
    assert request.headers["content-length"] == "8"
    assert request.headers["host"] == f"127.0.0.1:{server.port}"


def test_a_scope_cut_from_another_thread_ends_a_read_and_the_server_sees_the_close() -> None:
    scope = InterruptScope("t")

    async def main() -> None:
        client = AsyncH1Client(server.url)
        try:
            response = await client.send("GET", "/", scope=scope)
            assert await response.receive() == b"hello"
            assert scope.live()["sockets"] == 1
            threading.Thread(target=scope.cancel, args=("user",)).start()
            with pytest.raises(Interrupted, match="user"):
                await response.receive()
            response.close()
        finally:
            client.close()

    with LoopbackServer(stream_then_hold) as server:
        run(main)
        assert server.wait_closes(1, BOUND)
        assert len(server.requests) == 1
    assert_quiet(scope)
    assert "sockets_shut" in [str(event) for event, _ in scope.timeline]


def test_a_cancelled_task_closes_its_connection_and_the_server_sees_it() -> None:
    async def main() -> None:
        client = AsyncH1Client(server.url)
        try:
            response = await client.send("GET", "/")
            assert await response.receive() == b"hello"
            reader = asyncio.create_task(response.receive())
            await asyncio.sleep(0)  # the reader waits for the next bytes now
            reader.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reader
            response.close()
            assert client.idle == 0  # Not reused: its response did not end.
        finally:
            client.close()

    with LoopbackServer(stream_then_hold) as server:
        run(main)
        assert server.wait_closes(1, BOUND)


def test_a_cut_reaches_a_connect_that_would_wait_for_its_timeout() -> None:
    scope = InterruptScope("t")

    async def main() -> None:
        client = AsyncH1Client(f"http://127.0.0.1:{backlog.port}", connect_timeout=60)
        try:
            asyncio.get_running_loop().call_later(0.05, scope.cancel, "user")
            with pytest.raises(Interrupted):
                await client.send("GET", "/", scope=scope)
        finally:
            client.close()

    with FullBacklog() as backlog:
        run(main)  # Bounded by BOUND * 2, far below the 60 s connect timeout.
    assert_quiet(scope)


def test_a_cancelled_scope_refuses_to_start() -> None:
    scope = InterruptScope("t")
    scope.cancel("early")

    async def main() -> None:
        client = AsyncH1Client(server.url)
        try:
            with pytest.raises(Interrupted, match="early"):
                await client.send("GET", "/", scope=scope)
        finally:
            client.close()

    with LoopbackServer(ok) as server:
        run(main)
        assert server.connections == 0


def test_a_response_let_go_before_its_end_is_not_reused() -> None:
    async def main() -> None:
        client = AsyncH1Client(server.url)
        try:
            response = await client.send("GET", "/")
            assert await response.receive() == b"hello"
            response.close()
            assert client.idle == 0
        finally:
            client.close()

    with LoopbackServer(stream_then_hold) as server:
        run(main)
        assert server.wait_closes(1, BOUND)


def test_a_pooled_connection_the_server_closed_is_replaced_once() -> None:
    # A server that answers keep-alive and then closes: the client's pooled
    # connection is dead when the next request takes it.
    closed = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        for n in range(2):
            conn, _ = listener.accept()
            with conn:
                while b"\r\n\r\n" not in conn.recv(65536):
                    pass
                body = str(n).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n" + body)
            closed.set()

    async def main() -> list[bytes]:
        client = AsyncH1Client(f"http://127.0.0.1:{port}")
        try:
            first = await body_of(client, "/")
            assert await asyncio.to_thread(closed.wait, BOUND)
            return [first, await body_of(client, "/")]
        finally:
            client.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    with listener:
        bodies = run(main)
        server.join(BOUND)
    assert bodies == [b"0", b"1"]


def test_a_response_head_past_the_bound_is_a_protocol_error() -> None:
    def huge_head(ex: Exchange) -> None:
        ex.send(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 10_000 + b"\r\n\r\n")

    async def main() -> None:
        client = AsyncH1Client(server.url, max_head_bytes=4096)
        try:
            with pytest.raises(httpx.RemoteProtocolError, match="head exceeds 4096"):
                await client.send("GET", "/")
        finally:
            client.close()

    with LoopbackServer(huge_head) as server:
        run(main)


def test_a_refused_connect_is_a_connect_error() -> None:
    with LoopbackServer(ok) as server:
        port = server.port

    async def main() -> None:
        client = AsyncH1Client(f"http://127.0.0.1:{port}")
        try:
            with pytest.raises(httpx.ConnectError):
                await client.send("GET", "/")
        finally:
            client.close()

    run(main)


def test_an_idle_connection_is_closed_after_its_expiry() -> None:
    async def main() -> None:
        client = AsyncH1Client(server.url, keepalive_expiry=0.05)
        try:
            await body_of(client, "/")
            assert client.idle == 1
            await asyncio.to_thread(server.wait_closes, 1, BOUND)
            assert client.idle == 0
        finally:
            client.close()

    with LoopbackServer(ok) as server:
        run(main)
        assert server.closes == [0]


@pytest.mark.parametrize("target", ["/a b", "/a\r\nX: 1", "no-slash"])
def test_a_target_that_would_break_the_request_line_is_refused(target: str) -> None:
    async def main() -> None:
        client = AsyncH1Client(server.url)
        try:
            with pytest.raises(ValueError, match="target"):
                await client.send("GET", target)
        finally:
            client.close()

    with LoopbackServer(ok) as server:
        run(main)
        assert server.connections == 0
