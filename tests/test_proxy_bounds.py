"""``wirecut proxy`` against hostile clients and upstreams: one of them never stalls the rest.

End to end through real sockets, as tests/test_proxy.py: a ``ProxyServer``
(real uvicorn) in front of the simulator or a scripted ``LoopbackServer``,
clients on raw sockets, httpx and the openai SDK, the CLI as a process.
What the upstream saw is read from its own record; what the proxy decided
from its ``proxy.jsonl``. Waits are bounded and wake on the event.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import select
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from _loopback import Exchange, LoopbackServer
from test_proxy import (
    BOUND,
    ENDLESS,
    MESSAGES,
    Command,
    Setup,
    chat,
    post,
    proxied,
    read_response,
)
from wirecut.provider import ResponseLimits
from wirecut.proxy import PROXY_CONNECTION_LIMITS, ProxyConfig, ProxyServer, RecordReason
from wirecut.serving import ConnectionLimits
from wirecut.simulator import EventKind, SimConfig, SimulatorServer


@contextlib.contextmanager
def behind(handler: Any, tmp_path: Path, **config: Any) -> Iterator[tuple[LoopbackServer, Setup]]:
    """A proxy in front of a scripted upstream (``LoopbackServer``)."""
    with LoopbackServer(handler) as upstream:
        proxy_config = ProxyConfig(
            upstream=upstream.url + "/v1", port=0, data_dir=tmp_path, **config
        )
        with ProxyServer(proxy_config) as proxy:
            yield upstream, Setup(None, proxy, tmp_path)  # type: ignore[arg-type]


def chunk(content: str | None, *, index: int = 0, finish: str | None = None) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    return {"id": "c", "object": "chat.completion.chunk", "model": "u", "choices": [choice]}


def posts(upstream: LoopbackServer) -> list[Any]:
    return [r for r in upstream.requests if r.method == "POST"]


def slow_reader(port: int, head: bytes = b"") -> socket.socket:
    """A raw client with a small receive buffer that sent a streaming chat (``head``: headers).

    The buffer is set before the connect, so the window it offers is small:
    the proxy's sends to it block soon unless it reads.
    """
    conn = socket.socket()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.connect(("127.0.0.1", port))
    body = json.dumps(chat(stream=True)).encode()
    conn.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + head
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
    )
    return conn


# -- one body must not freeze the proxy ---------------------------------------------------------


def test_a_body_over_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    with proxied(tmp_path, max_body_bytes=1024) as setup:
        conn = socket.create_connection(("127.0.0.1", setup.proxy.port), timeout=BOUND)
        # Announces 24 MiB and sends none of it: the answer comes anyway.
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 25165824\r\n\r\n"
        )
        status, _, body = read_response(conn)
        conn.close()
        assert len(setup.sim.requests()) == 0
    assert status == 413
    assert "--max-body-bytes" in json.loads(body)["error"]["message"]


def test_a_large_body_is_parsed_off_the_loop_while_health_answers(tmp_path: Path) -> None:
    # About 4 MiB of nested empty lists: a parse that held the loop for
    # seconds when the proxy parsed it where it arrived.
    nested = b'{"model": "m", "x": [' + b"[]," * 1_300_000 + b"[]]}"
    with proxied(tmp_path) as setup:
        conn = post(setup.proxy.port, nested)
        answered: list[str] = []

        def health() -> None:
            setup.health()
            answered.append("health")

        with ThreadPoolExecutor(1) as pool:
            asked = pool.submit(health)
            status, _, body = read_response(conn)
            answered.append("body")
            asked.result(BOUND)
        conn.close()
        assert len(setup.sim.requests()) == 0
    assert status == 400
    assert "message objects" in json.loads(body)["error"]["message"]
    assert answered == ["health", "body"]  # /health did not wait for the parse.


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"model": "m", "messages": ' + b"[" * 100 + b"]" * 100 + b"}", "nested more than"),
        (b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested"),
        (
            json.dumps(
                {"model": "m", "messages": [{"role": "user", "content": "\ud83d"}]}
            ).encode(),
            "lone UTF-16 surrogate (\\ud83d)",
        ),
    ],
    ids=["deep", "very-deep", "lone-surrogate"],
)
def test_a_body_the_upstream_could_not_take_is_a_400_in_one_line(
    tmp_path: Path, body: bytes, words: str
) -> None:
    with proxied(tmp_path) as setup:
        conn = post(setup.proxy.port, body)
        status, _, raw = read_response(conn)
        conn.close()
        after = httpx.post(setup.proxy.base_url + "/chat/completions", json=chat(), timeout=BOUND)
        assert len(setup.sim.requests()) == 1  # Only the good one.
    message = json.loads(raw)["error"]["message"]
    assert status == 400
    assert words in message
    assert "\n" not in message
    assert after.status_code == 200


# -- a client that stops reading --------------------------------------------------------------


def test_a_client_that_stops_reading_holds_no_answer_and_cancel_by_id_cuts_it(
    tmp_path: Path,
) -> None:
    stalled = threading.Event()
    event = b"data: " + json.dumps(chunk("x" * 1000)).encode() + b"\n\n"
    frame = f"{len(event):x}\r\n".encode() + event + b"\r\n"

    def flood(ex: Exchange) -> None:
        # 64 MiB, then the end: all of it fits only in a proxy that buffers.
        # The socket is non-blocking so that the upstream sees the moment
        # the proxy stops taking what it writes (its buffers are full).
        ex.start_chunked()
        ex.conn.setblocking(False)
        pending = frame * 4096
        for _ in range(16):
            view = memoryview(pending)
            while view:
                try:
                    view = view[ex.conn.send(view) :]
                except BlockingIOError:
                    stalled.set()
                    select.select([], [ex.conn], [], BOUND)
                except OSError:
                    return  # The proxy closed: the cut reached the upstream.
        ex.conn.setblocking(True)
        ex.chunk(b"data: [DONE]\n\n")
        ex.end_chunked()

    with behind(flood, tmp_path) as (upstream, setup):
        conn = slow_reader(setup.proxy.port, b"X-Request-Id: slow\r\n")
        assert stalled.wait(BOUND)  # The upstream waits for the proxy, which waits for us.
        answer = httpx.post(setup.proxy.base_url + "/requests/slow/cancel", timeout=BOUND)
        assert upstream.wait_closes(1, BOUND)
        conn.close()
    assert answer.status_code == 200
    assert (answer.json()["status"], answer.json()["reason"]) == ("cancelled", "cancel")


def test_a_client_that_reads_slowly_gets_the_whole_stream_in_order(tmp_path: Path) -> None:
    # Far more than every buffer between the upstream and the client holds:
    # the relay stops and starts reading the upstream many times.
    events = [chunk(f"{n:06d}" + "z" * 2000) for n in range(3000)]

    with behind(lambda ex: ex.sse(events), tmp_path) as (_, setup):
        conn = slow_reader(setup.proxy.port)
        conn.settimeout(BOUND)
        status, _, raw = read_response(conn)
        conn.close()
        record = setup.record()
    assert status == 200
    got = [json.loads(line[6:]) for line in raw.split(b"\n\n") if line.startswith(b"data: {")]
    assert [c["choices"][0]["delta"]["content"][:6] for c in got] == [
        f"{n:06d}" for n in range(3000)
    ]
    assert raw.endswith(b"data: [DONE]\n\n")
    assert (record["status"], record["usage"]["completion_tokens"]) == ("ok", 3000)


# -- what the upstream sends back is bounded ---------------------------------------------------


def test_an_upstream_answer_past_the_bound_is_a_502_and_the_upstreams_error(
    tmp_path: Path,
) -> None:
    def big(ex: Exchange) -> None:
        ex.sse([chunk("y" * 1000) for _ in range(200)], done=True)

    limits = ResponseLimits(body_bytes=64 * 1024)
    with behind(big, tmp_path, response_limits=limits) as (_, setup):
        response = httpx.post(
            setup.proxy.base_url + "/chat/completions", json=chat(), timeout=BOUND
        )
        record = setup.record()
    assert response.status_code == 502
    assert "65536 bytes" in response.json()["error"]["message"]
    assert (record["status"], record["reason"]) == ("error", "upstream")


def test_a_passthrough_answer_past_the_bound_is_a_502(tmp_path: Path) -> None:
    def models(ex: Exchange) -> None:
        ex.json({"data": [{"id": "m" * 1000}] * 100})

    limits = ResponseLimits(body_bytes=4096)
    with behind(models, tmp_path, response_limits=limits) as (_, setup):
        response = httpx.get(setup.proxy.base_url + "/models", timeout=BOUND)
    assert response.status_code == 502
    assert "4096" in response.json()["error"]["message"]


# -- /health and what the upstream is ------------------------------------------------------------


def test_health_never_waits_for_the_upstream(tmp_path: Path) -> None:
    # The upstream takes every connection and answers nothing: each probe
    # waits for its bound. /health answers from what is known meanwhile.
    with behind(lambda ex: ex.hold(), tmp_path) as (upstream, setup):
        before = len(upstream.requests)
        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda _: setup.health(), range(20)))
        during = len(upstream.requests) - before
    assert {a["upstream"]["kind"] for a in answers} == {"unreachable"}
    assert during <= 3  # The background probe's, at most: none for the 20 calls.


def test_slots_are_learnt_once_an_upstream_that_was_down_comes_up(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    config = ProxyConfig(upstream=f"http://127.0.0.1:{port}/v1", port=0, data_dir=tmp_path)
    with ProxyServer(config) as proxy:
        setup = Setup(None, proxy, tmp_path)  # type: ignore[arg-type]
        assert setup.health()["upstream"] == {
            "url": f"http://127.0.0.1:{port}/v1",
            "kind": "unreachable",
            "slots": None,
        }
        with SimulatorServer(SimConfig(slots=2), port=port):
            learnt = setup.wait_health(lambda h: h["upstream"]["slots"] == 2)
    assert learnt["upstream"]["kind"] == "llama.cpp"


def test_slots_are_learnt_once_the_upstream_stops_loading(tmp_path: Path) -> None:
    loading = threading.Event()
    loading.set()

    def llama(ex: Exchange) -> None:
        if loading.is_set():  # llama-server while it loads its model
            ex.json({"error": {"code": 503, "message": "Loading model"}}, status=503)
        elif ex.request.path == "/slots":
            ex.json([{"id": 0, "is_processing": False}, {"id": 1, "is_processing": False}])
        else:
            ex.json({}, status=404)

    with behind(llama, tmp_path) as (_, setup):
        assert setup.health()["upstream"]["kind"] == "loading"
        assert setup.health()["upstream"]["slots"] is None
        loading.clear()
        learnt = setup.wait_health(lambda h: h["upstream"]["slots"] == 2)
    assert learnt["upstream"]["kind"] == "llama.cpp"


# -- what SDKs read as final -------------------------------------------------------------------


def test_the_openai_sdk_does_not_send_a_timed_out_request_again(tmp_path: Path) -> None:
    with proxied(tmp_path, ENDLESS, request_timeout=0.3) as setup:
        client = setup.sdk(max_retries=2)  # The SDK's own retry logic, as shipped.
        with pytest.raises(openai.APIStatusError) as raised:
            client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        (only,) = setup.sim.requests()
        setup.sim.wait_for_event(EventKind.PEER_CLOSED, only.id, timeout=BOUND)
    assert raised.value.status_code == 504
    assert raised.value.response.headers["x-should-retry"] == "false"


# -- the stream's end -------------------------------------------------------------------------


def test_done_ends_the_request_though_the_upstream_keeps_its_response_open(
    tmp_path: Path,
) -> None:
    def done_then_hold(ex: Exchange) -> None:
        ex.start_chunked()
        ex.chunk(b"data: " + json.dumps(chunk("hi", finish="stop")).encode() + b"\n\n")
        ex.chunk(b"data: [DONE]\n\n")
        ex.hold()  # No end of the body: the connection stays open.

    with behind(done_then_hold, tmp_path, upstream_slots=1, request_timeout=30) as (
        upstream,
        setup,
    ):
        client = setup.sdk(max_retries=0)
        first = client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        second = client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        setup.wait_health(lambda _: len(setup.records()) == 2)
        records = setup.records()
        assert upstream.wait_closes(2, BOUND)  # Not reusable: closed, not left hanging.
    assert first.choices[0].message.content == second.choices[0].message.content == "hi"
    assert [(r["status"], r["reason"]) for r in records] == [("ok", None), ("ok", None)]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_a_stream_that_ends_before_every_choice_finished_is_the_upstreams_error(
    tmp_path: Path, stream: bool
) -> None:
    def half(ex: Exchange) -> None:
        # n=2; choice 1 never finishes, and the stream ends without [DONE].
        ex.sse(
            [chunk("a", index=0), chunk("b", index=1), chunk(None, index=0, finish="stop")],
            done=False,
        )

    with behind(half, tmp_path) as (_, setup):
        response = httpx.post(
            setup.proxy.base_url + "/chat/completions", json=chat(n=2, stream=stream), timeout=BOUND
        )
        record = setup.record()
    assert (record["status"], record["reason"]) == ("error", "upstream")
    if stream:
        assert "data: [DONE]" not in response.text  # None invented.
        assert "every choice" in response.text
    else:
        assert response.status_code == 502


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_a_deeply_nested_upstream_event_is_the_upstreams_error(
    tmp_path: Path, stream: bool
) -> None:
    deep = "data: " + '{"choices": [{"finish_reason": "stop", "x": ' + "[" * 5000 + "]" * 5000
    deep += "}]}\n\n"

    with behind(lambda ex: ex.sse([deep]), tmp_path) as (_, setup):
        response = httpx.post(
            setup.proxy.base_url + "/chat/completions", json=chat(stream=stream), timeout=BOUND
        )
        record = setup.record()
    assert (record["status"], record["reason"]) == ("error", "upstream")
    assert "nested too deeply" in response.text
    if not stream:
        assert response.status_code == 502


# -- secrets and paths --------------------------------------------------------------------------


def test_credentials_in_the_upstream_url_go_with_every_request_and_are_never_shown(
    tmp_path: Path,
) -> None:
    def answer(ex: Exchange) -> None:
        if ex.request.method == "POST":
            ex.sse([chunk("ok", finish="stop")])
        else:
            ex.json({"data": []})

    with LoopbackServer(answer) as upstream:
        url = upstream.url.replace("://", "://alice:s3cr%40t@") + "/v1"
        config = ProxyConfig(upstream=url, port=0, data_dir=tmp_path)
        with ProxyServer(config) as proxy:
            health = httpx.get(proxy.url + "/health", timeout=BOUND).text
            models = httpx.get(proxy.base_url + "/models", timeout=BOUND)
            done = httpx.post(proxy.base_url + "/chat/completions", json=chat(), timeout=BOUND)
        sent = {r.headers.get("authorization") for r in upstream.requests}
    assert models.status_code == done.status_code == 200
    assert sent == {"Basic YWxpY2U6czNjckB0"}  # alice:s3cr@t, on probes, GETs and POSTs
    assert "s3cr" not in health
    assert "alice" not in health


def test_credentials_never_show_in_an_error_about_the_upstream(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    url = f"http://alice:s3cret@127.0.0.1:{port}/v1"
    with ProxyServer(ProxyConfig(upstream=url, port=0, data_dir=tmp_path)) as proxy:
        completion = httpx.post(proxy.base_url + "/chat/completions", json=chat(), timeout=BOUND)
        models = httpx.get(proxy.base_url + "/models", timeout=BOUND)
    assert completion.status_code == models.status_code == 502
    for text in (completion.text, models.text):
        assert "s3cret" not in text
        assert f"127.0.0.1:{port}" in text


def test_credentials_in_the_url_and_an_api_key_together_are_refused_in_one_line(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "wirecut", "proxy", "--data-dir", str(tmp_path)),
            *("--upstream", "http://alice:s3cret@127.0.0.1:9/v1"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OPENAI_API_KEY": "sk-other"},
    )
    assert result.returncode == 2
    assert "give the upstream's credentials one way" in result.stderr
    assert "s3cret" not in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "path", ["/v1/%2E%2E/slots", "/v1/%2e%2e/metrics", "/v1/./../slots", "/v1/a/../../slots"]
)
def test_a_passthrough_path_never_leaves_v1(tmp_path: Path, path: str) -> None:
    with behind(lambda ex: ex.json({"reached": ex.request.path}), tmp_path) as (upstream, setup):
        before = len(upstream.requests)
        conn = socket.create_connection(("127.0.0.1", setup.proxy.port), timeout=BOUND)
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        status, _, _ = read_response(conn)
        conn.close()
        reached = upstream.requests[before:]
    assert status == 404
    assert reached == []


# -- the first reason wins --------------------------------------------------------------------


def test_the_first_cancel_reason_wins(tmp_path: Path) -> None:
    # A request timed out and, in the same turn of the loop, its client left:
    # it is recorded as timed out.
    with proxied(tmp_path, ENDLESS) as setup:
        conn = post(setup.proxy.port, chat(stream=True), headers={"X-Request-Id": "t"})
        setup.sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)
        exchange = setup.proxy.proxy.live["t"]
        proxy_loop = setup.proxy.loop

        async def both() -> tuple[bool, bool]:
            return exchange.cancel(RecordReason.TIMEOUT), exchange.cancel(RecordReason.DISCONNECT)

        first, second = asyncio.run_coroutine_threadsafe(both(), proxy_loop).result(BOUND)
        record = setup.record("t")
        conn.close()
    assert (first, second) == (True, False)
    assert (record["status"], record["reason"]) == ("timeout", "timeout")


# -- connections: the console's guards (wirecut.serving), on the proxy's httptools ---------------


def limits(**changes: Any) -> ConnectionLimits:
    return dataclasses.replace(PROXY_CONNECTION_LIMITS, **changes)


def test_a_connection_that_never_finishes_its_head_is_closed(tmp_path: Path) -> None:
    with proxied(tmp_path, connection_limits=limits(head_timeout=0.3)) as setup:
        conn = socket.create_connection(("127.0.0.1", setup.proxy.port), timeout=BOUND)
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: ")
        assert conn.recv(65536) == b""  # Closed by the proxy, not by our timeout.
        conn.close()
        metrics = httpx.get(setup.proxy.url + "/metrics", timeout=BOUND).text
    assert 'wirecut_connections_dropped_total{why="head_timeout"} 1.0' in metrics


def test_at_the_cap_an_idle_connection_makes_room_for_a_request(tmp_path: Path) -> None:
    with proxied(tmp_path, connection_limits=limits(max_connections=8)) as setup:
        idle = [
            socket.create_connection(("127.0.0.1", setup.proxy.port), timeout=BOUND)
            for _ in range(8)
        ]
        setup.wait_health(lambda _: True)  # The ninth connection: answered.
        assert idle[0].recv(1) == b""  # The oldest idle one made room.
        for conn in idle:
            conn.close()
        metrics = httpx.get(setup.proxy.url + "/metrics", timeout=BOUND).text
    assert 'wirecut_connections_dropped_total{why="evicted"}' in metrics
    assert 'wirecut_connections_dropped_total{why="evicted"} 0.0' not in metrics


def test_a_request_head_past_the_bound_is_a_431_and_the_proxy_serves_on(tmp_path: Path) -> None:
    with proxied(tmp_path, connection_limits=limits(max_head=16 * 1024)) as setup:
        conn = socket.create_connection(("127.0.0.1", setup.proxy.port), timeout=BOUND)
        # Past the bound, and no further: what the proxy never read would
        # turn its close into a reset before we read its answer.
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20_000)
        status, _, body = read_response(conn)
        assert conn.recv(1) == b""
        conn.close()
        after = setup.health()
    assert status == 431
    assert b"too large" in body
    assert after["status"] == "ok"


def test_a_client_that_stops_reading_is_cut_after_the_send_timeout(tmp_path: Path) -> None:
    event = b"data: " + json.dumps(chunk("x" * 1000)).encode() + b"\n\n"

    def endless(ex: Exchange) -> None:
        ex.start_chunked()
        while True:
            try:
                ex.conn.sendall(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            except OSError:
                return  # The proxy closed: the cut reached the upstream.

    config = {"connection_limits": limits(send_timeout=0.5)}
    with behind(endless, tmp_path, **config) as (upstream, setup):
        conn = slow_reader(setup.proxy.port)
        assert upstream.wait_closes(1, BOUND)  # We never read: the proxy gave up on us.
        record = setup.record()
        conn.close()
    assert (record["status"], record["reason"]) == ("cancelled", "disconnect")


# -- many streams ---------------------------------------------------------------------------------


def test_sigterm_with_many_streams_open_cuts_each_and_exits(tmp_path: Path) -> None:
    streams = 200
    with SimulatorServer(
        SimConfig(slots=streams, tokens_per_second=20, prompt_ms=0, endless=True)
    ) as sim:
        command = Command("--upstream", sim.base_url, "--data-dir", str(tmp_path))
        conns = []
        try:
            port = int(command.base_url.rsplit(":", 1)[1].split("/")[0])
            conns = [post(port, chat(stream=True)) for _ in range(streams)]
            for conn in conns:
                seen = b""
                while b'"content"' not in seen:
                    data = conn.recv(65536)
                    assert data, seen
                    seen += data
            code, _ = command.stop()
        finally:
            if command.proc.poll() is None:
                command.stop()
            for conn in conns:
                conn.close()
        for request in sim.requests():
            sim.wait_for_event(EventKind.REQUEST_FINISHED, request.id, timeout=BOUND)
        assert all(slot["is_processing"] is False for slot in sim.slots())
    records = [json.loads(line) for line in (tmp_path / "proxy.jsonl").read_text().splitlines()]
    assert code == 0
    assert len(records) == streams
    assert {(r["status"], r["reason"]) for r in records} == {("cancelled", "shutdown")}
