"""wirecut.provider: ChatClient against a scripted loopback server, with real cuts."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _loopback import (
    Exchange,
    FullBacklog,
    LoopbackServer,
    StallServer,
    connect_started,
    self_signed,
)
from _promises import assert_quiet, cyclic_garbage
from _support import BOUND
from wirecut.provider import (
    ChatClient,
    ChatResult,
    ProviderConnectionError,
    ProviderResponseError,
    ProviderStatusError,
    ProviderTimeout,
    ServerSentEvent,
    ToolCall,
    Usage,
    iter_sse,
)
from wirecut.scope import Interrupted, InterruptScope, bind_scope
from wirecut.simulator import SimConfig, SimulatorServer

# A timeout no test may reach: only a cut can end the wait within BOUND.
LONG = 60.0
MESSAGES = [{"role": "user", "content": "hi"}]


def chunk(
    content: str | None = None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {
        "object": "chat.completion.chunk",
        "model": "m1",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


USAGE = {
    "object": "chat.completion.chunk",
    "choices": [],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}


def completion(content: str) -> dict[str, Any]:
    return {
        "object": "chat.completion",
        "model": "m1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def hello_stream(ex: Exchange) -> None:
    if ex.request.json().get("stream"):
        ex.sse([chunk("Hello"), chunk(" world"), chunk(finish="stop"), USAGE])
    else:
        ex.json(completion("Hello world"))


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer(hello_stream) as s:
        yield s


# -- the plain paths -------------------------------------------------------


def test_a_stream_returns_text_usage_and_each_token(server: LoopbackServer) -> None:
    tokens: list[str] = []
    with ChatClient(server.url, api_key="k", model="m0") as client:
        result = client.chat(MESSAGES, on_token=tokens.append, temperature=0)
    assert result == ChatResult(
        text="Hello world",
        tool_calls=[],
        finish_reason="stop",
        usage=Usage(5, 2, 7, requests=1),
        model="m1",
    )
    assert tokens == ["Hello", " world"]
    request = server.requests[0]
    assert request.path == "/chat/completions"
    assert request.headers["authorization"] == "Bearer k"
    body = request.json()
    assert body["model"] == "m0"
    assert body["temperature"] == 0
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_a_paced_client_gives_on_token_each_reads_tokens_together() -> None:
    first = threading.Event()

    def burst(ex: Exchange) -> None:
        ex.start_chunked()
        ex.chunk(f"data: {json.dumps(chunk('Hello'))}\n\n".encode())
        first.wait(BOUND)  # the rest comes while the client pauses between reads
        for payload in (chunk(" big"), chunk(" world"), chunk(finish="stop"), USAGE):
            ex.chunk(f"data: {json.dumps(payload)}\n\n".encode())
        ex.chunk(b"data: [DONE]\n\n")
        ex.end_chunked()

    tokens: list[str] = []

    def on_token(text: str) -> None:
        tokens.append(text)
        first.set()

    with LoopbackServer(burst) as server, ChatClient(server.url, read_interval=1.0) as client:
        result = client.chat(MESSAGES, on_token=on_token)
    assert tokens == ["Hello", " big world"]
    assert result.text == "Hello big world"
    assert result.usage == Usage(5, 2, 7, requests=1)


def test_a_whole_answer_still_streams_on_the_wire(server: LoopbackServer) -> None:
    tokens: list[str] = []
    with ChatClient(server.url) as client:
        result = client.chat(MESSAGES, stream=False, on_token=tokens.append, model="m2")
    assert result.text == "Hello world"
    assert tokens == []
    body = server.requests[0].json()
    assert body["stream"] is True
    assert body["model"] == "m2"
    assert "authorization" not in server.requests[0].headers


@pytest.mark.parametrize("how", ["param", "ctor"])
def test_wire_stream_false_sends_a_real_non_streaming_request(
    server: LoopbackServer, how: str
) -> None:
    with ChatClient(server.url, wire_stream=how == "param") as client:
        params = {"wire_stream": False} if how == "param" else {}
        result = client.chat(MESSAGES, **params)
    assert result.text == "Hello world"
    assert result.usage == Usage(3, 1, 4, requests=1)
    body = server.requests[0].json()
    assert body["stream"] is False
    assert "stream_options" not in body
    assert "wire_stream" not in body


def test_tool_call_deltas_are_accumulated_by_index() -> None:
    def handler(ex: Exchange) -> None:
        ex.sse(
            [
                chunk(tool_calls=[{"index": 0, "id": "c0", "function": {"name": "ls"}}]),
                chunk(tool_calls=[{"index": 1, "id": "c1", "function": {"name": "cat"}}]),
                chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"pa'}}]),
                chunk(tool_calls=[{"index": 1, "function": {"arguments": '{"f": 1}'}}]),
                chunk(
                    tool_calls=[{"index": 0, "id": "c0", "function": {"arguments": 'th": "/"}'}}]
                ),
                chunk(finish="tool_calls"),
            ]
        )

    with LoopbackServer(handler) as server, ChatClient(server.url) as client:
        result = client.chat(MESSAGES, tools=[{"type": "function"}])
    assert result.tool_calls == [
        ToolCall("c0", "ls", '{"path": "/"}'),
        ToolCall("c1", "cat", '{"f": 1}'),
    ]
    assert result.finish_reason == "tool_calls"
    assert result.usage.estimated
    assert server.requests[0].json()["tools"] == [{"type": "function"}]


def test_sse_comments_event_lines_and_multi_line_data_are_understood() -> None:
    def handler(ex: Exchange) -> None:
        ex.sse(
            [
                ": keep-alive\n\n",
                'event: message\nid: 1\ndata: {"choices": [{"delta":\n'
                'data: {"content": "A"}}]}\n\n',
                "retry: 10\n\n",
                "data:" + '{"choices": [{"delta": {"content": "B"}, "finish_reason": "stop"}]}\n\n',
            ]
        )

    with LoopbackServer(handler) as server, ChatClient(server.url) as client:
        result = client.chat(MESSAGES)
    assert result.text == "AB"
    # No usage from the provider: two deltas, the prompt unknown.
    assert result.usage == Usage(None, 2, None, requests=1, estimated=True)


def test_iter_sse_follows_the_event_stream_rules() -> None:
    lines = [": c", "event: e", "id: 7", "data: a", "data:b", "", "", "data: tail"]
    assert list(iter_sse(lines)) == [
        ServerSentEvent("a\nb", "e", "7"),
        ServerSentEvent("tail", "message", "7"),
    ]


def test_without_a_scope_bound_nothing_registers(server: LoopbackServer) -> None:
    with ChatClient(server.url) as client:
        assert client.chat(MESSAGES).text == "Hello world"
        assert client.chat(MESSAGES).text == "Hello world"
    assert server.connections == 1


# -- cuts ------------------------------------------------------------------


def test_a_cut_during_the_header_wait_of_a_non_streaming_call_returns_interrupted() -> None:
    scope = InterruptScope("t")
    with LoopbackServer(lambda ex: ex.hold()) as server, ChatClient(server.url) as client:
        future = scope.spawn(partial(client.chat, MESSAGES, wire_stream=False))
        assert server.wait_requests(1)
        scope.cancel("user cancel")
        result = future.result(BOUND)
        assert server.wait_closes(1)
        assert result.interrupted
        assert result.reason == "user cancel"
        assert result.text == ""
        assert result.usage.requests == 1
        assert len(server.requests) == 1
        assert server.requests[0].json()["stream"] is False
        assert_quiet(scope)


def test_a_cut_during_a_stream_keeps_the_partial_text_tool_calls_and_usage() -> None:
    scope = InterruptScope("t")
    two = threading.Event()
    tokens: list[str] = []

    def on_token(text: str) -> None:
        tokens.append(text)
        if len(tokens) == 2:
            two.set()

    def handler(ex: Exchange) -> None:
        partial_call = {"index": 0, "id": "c0", "function": {"name": "ls", "arguments": '{"pa'}}
        ex.sse([chunk("Hello"), chunk(tool_calls=[partial_call]), chunk(" wor")], stall=True)

    with LoopbackServer(handler) as server, ChatClient(server.url) as client:
        future = scope.spawn(partial(client.chat, MESSAGES, on_token=on_token))
        assert two.wait(BOUND)
        scope.cancel("stop")
        result = future.result(BOUND)
        assert server.wait_closes(1)
        assert result.interrupted
        assert result.reason == "stop"
        assert result.text == "Hello wor"
        assert result.tool_calls == [ToolCall("c0", "ls", '{"pa')]
        assert result.finish_reason is None
        # Three deltas arrived (a tool-call delta is a token too); the
        # provider's usage, which would come last, never did.
        assert result.usage == Usage(None, 3, None, requests=1, estimated=True)
        assert result.model == "m1"
        assert len(server.requests) == 1
        assert_quiet(scope)


def test_a_cut_stream_leaves_nothing_to_the_cycle_collector() -> None:
    # httpx's Response and the stream it wraps the body in name each other:
    # every cut chat left 75 objects (its request, its connection, its
    # scope's pool) for a full collection to free, tens of milliseconds on
    # the console's event loop in the middle of a burst of cancels.
    def handler(ex: Exchange) -> None:
        ex.sse([chunk("Hello")], stall=True)

    def cut_chat() -> None:
        scope = InterruptScope("t")
        streaming = threading.Event()
        on_token = lambda _: streaming.set()  # noqa: E731
        future = scope.spawn(partial(client.chat, MESSAGES, on_token=on_token))
        assert streaming.wait(BOUND)
        scope.cancel("stop")
        assert future.result(BOUND).interrupted
        assert server.wait_closes(1)

    # A client lives as long as its console; one cut chat is what is measured.
    with LoopbackServer(handler) as server, ChatClient(server.url) as client:
        left = cyclic_garbage(cut_chat)
    assert [name for name in left if name.startswith(("httpx.", "httpcore.", "h11."))] == []


def test_a_cut_during_a_retry_backoff_sends_no_retry_and_keeps_the_request_counted() -> None:
    scope = InterruptScope("t")

    def busy(ex: Exchange) -> None:
        # Connection: close lets the test see the client finish reading.
        ex.json({"error": "busy"}, 503, headers={"Retry-After": "30", "Connection": "close"})

    with LoopbackServer(busy) as server, ChatClient(server.url) as client:
        future = scope.spawn(client.chat, MESSAGES)
        assert server.wait_closes(1)  # The 503 was read: the worker is in its backoff.
        scope.cancel("stop")
        result = future.result(BOUND)
        # A request was sent: the cut returns what it used instead of raising.
        assert result.interrupted
        assert result.reason == "stop"
        assert result.text == ""
        assert result.usage == Usage(None, 0, None, requests=1)
        assert len(server.requests) == 1
        assert_quiet(scope)


def test_a_cancelled_scope_raises_at_entry_and_connects_nowhere(server: LoopbackServer) -> None:
    scope = InterruptScope("t")
    scope.cancel("early")
    with ChatClient(server.url) as client, bind_scope(scope):
        with pytest.raises(Interrupted):
            client.chat(MESSAGES)
    assert server.connections == 0
    assert_quiet(scope)


def test_a_cancelled_scope_sends_nothing_through_a_plain_http_client(
    server: LoopbackServer,
) -> None:
    # A plain httpx.Client knows no scope: only chat()'s own check stops it.
    scope = InterruptScope("t")
    scope.cancel("early")
    with httpx.Client() as http, ChatClient(server.url, http_client=http) as client:
        with bind_scope(scope), pytest.raises(Interrupted) as info:
            client.chat(MESSAGES)
    assert info.value.reason == "early"
    assert server.connections == 0


def test_a_stalled_tls_handshake_is_cut() -> None:
    scope = InterruptScope("t")
    with StallServer() as server:
        client = ChatClient(server.url, timeout=LONG, connect_timeout=LONG)
        future = scope.spawn(client.chat, MESSAGES)
        assert server.hello.wait(BOUND)  # The ClientHello is out; no answer will come.
        scope.cancel("stop")
        # Nothing was sent to the provider yet: Interrupted, not a partial result.
        with pytest.raises(Interrupted) as info:
            future.result(BOUND)
        assert info.value.reason == "stop"
        assert server.closed.wait(BOUND)
        assert server.connections == 1
        assert_quiet(scope)
        client.close()


def test_a_connect_to_a_full_backlog_is_cut() -> None:
    scope = InterruptScope("t")
    with FullBacklog() as backlog:
        if not backlog.blocked:
            pytest.skip("could not make a loopback connect block here")
        started = connect_started(backlog.port)
        with ChatClient(backlog.url, timeout=LONG, connect_timeout=LONG) as client:
            future = scope.spawn(client.chat, MESSAGES)
            assert started.wait(BOUND)
            scope.cancel("stop")
            with pytest.raises(Interrupted):
                future.result(BOUND)
        assert_quiet(scope)


def test_the_next_chat_after_a_cut_in_a_new_scope_works() -> None:
    scope = InterruptScope("t")
    calls = []

    def handler(ex: Exchange) -> None:
        calls.append(ex.request.path)
        if len(calls) == 1:
            ex.sse([chunk("x")], stall=True)
        else:
            hello_stream(ex)

    with LoopbackServer(handler) as server, ChatClient(server.url) as client:
        future = scope.spawn(client.chat, MESSAGES)
        assert server.wait_requests(1)
        scope.cancel()
        assert future.result(BOUND).interrupted
        with bind_scope(InterruptScope("next")):
            assert client.chat(MESSAGES).text == "Hello world"
        assert server.connections == 2


# -- errors and retries ------------------------------------------------------


def test_an_http_500_with_an_html_body_is_a_status_error_with_an_excerpt() -> None:
    page = "<html><body>" + "Internal Server Error " * 50 + "</body></html>"

    def handler(ex: Exchange) -> None:
        ex.respond(500, page.encode(), content_type="text/html")

    with LoopbackServer(handler) as server, ChatClient(server.url, max_retries=0) as client:
        with pytest.raises(ProviderStatusError) as info:
            client.chat(MESSAGES)
    assert info.value.status_code == 500
    assert info.value.body == page[:200]
    assert "500" in str(info.value)


def test_retries_honour_retry_after_then_succeed() -> None:
    def handler(ex: Exchange) -> None:
        n = len(ex.server.requests)
        if n == 1:
            ex.json({"error": "slow down"}, 429, headers={"Retry-After": "0.3"})
        elif n == 2:
            ex.respond(502, b"bad gateway", content_type="text/plain", headers={"Retry-After": "0"})
        else:
            hello_stream(ex)

    with LoopbackServer(handler) as server, ChatClient(server.url) as client:
        result = client.chat(MESSAGES)
    assert result.text == "Hello world"
    assert result.usage.requests == 3
    first, second, _ = server.requests
    assert second.received_at - first.received_at >= 0.3


def test_retries_give_up_after_max_retries() -> None:
    def handler(ex: Exchange) -> None:
        ex.json({"error": "busy"}, 503, headers={"Retry-After": "0"})

    with LoopbackServer(handler) as server, ChatClient(server.url, max_retries=2) as client:
        with pytest.raises(ProviderStatusError) as info:
            client.chat(MESSAGES)
    assert info.value.status_code == 503
    assert len(server.requests) == 3


def test_a_client_error_is_not_retried() -> None:
    with LoopbackServer(lambda ex: ex.json({"error": "bad"}, 400)) as server:
        with ChatClient(server.url) as client, pytest.raises(ProviderStatusError) as info:
            client.chat(MESSAGES)
    assert info.value.status_code == 400
    assert len(server.requests) == 1


def test_no_retry_once_the_body_started() -> None:
    def handler(ex: Exchange) -> None:
        ex.start_chunked()
        ex.chunk(f"data: {json.dumps(chunk('x'))}\n\n".encode())
        ex.close()  # Drop the connection mid-stream.

    with LoopbackServer(handler) as server, ChatClient(server.url) as client:
        with pytest.raises(ProviderConnectionError):
            client.chat(MESSAGES)
    assert len(server.requests) == 1


def test_malformed_sse_is_a_response_error() -> None:
    with LoopbackServer(lambda ex: ex.sse(["data: {not json\n\n"])) as server:
        with ChatClient(server.url) as client, pytest.raises(ProviderResponseError, match="JSON"):
            client.chat(MESSAGES)
    assert len(server.requests) == 1


def test_an_error_event_in_the_stream_is_a_response_error() -> None:
    with LoopbackServer(lambda ex: ex.sse(['event: error\ndata: {"message": "ctx"}\n\n'])) as s:
        with ChatClient(s.url) as client, pytest.raises(ProviderResponseError, match="ctx"):
            client.chat(MESSAGES)


def test_a_non_json_whole_response_is_a_response_error() -> None:
    with LoopbackServer(lambda ex: ex.respond(200, b"<html>hi</html>")) as server:
        with ChatClient(server.url, wire_stream=False) as client:
            with pytest.raises(ProviderResponseError, match="not JSON"):
                client.chat(MESSAGES)


def test_connection_refused_names_the_url() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with ChatClient(url, max_retries=0) as client:
        with pytest.raises(ProviderConnectionError, match=f"{url}/chat/completions") as info:
            client.chat(MESSAGES)
    assert info.value.url == f"{url}/chat/completions"


def test_a_server_that_never_answers_is_a_timeout() -> None:
    with LoopbackServer(lambda ex: ex.hold()) as server:
        with ChatClient(server.url, timeout=0.3) as client, pytest.raises(ProviderTimeout):
            client.chat(MESSAGES)
        assert server.wait_closes(1)
    assert len(server.requests) == 1


def test_a_closed_client_refuses_to_chat(server: LoopbackServer) -> None:
    client = ChatClient(server.url)
    client.close()
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.chat(MESSAGES)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_url": ""},
        {"base_url": "127.0.0.1:8080/v1"},
        {"base_url": "ftp://127.0.0.1/v1"},
        {"base_url": "http://"},
        {"timeout": 0},
        {"timeout": float("inf")},
        {"timeout": float("nan")},
        {"timeout": True},
        {"connect_timeout": -1},
        {"connect_timeout": 1e12},
        {"max_retries": -1},
        {"max_retries": 2.5},
        {"max_retries": True},
        {"max_retries": "2"},
    ],
)
def test_bad_settings_are_refused_in_one_line_naming_the_argument(kwargs: dict[str, Any]) -> None:
    settings = {"base_url": "http://127.0.0.1:9", **kwargs}
    with pytest.raises(ValueError, match=next(iter(kwargs))) as info:
        ChatClient(**settings)
    assert "\n" not in str(info.value)


def test_a_redirect_to_a_scheme_it_cannot_speak_is_not_retried() -> None:
    def to_ftp(ex: Exchange) -> None:
        ex.respond(307, b"", headers={"Location": "ftp://127.0.0.1/x"})

    with LoopbackServer(to_ftp) as server, httpx.Client(follow_redirects=True) as http:
        with ChatClient(server.url, http_client=http, max_retries=3) as client:
            with pytest.raises(ProviderConnectionError) as info:
                client.chat(MESSAGES)
    assert not info.value.retryable
    assert len(server.requests) == 1


def test_a_certificate_that_does_not_verify_is_not_retried(tmp_path: Path) -> None:
    made = self_signed(tmp_path)
    if made is None:
        pytest.skip("needs the openssl command")
    with LoopbackServer(hello_stream, ssl_context=made[0]) as server:
        with ChatClient(server.url, max_retries=3) as client:  # Trusts only the system's CAs.
            with pytest.raises(ProviderConnectionError, match="CERTIFICATE_VERIFY_FAILED") as info:
                client.chat(MESSAGES)
        assert server.wait_closes(1)
        assert server.connections == 1
    assert not info.value.retryable


_sse_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=30
)


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.lists(_sse_text, min_size=1, max_size=3), st.booleans(), st.booleans()),
        max_size=8,
    )
)
def test_iter_sse_round_trips_any_events(events: list[tuple[list[str], bool, bool]]) -> None:
    """Whatever data an event carries, split over lines and among comments, comes back whole."""
    lines: list[str] = []
    for data_lines, comment, named in events:
        if comment:
            lines.append(": keep-alive")
        if named:
            lines.append("event: message")
        lines.extend(f"data: {line}" for line in data_lines)
        lines.append("")
    parsed = list(iter_sse(lines))
    assert [event.data for event in parsed] == ["\n".join(d) for d, _, _ in events]


def test_a_404_from_a_base_url_without_v1_says_to_try_v1() -> None:
    # The simulator serves /v1/chat/completions: /chat/completions at its root is a 404,
    # as llama.cpp, vLLM and Ollama answer a URL given without its /v1.
    with SimulatorServer(SimConfig()) as sim:
        root = sim.base_url.removesuffix("/v1")
        with ChatClient(root, max_retries=0) as client, pytest.raises(ProviderStatusError) as bad:
            client.chat(MESSAGES, max_tokens=2)
        with ChatClient(sim.base_url + "/nope", max_retries=0) as client:
            with pytest.raises(ProviderStatusError) as versioned:
                client.chat(MESSAGES, max_tokens=2)
    assert bad.value.status_code == 404
    assert str(bad.value).endswith(f"usually ends in /v1: try {root}/v1)")
    assert versioned.value.status_code == 404
    assert "usually ends in /v1" not in str(versioned.value)  # it has its /v1
