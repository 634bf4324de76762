"""wirecut.http: real sockets on loopback, real threads, real cuts."""

from __future__ import annotations

import gc
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import wirecut.http
from _loopback import Exchange, LoopbackServer
from _promises import assert_cut_reached_the_server, assert_quiet
from wirecut.http import ScopedNetworkBackend, ScopedTransport
from wirecut.scope import Interrupted, InterruptScope, bind_scope

BOUND = 5.0  # seconds: a generous bound for "promptly" on a shared, noisy machine


def ok(ex: Exchange) -> None:
    ex.json({"path": ex.request.path})


def hold(ex: Exchange) -> None:
    ex.hold()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with wirecut.http.client(timeout=30) as c:
        yield c


def test_without_a_scope_it_is_a_plain_keep_alive_client(client: httpx.Client) -> None:
    with LoopbackServer(ok) as server:
        assert client.get(f"{server.url}/one").json() == {"path": "/one"}
        assert client.get(f"{server.url}/two").json() == {"path": "/two"}
        assert server.connections == 1


def test_cut_during_the_header_wait_wakes_the_worker_and_closes_the_connection(
    client: httpx.Client,
) -> None:
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


def test_cut_during_a_stream_wakes_the_reader(client: httpx.Client) -> None:
    scope = InterruptScope("t")
    first = threading.Event()
    received: list[bytes] = []

    def stream_then_stall(ex: Exchange) -> None:
        ex.start_chunked()
        ex.chunk(b"hello")
        ex.hold()

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


def test_a_request_under_a_cancelled_scope_opens_no_connection(client: httpx.Client) -> None:
    scope = InterruptScope("t")
    scope.cancel("early")
    with LoopbackServer(ok) as server:
        with bind_scope(scope), pytest.raises(Interrupted) as info:
            client.get(f"{server.url}/x")
        assert info.value.reason == "early"
        # A later unscoped request is the first thing the server ever sees.
        client.get(f"{server.url}/after")
        assert [r.path for r in server.requests] == ["/after"]
        assert server.connections == 1


def test_an_idle_pooled_connection_is_not_counted_and_is_reused_in_its_scope(
    client: httpx.Client,
) -> None:
    scope = InterruptScope("t")
    with LoopbackServer(ok) as server, bind_scope(scope):
        client.get(f"{server.url}/1")
        assert scope.live()["sockets"] == 0
        client.get(f"{server.url}/2")
        assert server.connections == 1
        assert scope.live()["sockets"] == 0


def test_two_scopes_never_share_a_connection(client: httpx.Client) -> None:
    a, b = InterruptScope("a"), InterruptScope("b")
    b_first = threading.Event()
    b_go = threading.Event()

    def handler(ex: Exchange) -> None:
        if ex.request.path == "/b":
            ex.start_chunked()
            ex.chunk(b"one,")
            b_go.wait(BOUND)
            ex.chunk(b"two")
            ex.end_chunked()
        else:
            ok(ex)

    def b_worker() -> bytes:
        parts = []
        with client.stream("GET", f"{server.url}/b") as response:
            for chunk in response.iter_raw():
                parts.append(chunk)
                b_first.set()
        return b"".join(parts)

    with LoopbackServer(handler) as server:
        with bind_scope(a):
            client.get(f"{server.url}/a")  # Leaves an idle connection in a's pool.
        future = b.spawn(b_worker)
        assert b_first.wait(BOUND)
        a.cancel("stop a")
        b_go.set()
        assert future.result(BOUND) == b"one,two"
        a_conn = next(r.connection for r in server.requests if r.path == "/a")
        b_conn = next(r.connection for r in server.requests if r.path == "/b")
        assert a_conn != b_conn
        assert b_conn not in server.closes
        assert_quiet(b)


def test_a_cut_connection_is_closed_not_pooled(client: httpx.Client) -> None:
    scope = InterruptScope("t")
    with LoopbackServer(hold) as server:
        future = scope.spawn(client.get, f"{server.url}/slow")
        assert server.wait_requests(1)
        scope.cancel()
        with pytest.raises(Interrupted):
            future.result(BOUND)
        assert server.wait_closes(1)
        pool = client._transport._pools.get(scope)  # type: ignore[attr-defined]
        assert pool._pool.connections == []


def test_a_collected_scope_closes_its_idle_connections(client: httpx.Client) -> None:
    with LoopbackServer(ok) as server:
        scope = InterruptScope("t")
        with bind_scope(scope):
            client.get(f"{server.url}/1")
        assert server.closes == []
        del scope
        gc.collect()
        assert server.wait_closes(1)
        assert len(client._transport._pools) == 0  # type: ignore[attr-defined]


def test_a_closed_transport_refuses_requests() -> None:
    transport = ScopedTransport()
    transport.close()
    with pytest.raises(RuntimeError, match="closed"):
        transport.handle_request(httpx.Request("GET", "http://127.0.0.1:9/"))


def test_http2_is_refused() -> None:
    with pytest.raises(ValueError, match=r"HTTP/1\.1"):
        ScopedTransport(http2=True)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_a_bad_connect_timeout_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="connect_timeout"):
        ScopedNetworkBackend(connect_timeout=bad)


def test_the_connect_timeout_bounds_the_request_timeout() -> None:
    backend = ScopedNetworkBackend(connect_timeout=2.0)
    assert backend._timeout(None) == 2.0
    assert backend._timeout(10.0) == 2.0
    assert backend._timeout(1.0) == 1.0


def test_the_backend_sleep_wakes_on_cancel() -> None:
    scope = InterruptScope("t")
    backend = ScopedNetworkBackend()
    future = scope.spawn(backend.sleep, 30.0)
    scope.cancel("stop")
    with pytest.raises(Interrupted):
        future.result(BOUND)


@pytest.fixture
def tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a fresh self-signed certificate for 127.0.0.1, and a client one."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    return server, client


def test_over_tls_the_registration_moves_to_the_tls_socket(
    tls: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server_ctx, client_ctx = tls
    scope = InterruptScope("t")
    with (
        LoopbackServer(hold, ssl_context=server_ctx) as server,
        httpx.Client(transport=ScopedTransport(verify=client_ctx)) as client,
    ):
        future = scope.spawn(client.get, f"{server.url}/slow")
        assert server.wait_requests(1)
        sockets = [r.target for r in scope._registrations if isinstance(r.target, socket.socket)]
        assert len(sockets) == 1
        assert isinstance(sockets[0], ssl.SSLSocket)  # Not the detached plain socket.
        scope.cancel("stop")
        with pytest.raises(Interrupted):
            future.result(BOUND)
        assert server.wait_closes(1)
        assert_quiet(scope)
