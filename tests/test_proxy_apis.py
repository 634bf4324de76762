"""Every streaming API through ``wirecut proxy``, and the same cut for each of them.

``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` and
``/v1/messages``, stream and not, read by the official clients (the
``openai`` SDK for chat and the Responses API, the ``anthropic`` SDK for the
Messages API), each also breaking off mid-stream; then the cut table for
every route: a client that leaves in the prompt phase, while decoding, or
while queued in the proxy, a cancel by id. Every claim about the upstream is
read from the simulator's own record; every claim about the proxy from its
``proxy.jsonl``. Nothing sleeps to wait.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from _loopback import Exchange, LoopbackServer
from test_proxy import (
    BOUND,
    ENDLESS,
    FAST,
    event_names,
    leave_in,
    post,
    prompt_tokens,
    proxied,
    read_response,
)
from wirecut.proxy import ProxyConfig, ProxyServer
from wirecut.simulator import EventKind, SimConfig

ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]
ASK = "tell me a long story"


def body_for(route: str, **extra: Any) -> dict[str, Any]:
    """A request of ``route`` asking the same thing."""
    if route == "/v1/completions":
        return {"model": "m", "prompt": ASK, **extra}
    if route == "/v1/responses":
        return {"model": "m", "input": ASK, **extra}
    body = {"model": "m", "messages": [{"role": "user", "content": ASK}], **extra}
    if route == "/v1/messages":
        body.setdefault("max_tokens", 100_000)
    return body


def sdk(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)


def claude(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)


# -- the official clients ---------------------------------------------------------------


def test_the_openai_sdk_gets_responses_whole_and_streamed_with_the_upstreams_usage(
    tmp_path: Path,
) -> None:
    with proxied(tmp_path) as setup:
        client = sdk(setup.proxy.base_url)
        whole = client.responses.create(model="m", input=ASK)
        with client.responses.stream(model="m", input=ASK) as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
        upstream = setup.sim.requests()
        setup.wait_health(lambda _: len(setup.records()) == 2)
        records = setup.records()
    assert [r.route for r in upstream] == ["/v1/responses"] * 2
    assert all(r.stream for r in upstream)  # The wire streamed, whatever the client asked.
    assert whole.status == final.status == "completed"
    assert whole.output_text == final.output_text == "".join(deltas)
    assert len(deltas) == FAST.reply_tokens
    assert whole.usage is not None
    assert whole.usage.output_tokens == FAST.reply_tokens
    for record in records:
        assert (record["route"], record["status"], record["reason"]) == (
            "/v1/responses",
            "ok",
            None,
        )
        assert record["usage"]["prompt_tokens"] == whole.usage.input_tokens
        assert record["usage"]["completion_tokens"] == FAST.reply_tokens
        assert record["usage"]["estimated"] is False
    assert [r["stream"] for r in records] == [False, True]


def test_the_anthropic_sdk_gets_messages_whole_and_streamed_with_the_upstreams_usage(
    tmp_path: Path,
) -> None:
    messages: Any = [{"role": "user", "content": ASK}]
    with proxied(tmp_path) as setup:
        client = claude(setup.proxy.url)
        whole = client.messages.create(model="m", max_tokens=100, messages=messages)
        with client.messages.stream(model="m", max_tokens=100, messages=messages) as stream:
            texts = list(stream.text_stream)
            final = stream.get_final_message()
        upstream = setup.sim.requests()
        setup.wait_health(lambda _: len(setup.records()) == 2)
        records = setup.records()
    assert [r.route for r in upstream] == ["/v1/messages"] * 2
    assert all(r.stream for r in upstream)
    assert whole.stop_reason == final.stop_reason == "end_turn"
    assert whole.content[0].type == final.content[0].type == "text"
    assert whole.content[0].text == final.content[0].text == "".join(texts)  # type: ignore[union-attr]
    assert whole.usage.output_tokens == final.usage.output_tokens == FAST.reply_tokens
    for record in records:
        assert (record["route"], record["status"]) == ("/v1/messages", "ok")
        assert record["usage"]["prompt_tokens"] == whole.usage.input_tokens
        assert record["usage"]["completion_tokens"] == FAST.reply_tokens
        assert record["usage"]["counted_by"] == "upstream"


def test_a_bad_messages_body_is_an_anthropic_error_that_names_the_field(tmp_path: Path) -> None:
    with proxied(tmp_path) as setup:
        client = claude(setup.proxy.url)
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model="m", max_tokens=10, messages=[])
        reached = setup.sim.requests()
    body: Any = caught.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "'messages'" in body["error"]["message"]
    assert reached == []


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_an_sdk_breaking_off_mid_stream_cuts_the_upstream_and_frees_its_slot(
    tmp_path: Path, api: str
) -> None:
    with proxied(tmp_path, ENDLESS) as setup:
        if api == "chat":
            chat = sdk(setup.proxy.base_url).chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": ASK}],
                stream=True,
            )
            for n, _ in enumerate(chat):
                if n == 3:
                    break
            chat.close()
        elif api == "responses":
            with sdk(setup.proxy.base_url).responses.stream(model="m", input=ASK) as events:
                for n, _ in enumerate(e for e in events if e.type.endswith(".delta")):
                    if n == 3:
                        break
        else:
            messages: Any = [{"role": "user", "content": ASK}]
            with claude(setup.proxy.url).messages.stream(
                model="m", max_tokens=100_000, messages=messages
            ) as stream:
                for n, _ in enumerate(stream.text_stream):
                    if n == 3:
                        break
        (upstream,) = setup.sim.requests()
        setup.sim.wait_for_event(EventKind.PEER_CLOSED, upstream.id, timeout=BOUND)
        setup.sim.wait_for_event(EventKind.SLOT_FREED, upstream.id, timeout=BOUND)
        record = setup.record()
        assert len(setup.sim.requests()) == 1  # Not retried after the client left.
    assert (record["status"], record["reason"]) == ("cancelled", "disconnect")
    assert record["usage"]["completion_tokens"] >= 4  # At least what the client read.
    assert record["usage"]["estimated"] is True


# -- the cut table, for every API ---------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
@pytest.mark.parametrize("phase", ["prompt", "decode"])
def test_a_client_leaving_cuts_the_upstream_in_every_api_and_phase(
    tmp_path: Path, route: str, stream: bool, phase: str
) -> None:
    sim = SimConfig(slots=1, tokens_per_second=100, prompt_ms=600, endless=True)
    with proxied(tmp_path, sim) as setup:
        closed = leave_in(setup, phase, body_for(route, stream=stream), route)
        record = setup.record()
        (upstream,) = setup.sim.requests()  # Not retried after the client left.
        reported = prompt_tokens(setup.sim, body_for(route), route.removeprefix("/v1/"))
        metrics = httpx.get(setup.proxy.url + "/metrics", timeout=BOUND).text
    assert upstream.route == route
    assert closed.detail["where"] == phase
    assert (record["status"], record["reason"], record["route"]) == (
        "cancelled",
        "disconnect",
        route,
    )
    assert record["stream"] is stream
    assert record["usage"]["requests"] == 1
    assert record["usage"]["prompt_tokens"] == reported  # The upstream's tokenizer's count.
    assert record["cancel_to_upstream_close_ms"] is not None
    assert event_names(record)[0] == "cancel_requested"
    assert {"sockets_shut", "worker_exited"} <= set(event_names(record))
    if phase == "prompt":
        # No token came. (In decode the first may or may not have reached the
        # proxy before the cut: the simulator's event does not say.)
        assert record["ttft_ms"] is None
    labels = f'key="",upstream="{setup.sim.base_url}"'
    assert f"wirecut_proxy_client_left_to_upstream_closed_ms_count{{{labels}}} 1.0" in metrics
    assert f"wirecut_proxy_started_after_client_left_total{{{labels}}} 0.0" in metrics


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_a_client_leaving_while_queued_never_reaches_the_upstream_in_every_api(
    tmp_path: Path, route: str, stream: bool
) -> None:
    with proxied(tmp_path, ENDLESS) as setup:
        running = post(setup.proxy.port, body_for(route, stream=True), path=route)
        setup.sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)
        queued = post(
            setup.proxy.port,
            body_for(route, stream=stream),
            path=route,
            headers={"X-Request-Id": "queued"},
        )
        setup.wait_health(lambda h: h["requests"]["queued"] == 1)
        queued.close()
        record = setup.record("queued")
        running.close()
        (only,) = setup.sim.requests()  # The queued one never got there.
        setup.sim.wait_for_event(EventKind.SLOT_FREED, only.id, timeout=BOUND)
    assert (record["status"], record["reason"], record["route"]) == (
        "cancelled",
        "disconnect",
        route,
    )
    assert record["usage"]["requests"] == 0
    assert record["cancel_to_upstream_close_ms"] is None


@pytest.mark.parametrize("route", ROUTES)
def test_cancel_by_id_cuts_a_stream_of_every_api_with_an_error_in_its_shape(
    tmp_path: Path, route: str
) -> None:
    with proxied(tmp_path, ENDLESS) as setup:
        conn = post(
            setup.proxy.port,
            body_for(route, stream=True),
            path=route,
            headers={"X-Request-Id": "c1"},
        )
        (upstream,) = [setup.sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)]
        answer = httpx.post(setup.proxy.base_url + "/requests/c1/cancel", timeout=BOUND)
        setup.sim.wait_for_event(EventKind.PEER_CLOSED, upstream.request_id, timeout=BOUND)
        status, _, body = read_response(conn)
        conn.close()
    assert answer.status_code == 200
    assert (answer.json()["status"], answer.json()["reason"]) == ("cancelled", "cancel")
    assert status == 200  # The stream had begun: its last event says why it ended.
    last = body.decode().strip().split("\n\n")[-1]
    data = json.loads(last.split("data: ", 1)[1])
    if route == "/v1/messages":
        assert last.startswith("event: error\n")
        assert data["error"]["type"] == "cancelled"
    elif route == "/v1/responses":
        assert last.startswith("event: error\n")
        assert (data["type"], data["code"]) == ("error", "cancelled")
    else:
        assert data["error"]["code"] == "cancelled"


# -- an upstream that answers whole ----------------------------------------------------


RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1,
    "status": "completed",
    "model": "w",
    "output": [
        {
            "id": "msg_1",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hello there", "annotations": []}],
        }
    ],
    "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
}
MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "w",
    "content": [
        {"type": "text", "text": "hello there"},
        {"type": "tool_use", "id": "tu_1", "name": "shell", "input": {"cmd": "ls"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 9},
}


def _whole(ex: Exchange) -> None:
    if ex.request.path == "/v1/responses":
        ex.json(RESPONSE)
    elif ex.request.path == "/v1/messages":
        ex.json(MESSAGE)
    else:
        ex.json({}, status=404)


def test_an_upstream_that_answers_whole_is_a_stream_the_sdk_helpers_follow(
    tmp_path: Path,
) -> None:
    with LoopbackServer(_whole) as upstream:
        config = ProxyConfig(upstream=upstream.url + "/v1", port=0, data_dir=tmp_path)
        with ProxyServer(config) as proxy:
            with sdk(proxy.base_url).responses.stream(model="w", input="hi") as events:
                response = events.get_final_response()
            messages: Any = [{"role": "user", "content": "hi"}]
            with claude(proxy.url).messages.stream(
                model="w", max_tokens=10, messages=messages
            ) as stream:
                message = stream.get_final_message()
    assert response.output_text == "hello there"
    assert response.usage is not None
    assert response.usage.output_tokens == 2
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[1].input == {"cmd": "ls"}  # type: ignore[union-attr]


def test_a_responses_stream_that_ends_before_its_last_event_is_the_upstreams_error(
    tmp_path: Path,
) -> None:
    created = {"type": "response.created", "response": {**RESPONSE, "status": "in_progress"}}
    delta = {"type": "response.output_text.delta", "delta": "hel", "output_index": 0}

    def broken(ex: Exchange) -> None:
        events = [
            f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in (created, delta)
        ]
        ex.sse(events, done=False)  # The body ends; no response.completed came.

    with LoopbackServer(broken) as upstream:
        config = ProxyConfig(upstream=upstream.url + "/v1", port=0, data_dir=tmp_path)
        with ProxyServer(config) as proxy:
            answer = httpx.post(
                proxy.base_url + "/responses", json={"model": "w", "input": "hi"}, timeout=BOUND
            )
    record = json.loads((tmp_path / "proxy.jsonl").read_text())
    assert answer.status_code == 502
    assert "before its last event" in answer.json()["error"]["message"]
    assert (record["status"], record["reason"]) == ("error", "upstream")
    assert record["usage"]["counted_by"] == "chunks"  # No tokenizer there: said so.
    assert record["usage"]["completion_tokens"] == 1


_LAST_EVENTS = {
    "/v1/responses": [
        {"type": "response.created", "response": {**RESPONSE, "status": "in_progress"}},
        {"type": "response.output_text.delta", "delta": "hello there", "output_index": 0},
        {"type": "response.completed", "response": RESPONSE},
    ],
    "/v1/messages": [
        {"type": "message_start", "message": {**MESSAGE, "content": [], "stop_reason": None}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": MESSAGE["usage"]},
        {"type": "message_stop"},
    ],
}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
@pytest.mark.parametrize("route", list(_LAST_EVENTS))
def test_the_apis_last_event_ends_the_request_though_the_upstream_keeps_it_open(
    tmp_path: Path, route: str, stream: bool
) -> None:
    def last_then_hold(ex: Exchange) -> None:
        if ex.request.path != route:
            ex.json({}, status=404)  # The proxy's probe.
            return
        ex.start_chunked()
        for event in _LAST_EVENTS[route]:
            ex.chunk(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        ex.hold()  # No end of the body: the connection stays open.

    with LoopbackServer(last_then_hold) as upstream:
        config = ProxyConfig(
            upstream=upstream.url + "/v1", port=0, data_dir=tmp_path, request_timeout=60
        )
        with ProxyServer(config) as proxy:
            answer = httpx.post(
                proxy.url + route, json=body_for(route, stream=stream), timeout=BOUND
            )
            (sent,) = [r for r in upstream.requests if r.method == "POST"]
            # Not reusable: closed, not left hanging.
            closed = upstream.wait_closed(sent.connection, BOUND)
    record = json.loads((tmp_path / "proxy.jsonl").read_text())
    assert answer.status_code == 200
    assert closed
    assert (record["status"], record["reason"]) == ("ok", None)
    assert record["usage"]["counted_by"] == "upstream"
