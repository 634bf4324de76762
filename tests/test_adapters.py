"""wirecut.adapters: the official openai SDK and requests, cut through a bound scope."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

import openai
import pytest
import requests

import wirecut.adapters
from _loopback import Exchange, LoopbackServer
from _promises import assert_cut_reached_the_server, assert_quiet
from wirecut.adapters import ScopedHTTPAdapter, openai_http_client
from wirecut.scope import Interrupted, InterruptScope, bind_scope

BOUND = 5.0  # seconds: a generous bound for "promptly" on a shared, noisy machine
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

    def make(url: str) -> openai.OpenAI:
        client = openai.OpenAI(base_url=url, api_key="k", http_client=openai_http_client())
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        s.mount("http://", ScopedHTTPAdapter())
        yield s


def test_the_adapters_module_exports_are_complete_and_sorted() -> None:
    assert wirecut.adapters.__all__ == ["ScopedHTTPAdapter", "openai_http_client"]
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
