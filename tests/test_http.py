"""wirecut.http: real sockets on loopback, real threads, real cuts."""

from __future__ import annotations

import contextlib
import gc
import socket
import ssl
import threading
from collections.abc import Iterator
from types import ModuleType

import httpx
import pytest

import wirecut.http
from _loopback import (
    Exchange,
    FullBacklog,
    LoopbackServer,
    StallServer,
    connect_started,
)
from _promises import assert_cut_reached_the_server, assert_quiet, cyclic_garbage
from _scoped_client import (
    assert_a_cancelled_scopes_idle_connection_is_closed_without_gc,
    assert_a_cut_in_a_stream_wakes_the_reader,
    assert_a_cut_in_the_header_wait_reaches_the_server,
    assert_an_idle_connection_is_not_counted_and_is_reused,
    assert_the_socket_stays_registered_between_chunks,
    hold,
    ok,
    stream_then_stall,
)
from _support import BOUND
from wirecut.http import (
    ScopedNetworkBackend,
    ScopedTransport,
    cut_as_interrupted,
)
from wirecut.http._connect import CONNECT_CUT, connect_tcp
from wirecut.http._thirdparty import (
    httpcore_flavour,
    install_network_backend,
    require_private,
    shared_ssl_context,
)
from wirecut.scope import Interrupted, InterruptScope, bind_scope

# A timeout no test may reach: only a cut can end the wait within BOUND.
LONG = 60.0


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with wirecut.http.client(timeout=30) as c:
        yield c


def test_without_a_scope_it_is_a_plain_keep_alive_client(client: httpx.Client) -> None:
    with LoopbackServer(ok) as server:
        assert client.get(f"{server.url}/one").json() == {"path": "/one"}
        assert client.get(f"{server.url}/two").json() == {"path": "/two"}
        assert server.connections == 1


# -- cuts ----------------------------------------------------------------------


def test_cut_during_the_header_wait_wakes_the_worker_and_closes_the_connection(
    client: httpx.Client,
) -> None:
    assert_a_cut_in_the_header_wait_reaches_the_server(client)


def test_cut_during_a_stream_wakes_the_reader(client: httpx.Client) -> None:
    assert_a_cut_in_a_stream_wakes_the_reader(client)


def test_the_socket_stays_registered_between_chunks_of_a_streamed_body(
    client: httpx.Client,
) -> None:
    assert_the_socket_stays_registered_between_chunks(client)


def test_a_stalled_tls_handshake_is_cut() -> None:
    scope = InterruptScope("t")
    with (
        StallServer() as server,
        wirecut.http.client(timeout=httpx.Timeout(None), connect_timeout=LONG) as client,
    ):
        future = scope.spawn(client.get, server.url)
        assert server.hello.wait(BOUND)  # The ClientHello is out; no answer will come.
        assert scope.live()["sockets"] == 1
        scope.cancel("stop")
        with pytest.raises(Interrupted):
            future.result(BOUND)
        assert server.closed.wait(BOUND)  # The cut shut the very socket the handshake read.
        assert_quiet(scope)
        assert [event for event, _ in scope.timeline].count("sockets_shut") == 1


def test_a_connect_to_a_full_backlog_is_cut() -> None:
    scope = InterruptScope("t")
    with FullBacklog() as backlog:
        if not backlog.blocked:
            pytest.skip("could not make a loopback connect block here")
        started = connect_started(backlog.port)
        with wirecut.http.client(timeout=LONG, connect_timeout=LONG) as client:
            future = scope.spawn(client.get, backlog.url)
            assert started.wait(BOUND)
            assert scope.live()["sockets"] == 1  # The connect's wakeup.
            scope.cancel("stop")
            with pytest.raises(Interrupted) as info:
                future.result(BOUND)
        assert info.value.reason == "stop"
        assert_quiet(scope)


def test_over_tls_a_cut_reaches_the_server(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_ctx, client_ctx = tls
    scope = InterruptScope("t")
    with (
        LoopbackServer(hold, ssl_context=server_ctx) as server,
        httpx.Client(transport=ScopedTransport(verify=client_ctx)) as client,
    ):
        future = scope.spawn(client.get, f"{server.url}/slow")
        assert server.wait_requests(1)
        assert scope.live()["sockets"] == 1
        scope.cancel("stop")
        with pytest.raises(Interrupted):
            future.result(BOUND)
        assert_cut_reached_the_server(server, scope)


# -- the backend, directly ----------------------------------------------------


def test_the_socket_is_registered_from_the_connect() -> None:
    scope = InterruptScope("t")
    backend = ScopedNetworkBackend()
    with LoopbackServer(ok) as server, bind_scope(scope):
        stream = backend.connect_tcp("127.0.0.1", server.port)
        assert scope.live()["sockets"] == 1  # Before any write.
        stream.close()
        assert scope.live()["sockets"] == 0


def test_a_cancel_right_after_the_connect_releases_the_wakeup_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scope = InterruptScope("t")
    real_connect = wirecut.http._socket_hold.connect_tcp

    def connect_then_cancel(*args: object, **kwargs: object) -> socket.socket:
        sock = real_connect(*args, **kwargs)  # type: ignore[arg-type]
        scope.cancel("between")  # after the connect, before the new socket registers
        return sock

    monkeypatch.setattr(wirecut.http._socket_hold, "connect_tcp", connect_then_cancel)
    backend = ScopedNetworkBackend()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with bind_scope(scope), pytest.raises(Interrupted):
            backend.connect_tcp("127.0.0.1", listener.getsockname()[1])
    # Neither the new socket nor the connect's wakeup is left registered (or open).
    assert_quiet(scope)


def test_a_direct_backend_connect_under_a_cancelled_scope_connects_nowhere() -> None:
    scope = InterruptScope("t")
    scope.cancel("early")
    backend = ScopedNetworkBackend()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with bind_scope(scope), pytest.raises(Interrupted) as info:
            backend.connect_tcp("127.0.0.1", listener.getsockname()[1])
        assert info.value.reason == "early"
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # Not even a connection left in the accept queue.
    assert_quiet(scope)


def test_a_released_connection_refuses_a_request_of_a_cancelled_scope() -> None:
    scope = InterruptScope("t")
    backend = ScopedNetworkBackend()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with bind_scope(scope):
            stream = backend.connect_tcp("127.0.0.1", listener.getsockname()[1])
        peer, _ = listener.accept()
        with peer:
            stream.release()  # As the transport does before the pool takes it back.
            assert scope.live()["sockets"] == 0
            scope.cancel("stop")
            with pytest.raises(Interrupted):
                stream.write(b"GET / HTTP/1.1\r\n\r\n")
            peer.settimeout(BOUND)
            assert peer.recv(100) == b""  # Shut down; nothing was sent.
        stream.close()
    assert_quiet(scope)


def test_a_cut_seen_after_name_resolution_sends_no_syn() -> None:
    wakeup, peer = socket.socketpair()
    with wakeup, peer, socket.create_server(("127.0.0.1", 0)) as listener:
        wakeup.shutdown(socket.SHUT_RDWR)  # What the scope's cut does to it.
        with pytest.raises(OSError, match="the connect was cut") as info:
            connect_tcp("127.0.0.1", listener.getsockname()[1], timeout=LONG, wakeup=wakeup)
        assert info.value.errno == CONNECT_CUT
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_the_backend_sleep_wakes_on_cancel() -> None:
    scope = InterruptScope("t")
    backend = ScopedNetworkBackend()
    sleeping = threading.Event()

    def nap() -> None:
        sleeping.set()
        backend.sleep(LONG)

    future = scope.spawn(nap)
    assert sleeping.wait(BOUND)
    scope.cancel("stop")
    with pytest.raises(Interrupted):
        future.result(BOUND)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), 1e12, True, "5"])
def test_a_bad_connect_timeout_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="connect_timeout"):
        ScopedNetworkBackend(connect_timeout=bad)  # type: ignore[arg-type]


def test_the_connect_timeout_bounds_the_request_timeout() -> None:
    backend = ScopedNetworkBackend(connect_timeout=2.0)
    assert backend._timeout(None) == 2.0
    assert backend._timeout(10.0) == 2.0
    assert backend._timeout(1.0) == 1.0


# -- the transport's pools -----------------------------------------------------


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
    assert_an_idle_connection_is_not_counted_and_is_reused(client)


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
        assert server.wait_closed(a_conn)  # a's idle connection went with a.
        assert b_conn not in server.closes
        assert_quiet(b)


def test_a_cut_scopes_pool_is_closed_by_its_last_request(client: httpx.Client) -> None:
    scope = InterruptScope("t")
    with LoopbackServer(hold) as server:
        future = scope.spawn(client.get, f"{server.url}/slow")
        assert server.wait_requests(1)
        scope.cancel()
        with pytest.raises(Interrupted):
            future.result(BOUND)
        assert server.wait_closes(1)
        # The worker closed its scope's pool on its way out: nothing is left of it.
        assert len(client._transport._pools) == 0  # type: ignore[attr-defined]


def test_a_cancelled_scopes_idle_connection_is_closed_without_gc(client: httpx.Client) -> None:
    assert_a_cancelled_scopes_idle_connection_is_closed_without_gc(client.get, ok)


def test_a_cut_streams_pool_is_freed_when_its_response_closes(client: httpx.Client) -> None:
    # httpx's Response and the stream it wraps the body in name each other;
    # the body held on to the connection and the scope's pool, and all of it
    # waited for a full collection (tens of ms on the console's event loop,
    # in the middle of a burst of cancels).
    def cut_stream() -> None:
        scope = InterruptScope("t")
        first = threading.Event()

        def worker() -> None:
            # The cut is caught here, as a client of the scope catches it (a
            # future holding the exception would keep the frames it unwound).
            with contextlib.suppress(Interrupted):
                with client.stream("GET", f"{server.url}/s") as response:
                    for _ in response.iter_raw():
                        first.set()
                raise AssertionError("the stream ended without the cut")

        with LoopbackServer(stream_then_stall) as server:
            future = scope.spawn(worker)
            assert first.wait(BOUND)
            scope.cancel("stop")
            future.result(BOUND)
            assert_cut_reached_the_server(server, scope)

    left = cyclic_garbage(cut_stream)
    # The response's extensions still name the network stream (and its
    # closed socket) until the response itself goes; the pool does not wait.
    assert [name for name in left if name.startswith(("httpcore.", "h11."))] == [
        "httpcore._backends.sync.SyncStream"
    ]


def test_a_finished_scopes_idle_connection_is_closed_after_the_keepalive_expiry() -> None:
    scope = InterruptScope("t")
    limits = httpx.Limits(keepalive_expiry=0.2)
    gc.disable()
    try:
        with LoopbackServer(ok) as server, wirecut.http.client(limits=limits) as client:
            with bind_scope(scope):
                client.get(f"{server.url}/1")
            # The scope is still referenced and open; no request follows.
            assert server.wait_closes(1)
            assert not scope.cancelled
    finally:
        gc.enable()


def test_a_collected_scope_closes_its_idle_connections(client: httpx.Client) -> None:
    with LoopbackServer(ok) as server:
        scope = InterruptScope("t")
        with bind_scope(scope):
            client.get(f"{server.url}/1")
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


def test_pools_of_one_configuration_share_one_ssl_context() -> None:
    first = shared_ssl_context(httpx, True, None, True)
    assert shared_ssl_context(httpx, True, None, True) is first
    assert shared_ssl_context(httpx, False, None, True) is not first
    mine = ssl.create_default_context()
    assert shared_ssl_context(httpx, mine, None, True) is mine


# -- keywords that would bypass the scoped transport ----------------------------


def test_a_proxy_is_reached_through_the_scoped_transport_and_cut() -> None:
    scope = InterruptScope("t")
    with LoopbackServer(hold) as proxy, wirecut.http.client(proxy=proxy.url, timeout=LONG) as c:
        future = scope.spawn(c.get, "http://example.invalid/slow")
        assert proxy.wait_requests(1)
        assert proxy.requests[0].path == "http://example.invalid/slow"  # Proxy form.
        scope.cancel("stop")
        with pytest.raises(Interrupted):
            future.result(BOUND)
        assert_cut_reached_the_server(proxy, scope)


def test_a_transport_or_mount_that_is_not_scoped_is_refused() -> None:
    with pytest.raises(ValueError, match="transport= is a HTTPTransport"):
        wirecut.http.client(transport=httpx.HTTPTransport())
    with pytest.raises(ValueError, match=r"mounts\['http://x'\] is a HTTPTransport"):
        wirecut.http.client(mounts={"http://x": httpx.HTTPTransport()})
    with pytest.raises(ValueError, match="verify, proxy would be ignored"):
        wirecut.http.client(transport=ScopedTransport(), verify=False, proxy="http://p:1")
    with wirecut.http.client(mounts={"http://x": ScopedTransport()}, verify=False):
        pass


# -- the pieces ------------------------------------------------------------------


def test_cut_as_interrupted_turns_an_error_into_interrupted_only_under_a_cancel() -> None:
    scope = InterruptScope("t")
    with pytest.raises(OSError, match="boom"), cut_as_interrupted(scope):
        raise OSError("boom")
    scope.cancel("stop")
    with pytest.raises(Interrupted) as info, cut_as_interrupted(scope):
        raise OSError("boom")
    assert info.value.reason == "stop"
    assert isinstance(info.value.__cause__, OSError)
    with pytest.raises(KeyboardInterrupt), cut_as_interrupted(scope):
        raise KeyboardInterrupt
    with pytest.raises(OSError, match="boom"), cut_as_interrupted(None):
        raise OSError("boom")


def test_a_missing_private_attribute_fails_loudly() -> None:
    with pytest.raises(RuntimeError, match=r"httpx .*HTTPTransport\._pool\._network_backend"):
        install_network_backend(object(), ScopedNetworkBackend(), "httpx")
    with pytest.raises(RuntimeError, match=r"nothere\._backends\.sync is missing"):
        httpcore_flavour(ModuleType("nothere"))
    with pytest.raises(RuntimeError, match=r"urllib3 .*_get_conn"):
        require_private(type("Pool", (), {}), ("_get_conn",), "urllib3")
