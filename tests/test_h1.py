"""H1Transport: the provider's HTTP/1.1 streams, through real sockets, threads and cuts."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from _loopback import (
    Exchange,
    FullBacklog,
    LoopbackServer,
    StallServer,
    connect_started,
)
from _promises import assert_cut_reached_the_server, assert_quiet
from _scoped_client import (
    assert_a_cut_in_a_stream_wakes_the_reader,
    assert_a_cut_in_the_header_wait_reaches_the_server,
    assert_an_idle_connection_is_not_counted_and_is_reused,
    assert_the_socket_stays_registered_between_chunks,
    hold,
    ok,
    stream_then_stall,
)
from _support import BOUND
from wirecut.http import H1Transport, _h1
from wirecut.scope import Interrupted, InterruptScope, bind_scope

LONG = 60.0  # a timeout no test may reach: only a cut ends the wait within BOUND


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(transport=H1Transport(), timeout=30) as c:
        yield c


def test_without_a_scope_it_is_a_keep_alive_client(client: httpx.Client) -> None:
    with LoopbackServer(ok) as server:
        assert client.get(f"{server.url}/one").json() == {"path": "/one"}
        assert client.post(f"{server.url}/two", json={"a": 1}).json() == {"path": "/two"}
        assert server.connections == 1
    assert server.requests[1].json() == {"a": 1}


def test_an_idle_connection_is_not_counted_and_is_reused_in_its_scope(client: httpx.Client) -> None:
    assert_an_idle_connection_is_not_counted_and_is_reused(client)


def test_two_scopes_never_share_a_connection(client: httpx.Client) -> None:
    a, b = InterruptScope("a"), InterruptScope("b")
    with LoopbackServer(ok) as server:
        with bind_scope(a):
            client.get(f"{server.url}/a")
        with bind_scope(b):
            client.get(f"{server.url}/b")
        assert server.connections == 2
        a.cancel("done")
        assert server.wait_closed(server.requests[0].connection)  # a's idle one went with a


def test_a_cut_during_the_header_wait_wakes_the_worker_and_the_server_sees_it(
    client: httpx.Client,
) -> None:
    assert_a_cut_in_the_header_wait_reaches_the_server(client)


def test_a_cut_during_a_stream_wakes_the_reader_and_the_server_sees_it(
    client: httpx.Client,
) -> None:
    assert_a_cut_in_a_stream_wakes_the_reader(client)


def test_the_socket_stays_registered_between_chunks_and_is_released_at_the_end(
    client: httpx.Client,
) -> None:
    assert_the_socket_stays_registered_between_chunks(client)


def test_a_body_closed_before_its_end_closes_the_connection(client: httpx.Client) -> None:
    with LoopbackServer(stream_then_stall) as server:
        with client.stream("GET", f"{server.url}/s") as response:
            assert next(response.iter_raw()) == b"hello"
        assert server.wait_closes(1)  # the server stops sending to nobody


def test_a_request_under_a_cancelled_scope_opens_no_connection(client: httpx.Client) -> None:
    scope = InterruptScope("t")
    scope.cancel("early")
    with LoopbackServer(ok) as server:
        with bind_scope(scope), pytest.raises(Interrupted) as info:
            client.get(f"{server.url}/x")
        assert info.value.reason == "early"
        client.get(f"{server.url}/after")
        assert [r.path for r in server.requests] == ["/after"]
    assert_quiet(scope)


def test_a_pooled_connection_the_server_closed_is_replaced(client: httpx.Client) -> None:
    def once(ex: Exchange) -> None:
        ok(ex)
        ex.close()  # no "Connection: close": the client learns it from the socket

    with LoopbackServer(once) as server:
        client.get(f"{server.url}/1")
        assert server.wait_for(lambda: server.connections == 1)
        assert client.get(f"{server.url}/2").json() == {"path": "/2"}
        assert server.connections == 2


def test_a_stalled_tls_handshake_is_cut() -> None:
    scope = InterruptScope("t")
    transport = H1Transport(connect_timeout=LONG)
    with StallServer() as server, httpx.Client(transport=transport, timeout=None) as client:
        future = scope.spawn(client.get, server.url)
        assert server.hello.wait(BOUND)
        assert scope.live()["sockets"] == 1
        scope.cancel("stop")
        with pytest.raises(Interrupted):
            future.result(BOUND)
        assert server.closed.wait(BOUND)
        assert_quiet(scope)


def test_a_connect_to_a_full_backlog_is_cut() -> None:
    scope = InterruptScope("t")
    with FullBacklog() as backlog:
        if not backlog.blocked:
            pytest.skip("could not make a loopback connect block here")
        started = connect_started(backlog.port)
        transport = H1Transport(connect_timeout=LONG)
        with httpx.Client(transport=transport, timeout=LONG) as client:
            future = scope.spawn(client.get, backlog.url)
            assert started.wait(BOUND)
            scope.cancel("stop")
            with pytest.raises(Interrupted):
                future.result(BOUND)
    assert_quiet(scope)


def test_over_tls_it_answers_and_a_cut_reaches_the_server(
    tls: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server_ctx, client_ctx = tls
    scope = InterruptScope("t")

    def handler(ex: Exchange) -> None:
        if ex.request.path == "/slow":
            ex.hold()
        else:
            ok(ex)

    with (
        LoopbackServer(handler, ssl_context=server_ctx) as server,
        httpx.Client(transport=H1Transport(verify=client_ctx), timeout=30) as client,
    ):
        assert client.get(f"{server.url}/fast").json() == {"path": "/fast"}
        future = scope.spawn(client.get, f"{server.url}/slow")
        assert server.wait_requests(2)
        scope.cancel("stop")
        with pytest.raises(Interrupted):
            future.result(BOUND)
        assert server.wait_closes(1)
        assert_quiet(scope)


def test_a_server_that_closes_mid_body_is_a_protocol_error(client: httpx.Client) -> None:
    def broken(ex: Exchange) -> None:
        ex.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
        ex.close()

    with LoopbackServer(broken) as server, pytest.raises(httpx.RemoteProtocolError):
        client.get(f"{server.url}/x")


def test_a_read_timeout_is_httpxs(client: httpx.Client) -> None:
    with LoopbackServer(hold) as server, pytest.raises(httpx.ReadTimeout):
        client.get(f"{server.url}/slow", timeout=httpx.Timeout(5, read=0.2))


def test_the_trace_extension_says_when_the_request_went_out(client: httpx.Client) -> None:
    events: list[str] = []

    def trace(event: str, info: dict[str, Any]) -> None:
        events.append(event)

    with LoopbackServer(ok) as server:
        client.get(f"{server.url}/x", extensions={"trace": trace})
    assert events[0] == "http11.send_request_headers.started"
    assert events[-1] == "http11.receive_response_headers.complete"


def test_a_reused_connection_is_registered_again_and_cut(client: httpx.Client) -> None:
    scope = InterruptScope("t")

    def handler(ex: Exchange) -> None:
        if ex.request.path == "/slow":
            ex.hold()
        else:
            ok(ex)

    with LoopbackServer(handler) as server:
        with bind_scope(scope):
            client.get(f"{server.url}/fast")  # leaves an idle connection in the scope's pool
        future = scope.spawn(client.get, f"{server.url}/slow")
        assert server.wait_requests(2)
        assert server.connections == 1  # the same connection
        assert scope.live()["sockets"] == 1
        scope.cancel("stop")
        with pytest.raises(Interrupted):
            future.result(BOUND)
        assert server.wait_closes(1)
        assert_quiet(scope)


def test_a_paced_body_takes_what_came_during_the_pause_in_one_read() -> None:
    got_first = threading.Event()

    def burst(ex: Exchange) -> None:
        ex.start_chunked()
        ex.chunk(b"a")
        got_first.wait(BOUND)
        for part in (b"b", b"c", b"d"):
            ex.chunk(part)
        ex.end_chunked()

    transport = H1Transport(read_interval=1.0)
    with LoopbackServer(burst) as server, httpx.Client(transport=transport, timeout=30) as c:
        with c.stream("GET", f"{server.url}/s") as response:
            chunks = []
            for chunk in response.iter_raw():
                chunks.append(chunk)
                got_first.set()
    assert chunks == [b"a", b"bcd"]


def test_a_cut_during_a_paced_read_is_interrupted_and_reaches_the_server() -> None:
    scope = InterruptScope("t")
    first = threading.Event()

    def worker(client: httpx.Client) -> None:
        with client.stream("GET", f"{server.url}/s") as response:
            for _ in response.iter_raw():
                first.set()

    transport = H1Transport(read_interval=1.0)
    with (
        LoopbackServer(stream_then_stall) as server,
        httpx.Client(transport=transport, timeout=30) as client,
    ):
        future = scope.spawn(worker, client)
        assert first.wait(BOUND)
        scope.cancel("stop")
        with pytest.raises(Interrupted):
            future.result(BOUND)
        assert_cut_reached_the_server(server, scope)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "0.1"])
def test_a_bad_read_interval_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="read_interval"):
        H1Transport(read_interval=bad)  # type: ignore[arg-type]


def _counted_pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    pauses: list[float] = []
    real_pause = _h1._Connection.pause

    def counted(self: Any, seconds: float) -> None:
        pauses.append(seconds)
        real_pause(self, seconds)

    monkeypatch.setattr(_h1._Connection, "pause", counted)
    return pauses


def _read_big(content_type: str) -> tuple[bytes, bytes]:
    body = b"x" * (512 * 1024)

    def bulk(ex: Exchange) -> None:
        ex.respond(200, body, content_type=content_type)

    transport = H1Transport(read_interval=0.5)
    with LoopbackServer(bulk) as server, httpx.Client(transport=transport, timeout=30) as c:
        with c.stream("GET", f"{server.url}/big") as response:
            return body, b"".join(response.iter_raw())


def test_a_paced_event_stream_pauses_only_after_a_read_that_drained_the_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What already waits in the socket is read without a pause a read.
    events: list[tuple[str, int]] = []
    real_recv, real_pause = _h1._Connection.recv, _h1._Connection.pause

    def recv(self: Any, timeout: float | None) -> bytes:
        data: bytes = real_recv(self, timeout)
        events.append(("read", len(data)))
        return data

    def pause(self: Any, seconds: float) -> None:
        events.append(("pause", 0))
        real_pause(self, seconds)

    monkeypatch.setattr(_h1._Connection, "recv", recv)
    monkeypatch.setattr(_h1._Connection, "pause", pause)
    body, got = _read_big("text/event-stream")
    assert got == body
    # A pause lets the server fill the socket: the next reads fill their buffer.
    assert ("read", _h1.READ_SIZE) in events
    pauses = [i for i, (kind, _) in enumerate(events) if kind == "pause"]
    # The first pause follows the head's read; every other one a read that drained.
    for i in pauses[1:]:
        kind, size = events[i - 1]
        assert kind == "read"
        assert 0 < size < _h1.READ_SIZE


def test_a_body_that_is_not_an_event_stream_is_never_paced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses = _counted_pauses(monkeypatch)
    body, got = _read_big("application/json")
    assert got == body
    assert pauses == []
