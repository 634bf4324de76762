"""A hostile provider: answers without end, lines without end, JSON nested without end.

Each case runs ``ChatClient`` (or the whole console) against a loopback
server that sends what a broken or hostile provider could: a 300 MiB body,
a body that never ends, an SSE line that never ends, a reply past any real
one, ``[[[[…`` a thousand levels deep. Each must fail with one
``ProviderResponseError`` line, and the request must be cut: the server sees
the connection close. That memory stays bounded meanwhile is measured by
``bench/bench_provider_bounds.py``, not asserted here.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from _console import ConsoleClient
from _loopback import Exchange, LoopbackServer
from _support import BOUND
from wirecut import _json
from wirecut.agent import http_get_tool
from wirecut.agent._builtins import MAX_FETCH_BYTES
from wirecut.console.server import ConsoleConfig, ConsoleServer
from wirecut.launch import Provider
from wirecut.provider import (
    ChatClient,
    ProviderResponseError,
    ResponseLimits,
    SseDecoder,
    Usage,
    iter_lines,
    iter_sse,
)

MESSAGES = [{"role": "user", "content": "hi"}]
MiB = 1 << 20


def chunk(content: str) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": content}}],
    }


def stop_chunk() -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    }


def chunked(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def send_forever(ex: Exchange, head: bytes, piece: bytes, stop: threading.Event) -> None:
    """Send ``head``, then ``piece`` as chunks until the client goes away (or ``stop``)."""
    frame = chunked(piece)
    try:
        ex.conn.sendall(head)
        while not stop.is_set():
            ex.conn.sendall(frame)
    except OSError:
        # EPIPE or ECONNRESET: the client closed the connection, which is
        # what the tests wait for (a client that only stopped reading would
        # leave sendall blocked instead).
        if not stop.is_set():
            ex.server._record_close(ex.request.connection)
    ex.close()


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # A failing test must not leave a sender running.


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
JSON_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def fails_with_one_line(client: ChatClient, **params: Any) -> ProviderResponseError:
    with pytest.raises(ProviderResponseError) as caught:
        client.chat(MESSAGES, **params)
    message = str(caught.value)
    assert "\n" not in message
    assert len(message) < 500
    return caught.value


# -- a body ------------------------------------------------------------------------------


def test_a_declared_300_mib_body_is_refused_before_it_is_read_and_the_request_is_cut() -> None:
    def huge(ex: Exchange) -> None:
        ex.send(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: 314572800\r\n\r\n" + b"[" * 65536
        )
        ex.hold()  # Sends no more; returns when the client closes.

    with LoopbackServer(huge) as server, ChatClient(server.url) as client:
        error = fails_with_one_line(client, wire_stream=False)
        assert server.wait_closes(1, BOUND)
    assert "314572800 bytes, more than 33554432 (ResponseLimits.body_bytes)" in str(error)
    assert error.usage == Usage(None, None, None, requests=1)


def test_a_body_without_end_fails_at_the_body_bound_and_the_request_is_cut(
    stop: threading.Event,
) -> None:
    with LoopbackServer(lambda ex: send_forever(ex, JSON_HEAD, b"[" * 65536, stop)) as server:
        with ChatClient(server.url) as client:
            error = fails_with_one_line(client, wire_stream=False)
            assert server.wait_closes(1, BOUND)
    assert "longer than 33554432 bytes (ResponseLimits.body_bytes)" in str(error)


def test_a_server_that_ignores_stream_true_is_bound_by_the_body_limit_too(
    stop: threading.Event,
) -> None:
    limits = ResponseLimits(body_bytes=MiB)
    with LoopbackServer(lambda ex: send_forever(ex, JSON_HEAD, b" " * 4096, stop)) as server:
        with ChatClient(server.url, limits=limits) as client:
            error = fails_with_one_line(client)  # asked to stream; answers one body
            assert server.wait_closes(1, BOUND)
    assert f"longer than {MiB} bytes" in str(error)


def test_a_body_just_under_the_bound_is_read() -> None:
    text = "x" * 1000
    body = json.dumps(
        {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
    ).encode()

    def answer(ex: Exchange) -> None:
        ex.respond(200, body)

    limits = ResponseLimits(body_bytes=len(body))
    with LoopbackServer(answer) as server, ChatClient(server.url, limits=limits) as client:
        assert client.chat(MESSAGES, wire_stream=False).text == text
    with LoopbackServer(answer) as server:
        small = ResponseLimits(body_bytes=len(body) - 1)
        with ChatClient(server.url, limits=small) as client:
            fails_with_one_line(client, wire_stream=False)


# -- an event stream -------------------------------------------------------------------------


def test_an_sse_line_without_end_fails_at_the_line_bound_and_the_request_is_cut(
    stop: threading.Event,
) -> None:
    def endless_line(ex: Exchange) -> None:
        send_forever(ex, SSE_HEAD + chunked(b"data: [[[["), b"[" * 65536, stop)

    with LoopbackServer(endless_line) as server, ChatClient(server.url) as client:
        error = fails_with_one_line(client)
        assert server.wait_closes(1, BOUND)
    assert "longer than 8388608 bytes (ResponseLimits.line_bytes)" in str(error)
    assert error.usage == Usage(None, 0, None, requests=1)


def test_an_event_of_many_data_lines_is_bound_as_one(stop: threading.Event) -> None:
    limits = ResponseLimits(line_bytes=64 * 1024)
    piece = b"data: " + b"x" * 1000 + b"\n"
    with LoopbackServer(lambda ex: send_forever(ex, SSE_HEAD, piece * 8, stop)) as server:
        with ChatClient(server.url, limits=limits) as client:
            error = fails_with_one_line(client)
            assert server.wait_closes(1, BOUND)
    assert "an event's data is longer than 65536 characters" in str(error)


def test_a_reply_past_the_reply_bound_fails_and_keeps_what_it_counted(
    stop: threading.Event,
) -> None:
    limits = ResponseLimits(reply_chars=10_000)
    event = f"data: {json.dumps(chunk('word '))}\n\n".encode()
    with LoopbackServer(lambda ex: send_forever(ex, SSE_HEAD, event, stop)) as server:
        with ChatClient(server.url, limits=limits) as client:
            tokens: list[str] = []
            error = fails_with_one_line(client, on_token=tokens.append)
            assert server.wait_closes(1, BOUND)
    assert "the reply is longer than 10000 characters (ResponseLimits.reply_chars)" in str(error)
    # What arrived up to the bound is counted: 2,000 deltas of 5 characters, and the one past it.
    assert error.usage == Usage(None, 2001, None, requests=1, estimated=True)
    assert len(tokens) == 2000


def test_a_reply_bound_counts_tool_call_arguments() -> None:
    def calls(ex: Exchange) -> None:
        call = {"index": 0, "id": "c", "function": {"name": "f", "arguments": "a" * 600}}
        delta = {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}
        ex.sse([delta, delta])

    with LoopbackServer(calls) as server:
        with ChatClient(server.url, limits=ResponseLimits(reply_chars=1000)) as client:
            fails_with_one_line(client)


def test_output_after_done_is_not_read_without_end(stop: threading.Event) -> None:
    # The answer is whole at [DONE]; a server that then sends forever costs
    # the connection, not the answer, and not the worker's time.
    done = f"data: {json.dumps(chunk('ok'))}\n\ndata: [DONE]\n\n".encode()
    head = SSE_HEAD + chunked(done)
    with LoopbackServer(lambda ex: send_forever(ex, head, b": ping\n\n", stop)) as server:
        with ChatClient(server.url) as client:
            assert client.chat(MESSAGES).text == "ok"
        assert server.wait_closes(1, BOUND)


# -- nested JSON ---------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [65, 1100, 100_000])
def test_deeply_nested_json_in_an_event_is_a_response_error_not_a_recursion_error(
    depth: int,
) -> None:
    def nested(ex: Exchange) -> None:
        ex.sse([chunk("a"), "data: " + "[" * depth + "]" * depth + "\n\n"])

    with LoopbackServer(nested) as server, ChatClient(server.url) as client:
        error = fails_with_one_line(client)
    assert "JSON nested more than 64 levels deep" in str(error)
    assert not isinstance(error.__cause__, RecursionError)
    assert error.usage == Usage(None, 1, None, requests=1, estimated=True)


@pytest.mark.parametrize(("extra", "read"), [(63, True), (64, False)])
def test_an_event_nested_exactly_to_the_json_bound_is_read_and_one_level_more_is_not(
    extra: int, read: bool
) -> None:
    # The event is an object (one level) with a field nested ``extra`` levels
    # more: 63 makes it exactly MAX_DEPTH deep, 64 one past it.
    assert _json.MAX_DEPTH == 64
    event = json.dumps(chunk("deep"))[:-1] + ', "x": ' + "[" * extra + "]" * extra + "}"

    def deep(ex: Exchange) -> None:
        ex.sse([chunk("a"), "data: " + event + "\n\n", stop_chunk()])

    with LoopbackServer(deep) as server, ChatClient(server.url) as client:
        if read:
            assert client.chat(MESSAGES).text == "adeep"
        else:
            error = fails_with_one_line(client)
            assert "JSON nested more than 64 levels deep" in str(error)


def test_deeply_nested_json_in_a_body_is_a_response_error() -> None:
    with LoopbackServer(lambda ex: ex.respond(200, b'{"choices": ' + b"[" * 5000)) as server:
        with ChatClient(server.url) as client:
            error = fails_with_one_line(client, wire_stream=False)
    assert "JSON nested more than 64 levels deep" in str(error)


def test_json_of_ordinary_depth_is_read() -> None:
    deep = {"a": [[[[[[[[{"b": 1}]]]]]]]]}
    assert _json.loads(json.dumps(deep)) == deep
    value = _json.loads("[" * 64 + "]" * 64)
    for _ in range(63):
        (value,) = value
    assert value == []


@pytest.mark.parametrize(
    "text", ["[" * 65 + "]" * 65, '{"a":' * 3000 + "1" + "}" * 3000, "[" * 10**6]
)
def test_safe_loads_refuses_deep_nesting_in_one_line(text: str) -> None:
    with pytest.raises(_json.JSONError, match=r"^JSON nested more than 64 levels deep$"):
        _json.loads(text)


# -- through the console -------------------------------------------------------------------


def test_a_chat_against_an_endless_line_completes_as_an_error_and_the_console_serves_on(
    tmp_path: Path, stop: threading.Event
) -> None:
    def endless_line(ex: Exchange) -> None:
        send_forever(ex, SSE_HEAD + chunked(b"data: "), b"x" * 65536, stop)

    with LoopbackServer(endless_line) as server:
        provider = Provider(server.url, None, "hostile (tests)")
        config = ConsoleConfig(port=0, data_dir=tmp_path)
        with ConsoleServer(config, provider) as console, ConsoleClient(console.ws_url) as client:
            complete = client.complete(client.run("chat hello"))
            assert server.wait_closes(1, BOUND)
            assert client.complete(client.run("memory list"))["status"] == "ok"
    assert complete["status"] == "error"
    assert complete["error"].startswith("chat failed: an event-stream line is longer than")
    assert "\n" not in complete["error"]
    assert complete["usage"]["requests"] == 1
    assert complete["lifecycle"]["open_requests"] == 0


# -- a page fetched by the http_get tool ------------------------------------------------------


def test_http_get_reads_at_most_its_bound_of_a_page_without_end(stop: threading.Event) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
    with LoopbackServer(lambda ex: send_forever(ex, head, b"y" * 65536, stop)) as server:
        answer = http_get_tool().call(json.dumps({"url": server.url + "/page"}))
        assert server.wait_closes(1, BOUND)
    assert answer.startswith("HTTP 200\n" + "y" * 100)
    assert answer.endswith(
        f"the page is longer than {MAX_FETCH_BYTES} bytes; the rest was not read]"
    )
    assert len(answer) < MAX_FETCH_BYTES


# -- the line splitter ----------------------------------------------------------------------


def reference_lines(data: bytes) -> list[str]:
    parts = re.split(rb"\r\n|\r|\n", data)
    if parts and parts[-1] == b"":
        parts.pop()
    return [part.decode("utf-8", "replace") for part in parts]


@given(st.binary(max_size=60).map(lambda b: bytes(b"ab\r\n"[x % 4] for x in b)), st.data())
def test_iter_lines_splits_at_crlf_lf_and_cr_however_the_chunks_fall(
    data: bytes, draw: st.DataObject
) -> None:
    cuts = sorted(draw.draw(st.lists(st.integers(0, len(data)), max_size=6)))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    assert list(iter_lines(chunks)) == reference_lines(data)


def test_iter_lines_raises_before_holding_more_than_its_bound_plus_a_chunk() -> None:
    seen: list[int] = []

    def chunks() -> Iterator[bytes]:
        for _ in range(100):
            seen.append(1)
            yield b"x" * 100

    with pytest.raises(ProviderResponseError, match="longer than 1000 bytes"):
        list(iter_lines(chunks(), max_line_bytes=1000))
    assert len(seen) == 11


def test_iter_sse_keeps_its_plain_form() -> None:
    assert [e.data for e in iter_sse(["data: a", "", "data: b"])] == ["a", "b"]


# -- the decoder that a streamed reply goes through, a read at a time -------------------------

_SSE_BYTES = b"data: x\r\nevent: e\nid: 7\n: note\n\ndata:y\r\rdata: \xc3\xa9\n\n\xff"


@given(
    st.lists(
        st.sampled_from([b"data: ", b"a", b"\r", b"\n", b": c", b"event: e", b"\xc3"]), max_size=25
    ),
    st.data(),
)
def test_the_decoder_equals_iter_sse_of_iter_lines_however_the_reads_fall(
    pieces: list[bytes], draw: st.DataObject
) -> None:
    data = b"".join(pieces) + _SSE_BYTES
    cuts = sorted(draw.draw(st.lists(st.integers(0, len(data)), max_size=8)))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    decoder = SseDecoder()
    events = [event for chunk in chunks for event in decoder.feed(chunk)] + decoder.end()
    assert events == list(iter_sse(iter_lines([data])))


def test_the_decoder_raises_at_a_line_past_its_bound() -> None:
    decoder = SseDecoder(max_line_bytes=1000)
    for _ in range(10):
        decoder.feed(b"x" * 100)  # a line of 1000 bytes, not ended yet: within the bound
    with pytest.raises(ProviderResponseError, match="longer than 1000 bytes"):
        decoder.feed(b"x" * 100)


def test_the_decoder_raises_at_an_event_past_its_bound() -> None:
    decoder = SseDecoder(max_data_chars=10)
    with pytest.raises(ProviderResponseError, match="longer than 10 characters"):
        decoder.feed(b"data: 123456\ndata: 7890\n")
