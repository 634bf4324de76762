"""wirecut.adapters: the official openai SDK and requests, cut through a bound scope."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import httpx2
import openai
import pytest
import requests

import wirecut.adapters
from _loopback import Exchange, FullBacklog, LoopbackServer, StallServer, connect_started
from _promises import assert_cut_reached_the_server, assert_quiet
from _scoped_client import assert_a_cancelled_scopes_idle_connection_is_closed_without_gc
from _support import BOUND
from wirecut.adapters import ScopedHTTPAdapter, openai_client, openai_http_client
from wirecut.adapters._openai import ScopedTransport2
from wirecut.scope import Interrupted, InterruptScope, bind_scope

# A timeout no test may reach: only a cut can end the wait within BOUND.
LONG = 60.0
MESSAGES: Any = [{"role": "user", "content": "hi"}]


def chunk(content: str) -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }


COMPLETION = {
    "id": "x",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello"},
            "finish_reason": "stop",
        }
    ],
}


def answer(ex: Exchange) -> None:
    if ex.request.method == "POST" and ex.request.json().get("stream"):
        ex.sse([chunk("Hel"), chunk("lo")])
    elif ex.request.method == "POST":
        ex.json(COMPLETION)
    else:
        ex.json({"path": ex.request.path})


def stall_after_first_chunk(ex: Exchange) -> None:
    ex.sse([chunk("Hel")], stall=True)


@pytest.fixture
def sdk() -> Iterator[Any]:
    # The server is made per test; the SDK client gets its URL through this factory.
    clients: list[openai.OpenAI] = []

    def make(url: str, **kwargs: Any) -> openai.OpenAI:
        client = openai.OpenAI(
            base_url=url, api_key="k", http_client=openai_http_client(), **kwargs
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        s.mount("http://", ScopedHTTPAdapter())
        s.mount("https://", ScopedHTTPAdapter())
        yield s


def test_the_adapters_module_exports_are_complete_and_sorted() -> None:
    assert wirecut.adapters.__all__ == ["ScopedHTTPAdapter", "openai_client", "openai_http_client"]
    for name in wirecut.adapters.__all__:
        assert getattr(wirecut.adapters, name) is not None
    with pytest.raises(AttributeError):
        _ = wirecut.adapters.nothing  # type: ignore[attr-defined]


# -- the official openai SDK ---------------------------------------------------


def test_the_sdk_works_as_usual_without_a_scope(sdk: Any) -> None:
    with LoopbackServer(answer) as server:
        client = sdk(server.url)
        result = client.chat.completions.create(model="m", messages=MESSAGES)
        assert result.choices[0].message.content == "Hello"
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream) == "Hello"
        assert server.connections == 1


def test_a_cut_sdk_call_raises_interrupted_and_is_not_retried(sdk: Any) -> None:
    scope = InterruptScope("t")
    with LoopbackServer(lambda ex: ex.hold()) as server:
        client = sdk(server.url)
        future = scope.spawn(partial(client.chat.completions.create, model="m", messages=MESSAGES))
        assert server.wait_requests(1)
        scope.cancel("stop")
        with pytest.raises(Interrupted) as info:
            future.result(BOUND)
        assert info.value.reason == "stop"
        assert_cut_reached_the_server(server, scope)


def test_a_cut_sdk_stream_raises_interrupted(sdk: Any) -> None:
    scope = InterruptScope("t")
    first = threading.Event()
    received: list[str] = []

    def worker(client: openai.OpenAI) -> None:
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        with stream:
            for c in stream:
                received.append(c.choices[0].delta.content or "")
                first.set()

    with LoopbackServer(stall_after_first_chunk) as server:
        future = scope.spawn(worker, sdk(server.url))
        assert first.wait(BOUND)
        scope.cancel("stop")
        with pytest.raises(Interrupted):
            future.result(BOUND)
        assert received == ["Hel"]
        assert_cut_reached_the_server(server, scope)


def test_the_sdk_under_a_cancelled_scope_connects_nowhere(sdk: Any) -> None:
    scope = InterruptScope("t")
    scope.cancel("early")
    with LoopbackServer(answer) as server:
        client = sdk(server.url)
        with bind_scope(scope), pytest.raises(Interrupted):
            client.chat.completions.create(model="m", messages=MESSAGES)
        client.chat.completions.create(model="m", messages=MESSAGES)  # unscoped
        assert server.connections == 1
        assert len(server.requests) == 1


# -- requests ------------------------------------------------------------------


def test_requests_works_as_usual_without_a_scope(session: requests.Session) -> None:
    with LoopbackServer(answer) as server:
        assert session.get(f"{server.url}/a").json() == {"path": "/a"}
        assert session.get(f"{server.url}/b").json() == {"path": "/b"}
        assert server.connections == 1


def test_requests_in_a_scope_reuses_its_connection_and_counts_no_idle_socket(
    session: requests.Session,
) -> None:
    scope = InterruptScope("t")
    with LoopbackServer(answer) as server, bind_scope(scope):
        session.get(f"{server.url}/a")
        assert scope.live()["sockets"] == 0
        session.get(f"{server.url}/b")
        assert server.connections == 1


def test_a_cut_requests_call_raises_interrupted(session: requests.Session) -> None:
    scope = InterruptScope("t")
    with LoopbackServer(lambda ex: ex.hold()) as server:
        future = scope.spawn(session.get, f"{server.url}/slow")
        assert server.wait_requests(1)
        scope.cancel("stop")
        with pytest.raises(Interrupted) as info:
            future.result(BOUND)
        assert info.value.reason == "stop"
        assert_cut_reached_the_server(server, scope)


def test_a_cut_requests_body_read_returns_promptly(session: requests.Session) -> None:
    scope = InterruptScope("t")
    first = threading.Event()

    def worker() -> None:
        with session.get(f"{server.url}/s", stream=True) as response:
            for _ in response.iter_content(chunk_size=None):
                first.set()

    with LoopbackServer(stall_after_first_chunk) as server:
        future = scope.spawn(worker)
        assert first.wait(BOUND)
        scope.cancel("stop")
        # requests reads the body outside the adapter: its own error surfaces.
        with pytest.raises((requests.ConnectionError, requests.exceptions.ChunkedEncodingError)):
            future.result(BOUND)
        assert_cut_reached_the_server(server, scope)


def test_requests_under_a_cancelled_scope_connects_nowhere(session: requests.Session) -> None:
    scope = InterruptScope("t")
    scope.cancel("early")
    with LoopbackServer(answer) as server:
        with bind_scope(scope), pytest.raises(Interrupted):
            session.get(f"{server.url}/x")
        session.get(f"{server.url}/after")
        assert [r.path for r in server.requests] == ["/after"]


def test_requests_never_shares_a_connection_between_scopes(session: requests.Session) -> None:
    a, b = InterruptScope("a"), InterruptScope("b")
    b_first, b_go = threading.Event(), threading.Event()

    def handler(ex: Exchange) -> None:
        if ex.request.path == "/b":
            ex.start_chunked()
            ex.chunk(b'{"part": ')
            b_go.wait(BOUND)
            ex.chunk(b"2}")
            ex.end_chunked()
        else:
            answer(ex)

    def b_worker() -> Any:
        with session.get(f"{server.url}/b", stream=True) as response:
            parts = []
            for part in response.iter_content(chunk_size=None):
                parts.append(part)
                b_first.set()
            return json.loads(b"".join(parts))

    with LoopbackServer(handler) as server:
        with bind_scope(a):
            session.get(f"{server.url}/a")  # An idle connection in a's pool.
        future = b.spawn(b_worker)
        assert b_first.wait(BOUND)
        a.cancel("stop a")
        b_go.set()
        assert future.result(BOUND) == {"part": 2}
        conns = {r.path: r.connection for r in server.requests}
        assert conns["/a"] != conns["/b"]
        assert conns["/b"] not in server.closes
        assert_quiet(b)


# -- what the connect and the TLS handshake do under a cut ----------------------


@pytest.fixture(params=["openai", "requests"])
def call(request: pytest.FixtureRequest, sdk: Any, session: requests.Session) -> Any:
    """A factory: ``call(url)`` is a request through that client, with LONG timeouts."""

    def openai_call(url: str) -> Callable[[], Any]:
        client = sdk(url, timeout=LONG, max_retries=0)
        return partial(client.chat.completions.create, model="m", messages=MESSAGES)

    def requests_call(url: str) -> Callable[[], Any]:
        return partial(session.get, url, timeout=LONG)

    return openai_call if request.param == "openai" else requests_call


def test_a_stalled_tls_handshake_is_cut(call: Any) -> None:
    scope = InterruptScope("t")
    with StallServer() as server:
        future = scope.spawn(call(server.url))
        assert server.hello.wait(BOUND)  # The ClientHello is out; no answer will come.
        scope.cancel("stop")
        with pytest.raises(Interrupted) as info:
            future.result(BOUND)
        assert info.value.reason == "stop"
        assert server.closed.wait(BOUND)  # The cut shut the socket the handshake read.
        assert server.connections == 1  # Not retried.
        assert_quiet(scope)


def test_a_connect_to_a_full_backlog_is_cut(call: Any) -> None:
    scope = InterruptScope("t")
    with FullBacklog() as backlog:
        if not backlog.blocked:
            pytest.skip("could not make a loopback connect block here")
        started = connect_started(backlog.port)
        future = scope.spawn(call(backlog.url))
        assert started.wait(BOUND)
        scope.cancel("stop")
        with pytest.raises(Interrupted) as info:
            future.result(BOUND)
        assert info.value.reason == "stop"
        assert_quiet(scope)


# -- the SDK's retry backoff ------------------------------------------------------


def busy_then_answer(ex: Exchange) -> None:
    if len(ex.server.requests) == 1:
        # Connection: close lets the test see the SDK finish with the answer,
        # which it does right before its backoff.
        ex.json({"error": "busy"}, 503, headers={"Retry-After": "30", "Connection": "close"})
    else:
        answer(ex)


def test_a_cancel_during_the_sdks_retry_backoff_ends_it_at_once() -> None:
    scope = InterruptScope("t")
    with LoopbackServer(busy_then_answer) as server:
        client = openai_client(base_url=server.url, api_key="k", timeout=LONG)
        future = scope.spawn(partial(client.chat.completions.create, model="m", messages=MESSAGES))
        assert server.wait_closes(1)  # The 503 was read: the SDK is in its 30 s backoff.
        scope.cancel("stop")
        with pytest.raises(Interrupted) as info:
            future.result(BOUND)
        assert info.value.reason == "stop"
        assert len(server.requests) == 1  # No retry.
        assert_quiet(scope)
        client.close()


def test_the_cuttable_client_still_retries_as_the_sdk_does() -> None:
    def busy_once(ex: Exchange) -> None:
        if len(ex.server.requests) == 1:
            ex.json({"error": "busy"}, 503, headers={"retry-after-ms": "10"})
        else:
            answer(ex)

    with LoopbackServer(busy_once) as server:
        client = openai_client(base_url=server.url, api_key="k", max_retries=1)
        for scope in (None, InterruptScope("t")):
            with bind_scope(scope):
                result = client.chat.completions.create(model="m", messages=MESSAGES)
            assert result.choices[0].message.content == "Hello"
            server.requests.clear()
        client.close()


# -- idle connections of a done scope ---------------------------------------------


def test_a_cancelled_scopes_idle_requests_connection_is_closed_without_gc(
    session: requests.Session,
) -> None:
    assert_a_cancelled_scopes_idle_connection_is_closed_without_gc(session.get, answer)


# -- keywords that would bypass the scoped transport ----------------------------


def test_a_proxy_is_reached_through_the_scoped_transport_and_cut() -> None:
    scope = InterruptScope("t")
    with LoopbackServer(lambda ex: ex.hold()) as proxy:
        client = openai.OpenAI(
            base_url="http://example.invalid/v1",
            api_key="k",
            http_client=openai_http_client(proxy=proxy.url),
            timeout=LONG,
            max_retries=0,
        )
        future = scope.spawn(partial(client.chat.completions.create, model="m", messages=MESSAGES))
        assert proxy.wait_requests(1)
        assert proxy.requests[0].path.startswith("http://example.invalid/v1/")
        scope.cancel("stop")
        with pytest.raises(Interrupted):
            future.result(BOUND)
        assert_cut_reached_the_server(proxy, scope)
        client.close()


def test_an_unscoped_transport_for_the_sdk_is_refused() -> None:
    with pytest.raises(ValueError, match="transport= is a HTTPTransport"):
        openai_http_client(transport=httpx2.HTTPTransport())
    with pytest.raises(ValueError, match=r"mounts\['all://'\] is a HTTPTransport"):
        openai_http_client(mounts={"all://": httpx2.HTTPTransport()})
    openai_http_client(transport=ScopedTransport2()).close()
