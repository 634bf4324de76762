"""``wirecut proxy``: OpenAI-compatible; a client leaving cuts its upstream request in any phase.

End to end through real sockets: the official openai SDK (sync and async),
raw sockets and httpx requests against a ``ProxyServer`` (real uvicorn) in
front of the simulator (real uvicorn, its own event log) or a scripted
loopback upstream; the CLI as a process. Every claim about the upstream is
read from the upstream's own record (the simulator's event log and request
list, the loopback server's requests and closes); every claim about the
proxy from its ``proxy.jsonl``. Waits are bounded and wake on the event, or
poll a state with a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from _loopback import Exchange, LoopbackServer
from _support import BOUND
from wirecut.proxy import ProxyConfig, ProxyServer
from wirecut.simulator import EventKind, SimConfig, SimEvent, SimulatorServer

MESSAGES = [{"role": "user", "content": "tell me a long story"}]
FAST = SimConfig(slots=2, tokens_per_second=200, prompt_ms=5, reply_tokens=8)
ENDLESS = SimConfig(slots=1, tokens_per_second=100, prompt_ms=5, endless=True)


# -- helpers ------------------------------------------------------------------------


@dataclass
class Setup:
    sim: SimulatorServer  # (None in the llama.cpp test)
    proxy: ProxyServer
    data_dir: Path

    def records(self) -> list[dict[str, Any]]:
        path = self.data_dir / "proxy.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def record(self, request_id: str | None = None, timeout: float = BOUND) -> dict[str, Any]:
        """The record of ``request_id`` (or the only one), once it is written."""
        deadline = time.monotonic() + timeout
        while True:
            found = [r for r in self.records() if request_id is None or r["id"] == request_id]
            if found:
                assert len(found) == 1, found
                return found[0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"no record for {request_id!r}: {self.records()}")
            time.sleep(0.01)

    def health(self) -> dict[str, Any]:
        return httpx.get(self.proxy.url + "/health", timeout=BOUND).json()  # type: ignore[no-any-return]

    def wait_health(self, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        deadline = time.monotonic() + BOUND
        while True:
            health = self.health()
            if check(health):
                return health
            if time.monotonic() > deadline:
                raise TimeoutError(f"/health never matched: {health}")
            time.sleep(0.01)

    def sdk(self, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.proxy.base_url, api_key="none", **kwargs)


@contextlib.contextmanager
def proxied(
    tmp_path: Path, sim: SimConfig = FAST, responder: Any = None, **config: Any
) -> Iterator[Setup]:
    with SimulatorServer(sim, responder=responder) as simulator:
        proxy_config = ProxyConfig(upstream=simulator.base_url, port=0, data_dir=tmp_path, **config)
        with ProxyServer(proxy_config) as proxy:
            yield Setup(simulator, proxy, tmp_path)


def post(
    port: int,
    payload: dict[str, Any] | bytes,
    path: str = "/v1/chat/completions",
    headers: dict[str, str] | None = None,
) -> socket.socket:
    """Send a request on a raw socket and return the socket (the response unread)."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    head += "Content-Type: application/json\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head += f"Content-Length: {len(body)}\r\n\r\n"
    conn = socket.create_connection(("127.0.0.1", port), timeout=BOUND)
    conn.sendall(head.encode() + body)
    return conn


def read_response(conn: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one whole HTTP/1.1 response (Content-Length or chunked) from ``conn``."""
    reader = conn.makefile("rb")
    status = int(reader.readline().split()[1])
    headers: dict[str, str] = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        return status, headers, reader.read(int(headers["content-length"]))
    body = b""
    while size := int(reader.readline().strip(), 16):
        body += reader.read(size)
        reader.readline()
    return status, headers, body


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MESSAGES, **extra}


def prompt_tokens(
    sim: SimulatorServer, body: dict[str, Any], route: str = "chat/completions"
) -> int:
    """The prompt count the upstream itself reports for ``body`` (asked directly)."""
    limit = "max_output_tokens" if route == "responses" else "max_tokens"
    whole = {**body, "stream": False, limit: 1}
    answer = httpx.post(f"{sim.base_url}/{route}", json=whole, timeout=BOUND).json()
    usage = answer["usage"]
    return int(usage.get("prompt_tokens", usage.get("input_tokens", -1)))


def event_names(record: dict[str, Any]) -> list[str]:
    return [step["event"] for step in record["timeline"]]


def leave_in(
    setup: Setup, phase: str, payload: dict[str, Any], path: str = "/v1/chat/completions"
) -> SimEvent:
    """Send ``payload`` and close the connection once the upstream is in ``phase``.

    ``phase``: "prompt" (a slot was taken) or "decode" (the first token).
    Returns the upstream's ``PEER_CLOSED`` event, after its slot was freed.
    """
    conn = post(setup.proxy.port, payload, path=path)
    waited = EventKind.SLOT_ACQUIRED if phase == "prompt" else EventKind.FIRST_TOKEN
    reached = setup.sim.wait_for_event(waited, timeout=BOUND)
    conn.close()
    closed = setup.sim.wait_for_event(EventKind.PEER_CLOSED, reached.request_id, timeout=BOUND)
    setup.sim.wait_for_event(EventKind.SLOT_FREED, reached.request_id, timeout=BOUND)
    return closed


# -- OpenAI-compatible ------------------------------------------------------------------


def test_the_sdk_without_stream_gets_the_answer_assembled_from_a_streamed_upstream(
    tmp_path: Path,
) -> None:
    before = datetime.datetime.now(datetime.UTC)
    with proxied(tmp_path) as setup:
        raw = setup.sdk().chat.completions.with_raw_response.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
        )
        completion = raw.parse()
        request_id = raw.headers["x-wirecut-request-id"]
        (upstream,) = setup.sim.requests()
    assert upstream.stream is True  # The wire streamed, whatever the client asked.
    assert completion.object == "chat.completion"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].message.role == "assistant"
    assert len(completion.choices[0].message.content or "") > 0
    assert completion.usage is not None
    assert completion.usage.completion_tokens == FAST.reply_tokens
    record = setup.record(request_id)
    assert record == {
        "id": request_id,
        "model": "m",
        "stream": False,
        "status": "ok",
        "reason": None,
        "usage": {
            "prompt_tokens": completion.usage.prompt_tokens,
            "completion_tokens": FAST.reply_tokens,
            "requests": 1,
            "estimated": False,
            "counted_by": "upstream",
            "prompt_counted_by": "upstream",
        },
        "queued_ms": record["queued_ms"],
        "cancel_to_upstream_close_ms": None,
        "timeline": [],
        "route": "/v1/chat/completions",
        "key": None,
        "upstream": setup.sim.base_url,
        "arrived_at": record["arrived_at"],
        "duration_ms": record["duration_ms"],
        "ttft_ms": record["ttft_ms"],
    }
    assert record["queued_ms"] >= 0
    arrived = datetime.datetime.fromisoformat(record["arrived_at"])
    assert before <= arrived <= datetime.datetime.now(datetime.UTC)
    assert record["queued_ms"] <= record["ttft_ms"] <= record["duration_ms"]


@pytest.mark.parametrize("include_usage", [False, True])
def test_the_sdk_with_stream_gets_each_chunk_and_the_usage_only_if_it_asked(
    tmp_path: Path, include_usage: bool
) -> None:
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    with proxied(tmp_path) as setup:
        stream = setup.sdk().chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            **options,  # type: ignore[arg-type]
        )
        chunks = list(stream)
        record = setup.record()
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) == FAST.reply_tokens
    assert chunks[-1 - include_usage].choices[0].finish_reason == "stop"
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == include_usage
    assert record["status"] == "ok"
    assert record["stream"] is True
    assert record["usage"]["completion_tokens"] == FAST.reply_tokens
    assert record["usage"]["prompt_tokens"] is not None  # The upstream reported it to us.


def test_the_async_sdk_streams_and_gets_whole_answers(tmp_path: Path) -> None:
    async def main(base_url: str) -> tuple[str, str]:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="none")
        try:
            whole = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
            parts = []
            stream = await client.chat.completions.create(
                model="m",
                messages=MESSAGES,  # type: ignore[arg-type]
                stream=True,
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
            return whole.choices[0].message.content or "", "".join(parts)
        finally:
            await client.close()

    with proxied(tmp_path) as setup:
        whole, streamed = asyncio.run(main(setup.proxy.base_url))
        # Records are written off the request path: wait for both to be on disk.
        setup.wait_health(lambda _: len(setup.records()) == 2)
        assert [r["status"] for r in setup.records()] == ["ok", "ok"]
    assert whole == streamed  # The simulator's words are a function of the prompt.
    assert whole


def test_tools_and_response_format_reach_the_upstream_and_tool_calls_come_back(
    tmp_path: Path,
) -> None:
    bodies: list[dict[str, Any]] = []
    call = {"id": "call_1", "function": {"name": "shell", "arguments": {"cmd": "ls -la /tmp"}}}

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        bodies.append(body)
        return {"content": None, "tool_calls": [call]}

    tools = [
        {
            "type": "function",
            "function": {
                "name": "shell",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            },
        }
    ]
    response_format = {"type": "json_object"}
    with proxied(tmp_path, responder=responder) as setup:
        client = setup.sdk()
        whole = client.chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
            response_format=response_format,  # type: ignore[arg-type]
        )
        stream = client.chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
            stream=True,
        )
        arguments = "".join(
            part.function.arguments or ""
            for chunk in stream
            for choice in chunk.choices
            for part in choice.delta.tool_calls or ()
            if part.function is not None
        )
    assert bodies[0]["tools"] == tools
    assert bodies[0]["response_format"] == response_format
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    assert message.tool_calls is not None
    (got,) = message.tool_calls
    assert got.id == "call_1"
    assert got.function.name == "shell"  # type: ignore[union-attr]
    assert json.loads(got.function.arguments) == {"cmd": "ls -la /tmp"}  # type: ignore[union-attr]
    assert json.loads(arguments) == {"cmd": "ls -la /tmp"}


def test_the_clients_request_id_names_the_request(tmp_path: Path) -> None:
    with proxied(tmp_path) as setup:
        response = httpx.post(
            setup.proxy.base_url + "/chat/completions",
            json=chat(),
            headers={"X-Request-Id": "front-end-42"},
            timeout=BOUND,
        )
        record = setup.record("front-end-42")
    assert response.status_code == 200
    assert response.headers["x-wirecut-request-id"] == "front-end-42"
    assert record["status"] == "ok"


def test_gets_are_passed_through(tmp_path: Path) -> None:
    with proxied(tmp_path) as setup:
        models = setup.sdk().models.list()
        missing = httpx.get(setup.proxy.base_url + "/no-such-thing", timeout=BOUND)
    assert [m.id for m in models.data] == [FAST.model]
    assert missing.status_code == 404  # The upstream's answer, passed on.


def _text_upstream(ex: Exchange) -> None:
    """A /v1/completions upstream that streams text_completion chunks (as llama.cpp does)."""

    def part(text: str, finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "t",
            "choices": [choice],
        }

    usage = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "t", "choices": []}
    usage["usage"] = {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    ex.sse([part("Once"), part(" upon"), part(" a", finish="length"), usage])


@pytest.fixture
def text_upstream(tmp_path: Path) -> Iterator[tuple[LoopbackServer, ProxyServer]]:
    with LoopbackServer(_text_upstream) as upstream:
        config = ProxyConfig(upstream=upstream.url + "/v1", port=0, data_dir=tmp_path)
        with ProxyServer(config) as proxy:
            yield upstream, proxy


def test_text_completions_stream_and_whole(
    text_upstream: tuple[LoopbackServer, ProxyServer],
) -> None:
    upstream, proxy = text_upstream
    client = openai.OpenAI(base_url=proxy.base_url, api_key="none")
    whole = client.completions.create(model="t", prompt="hi", max_tokens=3)
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model="t", prompt="hi", max_tokens=3, stream=True)
        if c.choices
    )
    assert whole.choices[0].text == streamed == "Once upon a"
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None
    assert whole.usage.total_tokens == 5
    posts = [r for r in upstream.requests if r.method == "POST"]  # The rest: the start's probe.
    assert [r.path for r in posts] == ["/v1/completions"] * 2
    assert all(r.json()["stream"] is True for r in posts)


def test_an_upstream_that_answers_whole_is_still_a_stream_for_a_streaming_client(
    tmp_path: Path,
) -> None:
    answer = {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "w",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    with LoopbackServer(lambda ex: ex.json(answer)) as upstream:
        config = ProxyConfig(upstream=upstream.url + "/v1", port=0, data_dir=tmp_path)
        with ProxyServer(config) as proxy:
            client = openai.OpenAI(base_url=proxy.base_url, api_key="none")
            chunks = list(client.chat.completions.create(model="w", messages=MESSAGES, stream=True))  # type: ignore[arg-type]
    assert [c.choices[0].delta.content for c in chunks] == ["hello"]
    assert chunks[0].choices[0].finish_reason == "stop"


def test_an_upstream_error_status_is_passed_on_and_recorded(tmp_path: Path) -> None:
    refusal = {"error": {"message": "model 'x' not found", "type": "invalid_request_error"}}
    with LoopbackServer(lambda ex: ex.json(refusal, status=404)) as upstream:
        config = ProxyConfig(upstream=upstream.url + "/v1", port=0, data_dir=tmp_path)
        with ProxyServer(config) as proxy:
            client = openai.OpenAI(base_url=proxy.base_url, api_key="none", max_retries=0)
            with pytest.raises(openai.NotFoundError, match="model 'x' not found"):
                client.chat.completions.create(model="x", messages=MESSAGES)  # type: ignore[arg-type]
    setup_records = [
        json.loads(line) for line in (tmp_path / "proxy.jsonl").read_text().splitlines()
    ]
    (record,) = setup_records
    assert record["status"] == "error"
    assert record["reason"] == "upstream"
    assert record["usage"]["requests"] == 1


# -- disconnect = cut ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
@pytest.mark.parametrize("phase", ["prompt", "decode"])
def test_a_client_leaving_cuts_its_upstream_request_and_frees_the_slot(
    tmp_path: Path, stream: bool, phase: str
) -> None:
    # A long prompt phase; the simulator, like llama.cpp, notices a close
    # only when it has a token to send.
    sim = SimConfig(slots=1, tokens_per_second=100, prompt_ms=600, endless=True)
    with proxied(tmp_path, sim) as setup:
        closed = leave_in(setup, phase, chat(stream=stream))
        record = setup.record()
        assert all(slot["is_processing"] is False for slot in setup.sim.slots())
        assert len(setup.sim.requests()) == 1  # Not retried after the client left.
        reported = prompt_tokens(setup.sim, chat())
    assert closed.detail["where"] == phase
    assert record["status"] == "cancelled"
    assert record["reason"] == "disconnect"
    assert record["stream"] is stream
    assert record["usage"]["requests"] == 1
    # Cut before the upstream reported it: counted with its own tokenizer.
    assert record["usage"]["prompt_tokens"] == reported
    assert record["usage"]["prompt_counted_by"] == "tokenizer"
    assert record["usage"]["estimated"] is True
    assert record["cancel_to_upstream_close_ms"] is not None
    assert event_names(record)[0] == "cancel_requested"
    assert {"sockets_shut", "worker_exited"} <= set(event_names(record))


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_a_client_leaving_while_queued_in_the_proxy_never_reaches_the_upstream(
    tmp_path: Path, stream: bool
) -> None:
    with proxied(tmp_path, ENDLESS) as setup:
        assert setup.health()["upstream"]["slots"] == 1  # auto: from the simulator's /slots
        running = post(setup.proxy.port, chat(stream=True))
        setup.sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)
        queued = post(setup.proxy.port, chat(stream=stream), headers={"X-Request-Id": "queued"})
        setup.wait_health(lambda h: h["requests"]["queued"] == 1)
        queued.close()
        record = setup.record("queued")
        assert setup.health()["requests"] == {"in_flight": 1, "queued": 0}
        running.close()
        setup.wait_health(lambda h: h["requests"]["in_flight"] == 0)
        (only,) = setup.sim.requests()  # The queued one never got there.
        setup.sim.wait_for_event(EventKind.SLOT_FREED, only.id, timeout=BOUND)
    assert record["status"] == "cancelled"
    assert record["reason"] == "disconnect"
    assert record["usage"] == {
        "prompt_tokens": None,
        "completion_tokens": 0,
        "requests": 0,
        "estimated": False,
        "counted_by": None,
        "prompt_counted_by": None,
    }
    assert record["queued_ms"] > 0
    assert record["cancel_to_upstream_close_ms"] is None
    assert event_names(record) == ["cancel_requested"]


def test_a_freed_slot_goes_to_the_oldest_live_waiter(tmp_path: Path) -> None:
    with proxied(tmp_path, ENDLESS) as setup:
        first = post(setup.proxy.port, chat(stream=True), headers={"X-Request-Id": "a"})
        setup.sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)
        second = post(setup.proxy.port, chat(stream=True), headers={"X-Request-Id": "b"})
        setup.wait_health(lambda h: h["requests"]["queued"] == 1)
        third = post(setup.proxy.port, chat(stream=True), headers={"X-Request-Id": "c"})
        setup.wait_health(lambda h: h["requests"]["queued"] == 2)
        second.close()  # b leaves the line: c is next.
        setup.record("b")
        first.close()
        reached = setup.sim.wait_for(
            lambda ev: ev.kind == EventKind.FIRST_TOKEN and ev.request_id != "req-1", BOUND
        )
        third.close()
        setup.record("c")
        assert [r.id for r in setup.sim.requests()] == ["req-1", reached.request_id]
    assert setup.record("b")["usage"]["requests"] == 0
    assert setup.record("c")["usage"]["requests"] == 1


def test_a_request_the_upstream_received_is_never_retried(tmp_path: Path) -> None:
    # The upstream reads the request and drops the connection without a word.
    with LoopbackServer(lambda ex: ex.close()) as upstream:
        config = ProxyConfig(upstream=upstream.url + "/v1", port=0, data_dir=tmp_path)
        with ProxyServer(config) as proxy:
            response = httpx.post(proxy.base_url + "/chat/completions", json=chat(), timeout=BOUND)
        received = len([r for r in upstream.requests if r.method == "POST"])
    assert response.status_code == 502
    assert "upstream" in response.json()["error"]["message"]
    assert received == 1
    record = json.loads((tmp_path / "proxy.jsonl").read_text())
    assert (record["status"], record["reason"], record["usage"]["requests"]) == (
        "error",
        "upstream",
        1,
    )


def test_an_upstream_that_refuses_connections_is_a_502_after_bounded_retries(
    tmp_path: Path,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    config = ProxyConfig(upstream=f"http://127.0.0.1:{port}/v1", port=0, data_dir=tmp_path)
    with ProxyServer(config) as proxy:
        assert (
            httpx.get(proxy.url + "/health", timeout=BOUND).json()["upstream"]["kind"]
            == "unreachable"
        )
        response = httpx.post(proxy.base_url + "/chat/completions", json=chat(), timeout=BOUND)
    assert response.status_code == 502
    assert "cannot connect" in response.json()["error"]["message"]
    record = json.loads((tmp_path / "proxy.jsonl").read_text())
    assert (record["status"], record["reason"], record["usage"]["requests"]) == (
        "error",
        "upstream",
        0,
    )


def test_requests_one_after_another_reuse_a_connection_but_never_a_cut_ones_scope(
    tmp_path: Path,
) -> None:
    with proxied(tmp_path, ENDLESS) as setup:
        client = setup.sdk(max_retries=0)
        for _ in range(2):
            client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
        conn = post(setup.proxy.port, chat(stream=True))
        setup.sim.wait_for_event(EventKind.FIRST_TOKEN, "req-3", timeout=BOUND)
        conn.close()
        setup.sim.wait_for_event(EventKind.SLOT_FREED, "req-3", timeout=BOUND)
        setup.wait_health(lambda h: h["requests"]["in_flight"] == 0)
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
        peers = [
            ev.detail["client"]
            for ev in setup.sim.events()
            if ev.kind == EventKind.REQUEST_RECEIVED
        ]
    first, second, cut, after = peers
    assert first == second == cut  # One keep-alive connection for requests in sequence...
    assert after != cut  # ...and the cut one's scope (and connection) is not used again.


# -- cancel by id, timeout -------------------------------------------------------------------


def test_cancel_by_id_cuts_a_stream_and_answers_with_its_record(tmp_path: Path) -> None:
    with proxied(tmp_path, ENDLESS) as setup:
        client = setup.sdk(max_retries=0)
        stream = client.chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            extra_headers={"X-Request-Id": "stop-me"},
        )
        first = next(iter(stream))
        assert first.choices[0].delta.content
        answer = httpx.post(setup.proxy.base_url + "/requests/stop-me/cancel", timeout=BOUND)
        with pytest.raises(openai.APIError, match="cancelled"):
            for _ in stream:
                pass
        (upstream,) = setup.sim.requests()
        setup.sim.wait_for_event(EventKind.PEER_CLOSED, upstream.id, timeout=BOUND)
        again = httpx.post(setup.proxy.base_url + "/requests/stop-me/cancel", timeout=BOUND)
    assert answer.status_code == 200
    record = answer.json()
    assert record == setup.record("stop-me")
    assert (record["status"], record["reason"]) == ("cancelled", "cancel")
    assert record["usage"]["completion_tokens"] >= 1
    assert again.status_code == 404  # Not live any more.


def test_cancel_by_id_of_a_queued_request_answers_499_and_it_never_reaches_the_upstream(
    tmp_path: Path,
) -> None:
    with proxied(tmp_path, ENDLESS) as setup:
        running = post(setup.proxy.port, chat(stream=True))
        setup.sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)
        queued = post(setup.proxy.port, chat(), headers={"X-Request-Id": "q1"})
        setup.wait_health(lambda h: h["requests"]["queued"] == 1)
        answer = httpx.post(setup.proxy.base_url + "/requests/q1/cancel", timeout=BOUND)
        status, headers, body = read_response(queued)
        queued.close()
        running.close()
        assert len(setup.sim.requests()) == 1
    assert answer.json()["usage"]["requests"] == 0
    assert status == 499
    assert headers["x-wirecut-request-id"] == "q1"
    assert json.loads(body)["error"]["code"] == "cancelled"


def test_cancel_of_an_unknown_id_is_a_404(tmp_path: Path) -> None:
    with proxied(tmp_path) as setup:
        answer = httpx.post(setup.proxy.base_url + "/requests/nobody/cancel", timeout=BOUND)
    assert answer.status_code == 404
    assert "nobody" in answer.json()["error"]["message"]


def test_the_request_timeout_cuts_and_is_recorded_as_such(tmp_path: Path) -> None:
    with proxied(tmp_path, ENDLESS, request_timeout=0.3) as setup:
        response = httpx.post(
            setup.proxy.base_url + "/chat/completions", json=chat(), timeout=BOUND
        )
        (upstream,) = setup.sim.requests()
        setup.sim.wait_for_event(EventKind.PEER_CLOSED, upstream.id, timeout=BOUND)
        record = setup.record()
    assert response.status_code == 504
    assert (record["status"], record["reason"]) == ("timeout", "timeout")


# -- the boundary -----------------------------------------------------------------------------


def test_a_client_token_is_required_when_one_is_set(tmp_path: Path) -> None:
    with proxied(tmp_path, token="s3cret") as setup:
        plain = httpx.post(setup.proxy.base_url + "/chat/completions", json=chat(), timeout=BOUND)
        wrong = httpx.get(
            setup.proxy.url + "/health", headers={"Authorization": "Bearer nope"}, timeout=BOUND
        )
        good = openai.OpenAI(base_url=setup.proxy.base_url, api_key="s3cret")
        answer = good.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert len(setup.sim.requests()) == 1  # Only the authorized one got through.
    assert plain.status_code == 401
    assert wrong.status_code == 401
    assert answer.choices[0].message.content


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({"Host": "evil.example"}, False),
        ({"Host": "evil.example:8766"}, False),
        ({"Origin": "http://evil.example"}, False),
        ({"Origin": "null"}, False),
        ({"Host": "localhost:8766"}, True),
        ({"Host": "[::1]:8766"}, True),
        ({"Host": "gateway.lan"}, True),  # in allowed_hosts
    ],
)
def test_a_foreign_host_or_origin_is_refused(
    tmp_path: Path, headers: dict[str, str], allowed: bool
) -> None:
    with proxied(tmp_path, allowed_hosts=("gateway.lan",)) as setup:
        response = httpx.post(
            setup.proxy.base_url + "/chat/completions", json=chat(), headers=headers, timeout=BOUND
        )
        reached = len(setup.sim.requests())
    assert (response.status_code == 200) is allowed
    assert reached == allowed
    if not allowed:
        assert response.status_code == 403


@pytest.mark.parametrize(
    ("body", "headers", "status", "words"),
    [
        (b"{not json", {}, 400, "not valid JSON"),
        (b"[1, 2]", {}, 400, "JSON object"),
        (json.dumps({"model": "m"}).encode(), {}, 400, "'messages'"),
        (json.dumps(chat(stream="yes")).encode(), {}, 400, "'stream' must be a boolean"),
        (json.dumps(chat()).encode(), {"X-Request-Id": "a/b"}, 400, "X-Request-Id"),
        (b"x" * 2048, {}, 413, "exceeds"),
    ],
)
def test_bad_input_gets_one_clear_line_and_the_proxy_keeps_serving(
    tmp_path: Path, body: bytes, headers: dict[str, str], status: int, words: str
) -> None:
    with proxied(tmp_path, max_body_bytes=1024) as setup:
        conn = post(setup.proxy.port, body, headers=headers)
        got, _, raw = read_response(conn)
        conn.close()
        after = httpx.post(setup.proxy.base_url + "/chat/completions", json=chat(), timeout=BOUND)
        assert len(setup.sim.requests()) == 1  # The bad one never went upstream.
    message = json.loads(raw)["error"]["message"]
    assert got == status
    assert words in message
    assert "\n" not in message
    assert after.status_code == 200


def test_a_second_live_request_with_the_same_id_is_a_409(tmp_path: Path) -> None:
    with proxied(tmp_path, ENDLESS) as setup:
        first = post(setup.proxy.port, chat(stream=True), headers={"X-Request-Id": "dup"})
        setup.sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)
        second = httpx.post(
            setup.proxy.base_url + "/chat/completions",
            json=chat(),
            headers={"X-Request-Id": "dup"},
            timeout=BOUND,
        )
        first.close()
        setup.record("dup")
    assert second.status_code == 409


def test_health_and_metrics_say_what_happened(tmp_path: Path) -> None:
    with proxied(tmp_path, ENDLESS) as setup:
        conn = post(setup.proxy.port, chat(stream=True))
        setup.sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)
        busy = setup.health()
        conn.close()
        setup.record()
        metrics = httpx.get(setup.proxy.url + "/metrics", timeout=BOUND).text
    assert busy == {
        "status": "ok",
        "upstream": {"url": setup.sim.base_url, "kind": "llama.cpp", "slots": 1},
        "requests": {"in_flight": 1, "queued": 0},
    }
    assert 'wirecut_proxy_requests_total{reason="disconnect",status="cancelled"} 1.0' in metrics
    assert "wirecut_proxy_upstream_requests_total 1.0" in metrics
    assert "wirecut_proxy_cancel_to_upstream_close_ms_count 1.0" in metrics


def test_upstream_slots_given_overrides_auto(tmp_path: Path) -> None:
    with proxied(tmp_path, upstream_slots=3) as setup:
        assert setup.health()["upstream"]["slots"] == 3
    with proxied(tmp_path, upstream_slots=None) as setup:
        assert setup.health()["upstream"]["slots"] is None


# -- the command line -------------------------------------------------------------------------


class Command:
    """``wirecut proxy`` as a process; ``url`` from its first stdout line."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "wirecut", "proxy", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(
                f"wirecut proxy exited {self.proc.wait()}: {self.proc.stderr.read()}"
            )  # type: ignore[union-attr]
        assert line.startswith("wirecut proxy: http://"), line
        self.base_url = line.split(": ", 1)[1].strip()

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        assert self.proc.stderr is not None
        stderr = self.proc.stderr.read()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        return code, stderr


def test_the_command_serves_until_sigterm_and_cuts_what_is_live(tmp_path: Path) -> None:
    with SimulatorServer(ENDLESS) as sim:
        command = Command("--upstream", sim.base_url, "--data-dir", str(tmp_path))
        try:
            whole = httpx.post(
                command.base_url + "/chat/completions", json=chat(max_tokens=3), timeout=BOUND
            )
            with httpx.stream(
                "POST",
                command.base_url + "/chat/completions",
                json=chat(stream=True),
                timeout=BOUND,
            ) as live:
                lines = live.iter_lines()  # Kept: dropping it would close the response.
                next(lines)  # Decoding now.
                code, stderr = command.stop()
        finally:
            if command.proc.poll() is None:
                command.stop()
        for request in sim.requests():
            sim.wait_for_event(EventKind.REQUEST_FINISHED, request.id, timeout=BOUND)
    assert code == 0
    assert whole.status_code == 200
    assert f"upstream: {sim.base_url}" in stderr
    assert "llama.cpp, 1 in flight at once" in stderr
    records = [json.loads(line) for line in (tmp_path / "proxy.jsonl").read_text().splitlines()]
    assert [(r["status"], r["reason"]) for r in records] == [
        ("ok", None),
        ("cancelled", "shutdown"),
    ]


def test_the_command_takes_its_token_from_the_environment(tmp_path: Path) -> None:
    with SimulatorServer(FAST) as sim:
        command = Command(
            "--upstream",
            sim.base_url,
            "--data-dir",
            str(tmp_path),
            env={"WIRECUT_PROXY_TOKEN": "t0k"},
        )
        try:
            without = httpx.get(command.base_url + "/models", timeout=BOUND)
            with_token = httpx.get(
                command.base_url + "/models", headers={"Authorization": "Bearer t0k"}, timeout=BOUND
            )
        finally:
            command.stop()
    assert without.status_code == 401
    assert with_token.status_code == 200


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--host", "0.0.0.0"], "needs a client token"),
        (["--upstream-slots", "0"], "--upstream-slots"),
        (["--upstream-slots", "many"], "--upstream-slots"),
        (["--request-timeout", "nan"], "--request-timeout"),
        (["--upstream", "ftp://x"], "upstream must be an http"),
        (["--token-file", "/nonexistent/token"], "--token-file"),
    ],
)
def test_the_command_refuses_bad_usage_in_one_line(
    args: list[str], words: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "wirecut", "proxy", "--data-dir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "WIRECUT_PROXY_TOKEN"},
    )
    assert result.returncode == 2, result.stderr
    assert words in result.stderr
    assert "Traceback" not in result.stderr


def test_an_empty_token_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    result = subprocess.run(
        [sys.executable, "-m", "wirecut", "proxy", "--token-file", str(empty)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "is empty" in result.stderr


# -- the embedded llama.cpp (extra `local`) ---------------------------------------------------

# llama.cpp restarts its wait for a closed request on every /slots answer:
# keep its polls this far apart (docs/architecture.md, fact 10 and tests/test_local.py).
SLOTS_SPACING_S = 1.5
# A prompt cut lands between llama.cpp's batches (fact 10): bound it generously.
RELEASE_BOUND_S = 60.0
COUNT = {"role": "user", "content": "Count from one to ten thousand."}


def _llama_slots_busy(root: str, last: list[float]) -> list[int]:
    delay = last[0] + SLOTS_SPACING_S - time.monotonic()
    if delay > 0:
        threading.Event().wait(delay)  # Pacing the polls, not waiting for an outcome.
    last[0] = time.monotonic()
    slots = httpx.get(root + "/slots", timeout=BOUND).json()
    return [slot["id"] for slot in slots if slot["is_processing"]]


def _read_until(conn: socket.socket, marker: bytes) -> None:
    seen = b""
    while marker not in seen:
        data = conn.recv(65536)
        assert data, f"the response ended before {marker!r}: {seen[-300:]!r}"
        seen += data


@pytest.mark.local
def test_on_the_embedded_llama_cpp_every_cut_frees_its_slot_and_a_queued_client_never_reaches_it(
    tmp_path: Path,
) -> None:
    from wirecut.local import LocalServer, is_available

    if not is_available():
        pytest.skip("the extra `local` is not installed")
    generate = {"messages": [COUNT], "max_tokens": 2000, "temperature": 0, "ignore_eos": True}
    long_prompt = {**generate, "messages": [{"role": "user", "content": "word " * 1500}]}
    with LocalServer() as server:
        root = server.base_url.removesuffix("/v1")
        config = ProxyConfig(upstream=server.base_url, port=0, data_dir=tmp_path)
        with ProxyServer(config) as proxy:
            setup = Setup(None, proxy, tmp_path)  # type: ignore[arg-type]
            assert setup.health()["upstream"] == {
                "url": server.base_url,
                "kind": "llama.cpp",
                "slots": server.n_parallel,
            }
            # Decoding, stream and not; a third waits in the proxy and leaves.
            streamed = post(proxy.port, {**generate, "stream": True}, headers={"X-Request-Id": "s"})
            _read_until(streamed, b'"content"')
            whole = post(proxy.port, generate, headers={"X-Request-Id": "w"})
            last = [-SLOTS_SPACING_S]
            deadline = time.monotonic() + RELEASE_BOUND_S
            while len(_llama_slots_busy(root, last)) < 2:
                assert time.monotonic() < deadline, "llama.cpp never ran both"
            queued = post(proxy.port, generate, headers={"X-Request-Id": "q"})
            setup.wait_health(lambda h: h["requests"]["queued"] == 1)
            queued.close()
            assert setup.record("q")["usage"]["requests"] == 0
            streamed.close()
            whole.close()
            while _llama_slots_busy(root, last):
                assert time.monotonic() < deadline, "a slot was still busy"
            # A long prompt (one batch of llama.cpp's), cut while llama.cpp reads it.
            prompt = post(proxy.port, long_prompt, headers={"X-Request-Id": "p"})
            setup.wait_health(lambda h: h["requests"]["in_flight"] == 1)
            prompt.close()
            deadline = time.monotonic() + RELEASE_BOUND_S
            while _llama_slots_busy(root, last):
                assert time.monotonic() < deadline, "the prompt's slot was still busy"
            metrics = httpx.get(proxy.url + "/metrics", timeout=BOUND).text
            records = {r["id"]: r for r in setup.records()}
    for request_id in ("s", "w", "p"):
        record = records[request_id]
        assert (record["status"], record["reason"]) == ("cancelled", "disconnect"), record
        assert record["usage"]["requests"] == 1
    assert records["s"]["usage"]["completion_tokens"] >= 1
    assert "wirecut_proxy_upstream_requests_total 3.0" in metrics  # q never went.
