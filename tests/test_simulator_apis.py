"""Every generation API the simulator speaks, judged by the official clients' own parsers.

``/v1/completions`` and ``/v1/responses`` are read with the ``openai`` SDK,
``/v1/messages`` with the ``anthropic`` SDK; the wire itself (event names,
no ``[DONE]`` where llama.cpp sends none) with a plain HTTP client. The
lifecycle claims (slots, queue, a closed client noticed at the next token)
are checked for every route over real sockets. Nothing sleeps to wait.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from _sim import HELLO, body_for, of, raw_post, request_id_of, sse_events
from wirecut.simulator import EventKind, RequestState, SimulatorServer, directive_responder

ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]
NEW_ROUTES = ROUTES[1:]


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as c:
        yield c


def oai(sim: SimulatorServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.base_url, api_key="sim", max_retries=0)


def claude(sim: SimulatorServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=sim.url, api_key="sim", max_retries=0)


def summary(sim: SimulatorServer, request_id: str) -> Any:
    return next(s for s in sim.requests() if s.id == request_id)


def _tool_script(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "content": "Let me look.",
        "tool_calls": [{"id": "call_1", "function": {"name": "shell", "arguments": {"cmd": "ls"}}}],
    }


# -- /v1/completions ------------------------------------------------------------


def test_text_completion_non_stream_is_one_text_completion_with_usage(
    make_sim: Callable[..., SimulatorServer],
) -> None:
    sim = make_sim()
    with oai(sim) as sdk:
        done = sdk.completions.create(model="m", prompt="hello there")
        cut = sdk.completions.create(model="m", prompt="hello there", max_tokens=3)
    assert done.object == "text_completion"
    assert len(done.choices[0].text.split()) == 8
    assert done.choices[0].finish_reason == "stop"
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (2, 8)
    assert done.id == "cmpl-req-1"
    assert len(cut.choices[0].text.split()) == 3
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage is not None
    assert cut.usage.completion_tokens == 3


def test_text_completion_stream_ends_with_usage_then_done(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim()
    with oai(sim) as sdk:
        chunks = list(sdk.completions.create(model="m", prompt="hello there", stream=True))
    text = "".join(c.choices[0].text for c in chunks)
    assert len(text.split()) == 8
    # One chunk a token, then the last with the finish and usage, as llama.cpp sends them.
    assert len(chunks) == 9
    assert [c.choices[0].finish_reason for c in chunks] == [None] * 8 + ["stop"]
    assert [c.usage is not None for c in chunks] == [False] * 8 + [True]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8
    body = {"prompt": "hello there", "stream": True}
    with client.stream("POST", sim.base_url + "/completions", json=body) as resp:
        events = sse_events(resp.iter_lines())
    assert events[-1] == (None, "[DONE]")
    assert all(name is None for name, _ in events)


def test_text_completion_same_text_stream_or_not_and_as_chat(
    make_sim: Callable[..., SimulatorServer],
) -> None:
    sim = make_sim()
    with oai(sim) as sdk:
        whole = sdk.completions.create(model="m", prompt="hello").choices[0].text
        streamed = "".join(
            c.choices[0].text
            for c in sdk.completions.create(model="m", prompt="hello", stream=True)
        )
        chat = sdk.chat.completions.create(model="m", messages=HELLO).choices[0].message.content
    # The prompt is one user message to the word generator: the same words as chat.
    assert whole == streamed == chat


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        (b'{"model": "m"}', "prompt"),
        (b'{"prompt": 5}', "prompt"),
        (b'{"prompt": []}', "prompt"),
        (b'{"prompt": ["one", "two"]}', "prompt"),
        (b'{"prompt": [1, 999999999]}', "prompt"),
        (b'{"prompt": "hi", "max_tokens": 0}', "max_tokens"),
        (b'{"prompt": "hi", "stream": "yes"}', "stream"),
    ],
)
def test_bad_text_completion_is_an_openai_400_naming_the_field(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client, payload: bytes, param: str
) -> None:
    sim = make_sim()
    resp = client.post(
        sim.base_url + "/completions", content=payload, headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert "\n" not in error["message"]
    assert sim.requests() == []


def test_scripted_tool_calls_on_text_completions_are_a_500_that_says_why(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim(responder=_tool_script)
    resp = client.post(sim.base_url + "/completions", json={"prompt": "hi"})
    assert resp.status_code == 500
    assert "tool calls" in resp.json()["error"]["message"]
    assert sim.requests() == []


# -- /v1/responses --------------------------------------------------------------


def test_responses_non_stream_is_a_completed_response_with_usage(
    make_sim: Callable[..., SimulatorServer],
) -> None:
    sim = make_sim()
    with oai(sim) as sdk:
        done = sdk.responses.create(model="m", input="hello", instructions="be brief")
        cut = sdk.responses.create(model="m", input="hello", max_output_tokens=3)
    assert (done.object, done.status, done.id) == ("response", "completed", "resp_req-1")
    assert len(done.output_text.split()) == 8
    assert done.usage is not None
    assert done.usage.output_tokens == 8
    assert done.usage.total_tokens == done.usage.input_tokens + 8
    # A cut reply is "incomplete", as vLLM says it (llama.cpp says "completed").
    assert cut.status == "incomplete"
    assert cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage is not None
    assert cut.usage.output_tokens == 3
    assert len(cut.output_text.split()) == 3


def test_responses_stream_follows_the_sdk_stream_helper_to_completed(
    make_sim: Callable[..., SimulatorServer],
) -> None:
    sim = make_sim()
    with oai(sim) as sdk, sdk.responses.stream(model="m", input="hello") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 8,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.status == "completed"
    assert len(final.output_text.split()) == 8
    assert final.usage is not None
    assert final.usage.output_tokens == 8


def test_responses_stream_names_each_event_and_sends_no_done(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim()
    with client.stream(
        "POST", sim.base_url + "/responses", json={"input": "hello", "stream": True}
    ) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = sse_events(resp.iter_lines())
    payloads = [json.loads(data) for _, data in events]
    # llama.cpp's way: "event: TYPE" before each data line, and no [DONE] at the end.
    assert [name for name, _ in events] == [p["type"] for p in payloads]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert payloads[-1]["type"] == "response.completed"
    ids = {p["response"]["id"] for p in payloads if "response" in p}
    assert ids == {"resp_req-1"}


def test_responses_convert_input_items_and_keep_no_state(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim()
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
        {"type": "reasoning", "summary": []},
    ]
    ok = client.post(sim.base_url + "/responses", json={"input": items})
    stateful = client.post(
        sim.base_url + "/responses", json={"input": "hi", "previous_response_id": "resp_1"}
    )
    assert ok.status_code == 200
    assert ok.json()["status"] == "completed"
    assert stateful.status_code == 400
    assert stateful.json()["error"]["param"] == "previous_response_id"


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        (b'{"model": "m"}', "input"),
        (b'{"input": 5}', "input"),
        (b'{"input": []}', "input"),
        (b'{"input": [5]}', "input[0]"),
        (b'{"input": [{"type": "weird"}]}', "input[0]"),
        (b'{"input": [{"role": 1, "content": "x"}]}', "input[0].role"),
        (b'{"input": "hi", "instructions": 5}', "instructions"),
        (b'{"input": "hi", "max_output_tokens": -1}', "max_output_tokens"),
    ],
)
def test_bad_responses_request_is_an_openai_400_naming_the_field(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client, payload: bytes, param: str
) -> None:
    sim = make_sim()
    resp = client.post(
        sim.base_url + "/responses", content=payload, headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert sim.requests() == []


def test_responses_stream_a_scripted_tool_call_as_a_function_call_item(
    make_sim: Callable[..., SimulatorServer],
) -> None:
    sim = make_sim(responder=_tool_script)
    with oai(sim) as sdk, sdk.responses.stream(model="m", input="hello") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == "Let me look."
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert (call.name, call.call_id, json.loads(call.arguments)) == (
        "shell",
        "call_1",
        {"cmd": "ls"},
    )
    assert "response.function_call_arguments.delta" in kinds
    assert kinds.count("response.output_item.done") == 2


# -- /v1/messages -----------------------------------------------------------------


def test_messages_non_stream_is_an_anthropic_message_with_usage(
    make_sim: Callable[..., SimulatorServer],
) -> None:
    sim = make_sim()
    with claude(sim) as sdk:
        done = sdk.messages.create(model="m", max_tokens=100, messages=HELLO, system="be brief")
        cut = sdk.messages.create(model="m", max_tokens=3, messages=HELLO)
    assert (done.type, done.role, done.id, done.stop_reason) == (
        "message",
        "assistant",
        "msg_req-1",
        "end_turn",
    )
    (block,) = done.content
    assert block.type == "text"
    assert len(block.text.split()) == 8
    assert done.usage.output_tokens == 8
    assert done.usage.input_tokens > 0
    assert cut.stop_reason == "max_tokens"
    assert cut.usage.output_tokens == 3


def test_messages_stream_follows_the_sdk_to_the_final_message(
    make_sim: Callable[..., SimulatorServer],
) -> None:
    sim = make_sim()
    with claude(sim) as sdk, sdk.messages.stream(model="m", max_tokens=100, messages=HELLO) as st:
        kinds = [event.type for event in st]
        final = st.get_final_message()
    raw = [k for k in kinds if k != "text"]  # "text" is the helper's own event
    assert raw == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 8,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 8
    assert len(final.content[0].text.split()) == 8  # type: ignore[union-attr]


def test_messages_stream_names_each_event_and_sends_no_done(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim()
    body = body_for("/v1/messages", stream=True)
    with client.stream("POST", sim.base_url + "/messages", json=body) as resp:
        events = sse_events(resp.iter_lines())
    payloads = [json.loads(data) for _, data in events]
    assert [name for name, _ in events] == [p["type"] for p in payloads]
    assert payloads[0]["message"]["usage"]["output_tokens"] == 0
    assert payloads[-2]["usage"] == {"output_tokens": 8}
    assert payloads[-1] == {"type": "message_stop"}


def test_messages_stream_a_scripted_tool_call_as_a_tool_use_block(
    make_sim: Callable[..., SimulatorServer],
) -> None:
    sim = make_sim(responder=_tool_script)
    with claude(sim) as sdk, sdk.messages.stream(model="m", max_tokens=100, messages=HELLO) as st:
        final = st.get_final_message()
    text, call = final.content
    assert (text.type, text.text) == ("text", "Let me look.")  # type: ignore[union-attr]
    assert call.type == "tool_use"
    assert (call.id, call.name, call.input) == ("call_1", "shell", {"cmd": "ls"})  # type: ignore[union-attr]
    assert final.stop_reason == "tool_use"
    with claude(sim) as sdk:
        whole = sdk.messages.create(model="m", max_tokens=100, messages=HELLO)
    assert [b.type for b in whole.content] == ["text", "tool_use"]
    assert whole.content[1].input == {"cmd": "ls"}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (b'{"max_tokens": 5}', "'messages' is required"),
        (b'{"messages": []}', "'messages' must not be empty"),
        (b'{"messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        (b'{"messages": [{"role": "user", "content": [5]}]}', "messages[0].content[0]"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "system": 5}', "system"),
    ],
)
def test_bad_messages_request_is_an_anthropic_400_that_names_the_field(
    make_sim: Callable[..., SimulatorServer], payload: bytes, words: str
) -> None:
    sim = make_sim()
    # The SDK's own client, without its argument checks: the body goes as it is.
    with claude(sim) as sdk, pytest.raises(anthropic.BadRequestError) as caught:
        sdk.post("/v1/messages", body=json.loads(payload), cast_to=object)
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert words in body["error"]["message"]
    assert sim.requests() == []


def test_messages_without_max_tokens_stop_at_llama_cpp_default(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim(endless=True, tokens_per_second=1_000_000.0)
    resp = client.post(sim.base_url + "/messages", json={"messages": HELLO})
    assert resp.json()["stop_reason"] == "max_tokens"
    assert resp.json()["usage"]["output_tokens"] == 4096


# -- every route ------------------------------------------------------------------


@pytest.mark.parametrize("route", NEW_ROUTES)
def test_directive_responder_scripts_every_route(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client, route: str
) -> None:
    sim = make_sim(responder=directive_responder)
    body = body_for(route, '#sim-reply {"content": "scripted words here"}')
    reply = client.post(sim.url + route, json=body).json()
    text = {
        "/v1/completions": lambda r: r["choices"][0]["text"],
        "/v1/responses": lambda r: r["output"][0]["content"][0]["text"],
        "/v1/messages": lambda r: r["content"][0]["text"],
    }[route](reply)
    assert text == "scripted words here"


@pytest.mark.parametrize("route", NEW_ROUTES)
def test_endless_decodes_each_route_up_to_its_token_limit(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client, route: str
) -> None:
    sim = make_sim(endless=True, reply_tokens=2, tokens_per_second=1000.0)
    name = {"/v1/responses": "max_output_tokens"}.get(route, "max_tokens")
    client.post(sim.url + route, json=body_for(route, **{name: 40}))
    finished = sim.wait_for(of(EventKind.REQUEST_FINISHED, "req-1"))
    assert finished.detail == {"reason": "length", "n_decoded": 40}


@pytest.mark.parametrize("route", ROUTES)
def test_requests_log_names_the_route_each_request_came_by(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client, route: str
) -> None:
    sim = make_sim(reply_tokens=2)
    client.post(sim.url + route, json=body_for(route))
    received = sim.wait_for(of(EventKind.REQUEST_RECEIVED, "req-1"))
    sim.wait_for(of(EventKind.REQUEST_FINISHED, "req-1"))
    assert received.detail["route"] == route
    (logged,) = client.get(sim.url + "/sim/requests").json()
    assert (logged["route"], logged["state"]) == (route, "finished")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non_stream"])
@pytest.mark.parametrize("route", NEW_ROUTES)
def test_peer_close_on_every_route_is_noticed_at_the_next_token_and_frees_the_slot(
    make_sim: Callable[..., SimulatorServer], route: str, stream: bool
) -> None:
    sim = make_sim(endless=True, tokens_per_second=20.0)
    body = body_for(route, stream=stream)
    if route == "/v1/messages":
        body["max_tokens"] = 100_000  # else llama.cpp's default of 4096 would end it
    sock = raw_post(sim, route, body)
    with sock:
        request_id = request_id_of(sim, sock)
        sim.wait_for(
            lambda ev: ev.request_id == request_id and ev.kind == "token" and ev.detail["n"] >= 3,
            timeout=5,
        )
        sock.shutdown(socket.SHUT_RDWR)
        closed = sim.wait_for(of(EventKind.PEER_CLOSED, request_id), timeout=5)
        freed = sim.wait_for(of(EventKind.SLOT_FREED, request_id), timeout=5)
    assert closed.detail["where"] == "decode"
    assert closed.seq < freed.seq
    tokens = [ev for ev in sim.events() if ev.kind == "token" and ev.request_id == request_id]
    seen_at = closed.detail["t_disconnect"]
    assert isinstance(seen_at, float)
    assert all(ev.t < seen_at for ev in tokens)  # not one token after the close was seen
    done = summary(sim, request_id)
    assert (done.state, done.route) == (RequestState.PEER_CLOSED, route)
    assert sim.slots()[0]["is_processing"] is False


@pytest.mark.parametrize("route", NEW_ROUTES)
def test_a_close_during_the_prompt_of_every_route_is_noticed_between_batches(
    make_sim: Callable[..., SimulatorServer], route: str
) -> None:
    # 4,000 words of prompt at 1,000 tokens/s in batches of 100: about 4 s of prompt.
    sim = make_sim(prompt_tokens_per_second=1000.0, prompt_batch=100)
    with raw_post(sim, route, body_for(route, " ".join(["word"] * 4000), stream=True)) as sock:
        request_id = request_id_of(sim, sock)
        first = sim.wait_for(of(EventKind.PROMPT_BATCH, request_id), timeout=5)
        sock.shutdown(socket.SHUT_RDWR)
        closed = sim.wait_for(of(EventKind.PEER_CLOSED, request_id), timeout=5)
        sim.wait_for(of(EventKind.SLOT_FREED, request_id), timeout=5)
    # The prompt is the route's own: templated (or, for a text completion, as sent).
    assert first.detail["of"] == prompt_size(route)
    assert closed.detail["where"] == "prompt"
    assert not any(ev.kind == EventKind.FIRST_TOKEN for ev in sim.events())


def prompt_size(route: str) -> int:
    # 4,000 words; a one-message ChatML template adds 6 tokens, a text prompt none.
    return 4000 if route == "/v1/completions" else 4006


@pytest.mark.parametrize("route", NEW_ROUTES)
def test_queued_client_of_every_route_that_leaves_never_takes_a_slot(
    make_sim: Callable[..., SimulatorServer], route: str
) -> None:
    sim = make_sim(slots=1, endless=True, tokens_per_second=50.0)
    holder = raw_post(sim, "/v1/chat/completions", {"messages": HELLO, "stream": True})
    with holder:
        holder_id = request_id_of(sim, holder)
        sim.wait_for(of(EventKind.FIRST_TOKEN, holder_id), timeout=5)
        with raw_post(sim, route, body_for(route, stream=True)) as leaver:
            leaver_id = request_id_of(sim, leaver)
            sim.wait_for(of(EventKind.REQUEST_QUEUED, leaver_id), timeout=5)
            leaver.shutdown(socket.SHUT_RDWR)
            closed = sim.wait_for(of(EventKind.PEER_CLOSED, leaver_id), timeout=5)
        assert closed.detail["where"] == "queue"
        holder.shutdown(socket.SHUT_RDWR)
        sim.wait_for(of(EventKind.SLOT_FREED, holder_id), timeout=5)
    assert not any(ev.request_id == leaver_id and ev.kind == "slot_acquired" for ev in sim.events())
    assert summary(sim, leaver_id).state is RequestState.PEER_CLOSED


@pytest.mark.parametrize("route", NEW_ROUTES)
def test_stop_ends_an_endless_stream_of_every_route(
    make_sim: Callable[..., SimulatorServer], route: str
) -> None:
    sim = make_sim(endless=True, tokens_per_second=50.0)
    body = body_for(route, stream=True)
    if route == "/v1/messages":
        body["max_tokens"] = 100_000
    with raw_post(sim, route, body) as sock:
        request_id = request_id_of(sim, sock)
        sim.wait_for(of(EventKind.FIRST_TOKEN, request_id), timeout=5)
        sim.stop()
        finished = sim.wait_for(of(EventKind.REQUEST_FINISHED, request_id), timeout=0)
    assert finished.detail["reason"] == "shutdown"


def test_queued_request_turned_away_at_shutdown_gets_the_routes_error_shape(
    make_sim: Callable[..., SimulatorServer],
) -> None:
    sim = make_sim(slots=1, endless=True, tokens_per_second=50.0)
    with raw_post(sim, "/v1/chat/completions", {"messages": HELLO, "stream": True}) as holder:
        sim.wait_for(of(EventKind.FIRST_TOKEN, request_id_of(sim, holder)), timeout=5)
        with raw_post(sim, "/v1/messages", body_for("/v1/messages")) as queued:
            queued_id = request_id_of(sim, queued)
            sim.wait_for(of(EventKind.REQUEST_QUEUED, queued_id), timeout=5)
            sim.stop()
            answer = b""
            while chunk := queued.recv(65536):
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503")
    assert json.loads(body)["type"] == "error"
    assert json.loads(body)["error"]["type"] == "api_error"
