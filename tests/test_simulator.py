"""The llama.cpp-like simulator, over real sockets and real threads.

Nothing here sleeps to wait for something: every wait is ``sim.wait_for`` on
the simulator's event log (a condition variable), or a blocking read, with a
bound.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from _sim import FAST, HELLO, of, raw_post, request_id_of
from wirecut.cli import main
from wirecut.simulator import (
    EventKind,
    RequestState,
    SimConfig,
    SimulatorServer,
    directive_responder,
)
from wirecut.simulator import _openai_format as openai_format
from wirecut.simulator._chat_request import MAX_TOKENS_LIMIT
from wirecut.simulator._slots import SlotPool


@pytest.fixture(scope="module")
def shared_sim() -> Iterator[SimulatorServer]:
    """One simulator for the tests whose requests never take a slot (they are refused)."""
    with SimulatorServer(SimConfig(**FAST, endless=True)) as server:
        yield server


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as c:
        yield c


def raw_request(sim: SimulatorServer, body: dict[str, Any]) -> socket.socket:
    """Send a chat completion on a raw socket and leave the response unread."""
    return raw_post(sim, "/v1/chat/completions", body)


def summary(sim: SimulatorServer, request_id: str) -> Any:
    return next(s for s in sim.requests() if s.id == request_id)


def stream_text(lines: Iterator[str]) -> tuple[str, list[dict[str, Any]]]:
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return text, chunks


# -- shapes -----------------------------------------------------------------


def test_health_models_and_slots_have_llama_cpp_shapes(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim(slots=2)
    assert client.get(sim.url + "/health").json() == {"status": "ok"}
    models = client.get(sim.base_url + "/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "wirecut-sim"
    slots = client.get(sim.url + "/slots").json()
    assert [(s["id"], s["is_processing"], s["n_decoded"]) for s in slots] == [
        (0, False, 0),
        (1, False, 0),
    ]
    assert sim.base_url == f"http://127.0.0.1:{sim.port}/v1"


def test_non_stream_reply_is_one_completion_with_usage(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim()
    resp = client.post(sim.base_url + "/chat/completions", json={"messages": HELLO})
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["finish_reason"] == "stop"
    content = body["choices"][0]["message"]["content"]
    assert len(content.split()) == 8
    assert body["usage"]["completion_tokens"] == 8
    assert body["id"] == f"chatcmpl-{resp.headers['x-request-id']}"


def test_stream_reply_has_chunks_finish_usage_and_done(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim()
    body = {"messages": HELLO, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", sim.base_url + "/chat/completions", json=body) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = list(resp.iter_lines())
    text, chunks = stream_text(iter(lines))
    assert len(text.split()) == 8
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    assert [line for line in lines if line][-1] == "data: [DONE]"


def test_same_request_gives_same_text_stream_or_not(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim()
    url = sim.base_url + "/chat/completions"
    first = client.post(url, json={"messages": HELLO}).json()["choices"][0]["message"]["content"]
    again = client.post(url, json={"messages": HELLO}).json()["choices"][0]["message"]["content"]
    with client.stream("POST", url, json={"messages": HELLO, "stream": True}) as resp:
        streamed, _ = stream_text(resp.iter_lines())
    other = client.post(url, json={"messages": [{"role": "user", "content": "bye"}]}).json()
    assert first == again == streamed
    assert other["choices"][0]["message"]["content"] != first


def test_max_tokens_caps_the_reply_with_finish_reason_length(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim()
    body = client.post(
        sim.base_url + "/chat/completions", json={"messages": HELLO, "max_tokens": 3}
    ).json()
    assert body["usage"]["completion_tokens"] == 3
    assert body["choices"][0]["finish_reason"] == "length"


def test_endless_decodes_up_to_max_tokens(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim(endless=True, reply_tokens=2, tokens_per_second=1000.0)
    body = client.post(
        sim.base_url + "/chat/completions", json={"messages": HELLO, "max_tokens": 40}
    ).json()
    assert body["usage"]["completion_tokens"] == 40
    assert body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"model": "x"}', "messages"),
        (b'{"messages": "hello"}', "messages"),
        (b'{"messages": []}', "messages"),
        (b'{"messages": [{"content": "no role"}]}', "messages[0].role"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": true}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', "stream"),
    ],
)
def test_bad_request_gets_openai_400(
    make_sim: Callable[..., SimulatorServer],
    client: httpx.Client,
    payload: bytes,
    param: str | None,
) -> None:
    sim = make_sim()
    resp = client.post(
        sim.base_url + "/chat/completions",
        content=payload,
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["code"] is None
    assert error["message"]
    assert sim.requests() == []


OUT_OF_RANGE = {
    "above_maxsize": str(sys.maxsize + 1),
    "2**64": str(2**64),
    "above_limit": str(MAX_TOKENS_LIMIT + 1),
    "zero": "0",
    "negative": "-1",
    "-2**70": str(-(2**70)),
    "5000_digits": "9" * 5000,  # more digits than Python parses
    "1e400": "1e400",  # a float: inf
    "-1e400": "-1e400",
    "1e300": "1e300",
    "2.5": "2.5",
    "NaN": "NaN",
    "Infinity": "Infinity",
    "true": "true",
    "string": '"5"',
    "array": "[5]",
}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non_stream"])
@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", OUT_OF_RANGE.values(), ids=OUT_OF_RANGE.keys())
def test_out_of_range_max_tokens_is_an_openai_400_before_any_slot(
    shared_sim: SimulatorServer, client: httpx.Client, stream: bool, name: str, value: str
) -> None:
    sim = shared_sim
    # Shared: look only at what this request leaves behind.
    since = sim.simulator.event_log.next_seq
    before = len(sim.requests())
    flag = "true" if stream else "false"
    payload = f'{{"messages": {json.dumps(HELLO)}, "stream": {flag}, "{name}": {value}}}'
    with client.stream(
        "POST",
        sim.base_url + "/chat/completions",
        content=payload.encode(),
        headers={"content-type": "application/json"},
    ) as resp:
        # The status first: a request wrongly accepted may stream without end.
        assert resp.status_code == 400
        assert resp.headers["content-type"] == "application/json"
        error = json.loads(resp.read())["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] in (name, None)  # None: the body itself could not be parsed
    assert error["message"]
    assert len(error["message"]) < 200
    assert len(sim.requests()) == before
    assert sim.events(since) == []


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non_stream"])
def test_the_largest_max_tokens_is_served(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client, stream: bool
) -> None:
    sim = make_sim(reply_tokens=2)
    body = {"messages": HELLO, "stream": stream, "max_tokens": MAX_TOKENS_LIMIT}
    resp = client.post(sim.base_url + "/chat/completions", json=body)
    assert resp.status_code == 200
    finished = sim.wait_for(of(EventKind.REQUEST_FINISHED, "req-1"))
    assert finished.detail == {"reason": "stop", "n_decoded": 2}


def test_a_body_nested_too_deeply_is_an_openai_400(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim()
    depth = 100_000
    resp = client.post(
        sim.base_url + "/chat/completions",
        content=b"[" * depth + b"]" * depth,
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert sim.requests() == []


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non_stream"])
def test_a_failure_after_taking_a_slot_still_ends_the_request(
    make_sim: Callable[..., SimulatorServer],
    client: httpx.Client,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
) -> None:
    """A bug in the simulator's decode loop: the request still ends, in the log and on the wire."""
    sim = make_sim(reply_tokens=8)
    calls = 0
    real_delta_for = openai_format.delta_for

    def failing_delta_for(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("planted failure")
        return real_delta_for(*args, **kwargs)

    def failing_completion(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("planted failure")

    # The stream fails at its third token, the non-stream reply when it is built.
    monkeypatch.setattr(openai_format, "delta_for", failing_delta_for)
    monkeypatch.setattr(openai_format, "completion", failing_completion)
    url = sim.base_url + "/chat/completions"
    if stream:
        with client.stream("POST", url, json={"messages": HELLO, "stream": True}) as resp:
            assert resp.status_code == 200
            text, _ = stream_text(resp.iter_lines())
        assert len(text.split()) == 2  # cut short: two tokens, no finish, no [DONE]
    else:
        resp = client.post(url, json={"messages": HELLO})
        assert resp.status_code == 500
        assert resp.json()["error"]["type"] == "server_error"
    freed = sim.wait_for(of(EventKind.SLOT_FREED, "req-1"))
    kinds = [ev.kind for ev in sim.events() if ev.request_id == "req-1" and ev.kind != "token"]
    assert kinds == [
        "request_received",
        "slot_acquired",
        "first_token",
        "request_finished",
        "slot_freed",
    ]
    finished = sim.wait_for(of(EventKind.REQUEST_FINISHED, "req-1"))
    assert finished.seq < freed.seq
    assert finished.detail["reason"] == "error"
    assert summary(sim, "req-1").state is RequestState.FAILED
    assert sim.slots()[0]["is_processing"] is False
    # The simulator goes on serving.
    monkeypatch.undo()
    assert client.post(url, json={"messages": HELLO}).status_code == 200


# -- prompt processing in batches --------------------------------------------

#: 41 batches of 100 tokens, 0.1 s each: a prompt of about 4 s.
BATCHED: dict[str, Any] = {"prompt_tokens_per_second": 1000.0, "prompt_batch": 100}
LONG_PROMPT = [{"role": "user", "content": " ".join(["word"] * 4000)}]
#: What the ChatML template adds to a one-message prompt: <|im_start|>, "user\n",
#: <|im_end|>, "\n", then <|im_start|> and "assistant\n" for the reply.
TEMPLATE_TOKENS = 6


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non_stream"])
def test_a_close_during_batched_prompt_processing_is_noticed_only_between_batches(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client, stream: bool
) -> None:
    sim = make_sim(**BATCHED)
    sock = raw_request(sim, {"messages": LONG_PROMPT, "stream": stream})
    with sock:
        request_id = request_id_of(sim, sock)
        first = sim.wait_for(of(EventKind.PROMPT_BATCH, request_id), timeout=5)
        slot = client.get(sim.url + "/slots").json()[0]
        sock.shutdown(socket.SHUT_RDWR)
        closed = sim.wait_for(of(EventKind.PEER_CLOSED, request_id), timeout=5)
        freed = sim.wait_for(of(EventKind.SLOT_FREED, request_id), timeout=5)
    assert first.detail == {"slot": 0, "n_prompt": 100, "of": 4000 + TEMPLATE_TOKENS}
    # While it processes the prompt, /slots says so under llama.cpp's names.
    assert slot["is_processing"] is True
    assert slot["n_decoded"] == 0
    assert slot["n_prompt_tokens"] == 4000 + TEMPLATE_TOKENS
    assert 100 <= slot["n_prompt_tokens_processed"] < 4000
    assert closed.detail["where"] == "prompt"
    assert closed.detail["n_decoded"] == 0
    batches = [ev for ev in sim.events() if of(EventKind.PROMPT_BATCH, request_id)(ev)]
    # The batch under way when the client left was finished, and no other began.
    seen_at = closed.detail["t_disconnect"]
    assert isinstance(seen_at, float)
    assert len([ev for ev in batches if ev.t >= seen_at]) == 1
    assert batches[-1].seq < closed.seq < freed.seq
    assert batches[-1].detail["n_prompt"] < 4000
    assert not any(ev.kind == EventKind.FIRST_TOKEN for ev in sim.events())
    assert summary(sim, request_id).state is RequestState.PEER_CLOSED
    assert sim.slots()[0]["is_processing"] is False


def test_a_batched_prompt_that_is_not_cut_is_processed_whole_then_decoded(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim(prompt_tokens_per_second=20000.0, prompt_batch=512)
    body = {"messages": [{"role": "user", "content": " ".join(["word"] * 1200)}]}
    reply = client.post(sim.base_url + "/chat/completions", json=body).json()
    assert reply["usage"]["prompt_tokens"] == 1200 + TEMPLATE_TOKENS
    # The reply leaves before the request's last events are logged: wait for them.
    sim.wait_for(lambda ev: ev.kind == EventKind.SLOT_FREED, timeout=5)
    kinds = [ev.kind for ev in sim.events() if ev.kind != "token"]
    assert kinds == [
        "request_received",
        "slot_acquired",
        "prompt_batch",
        "prompt_batch",
        "prompt_batch",
        "first_token",
        "request_finished",
        "slot_freed",
    ]
    sizes = [ev.detail["n_prompt"] for ev in sim.events() if ev.kind == "prompt_batch"]
    assert sizes == [512, 1024, 1200 + TEMPLATE_TOKENS]
    slot = sim.slots()[0]
    assert slot["n_prompt_tokens"] == slot["n_prompt_tokens_processed"] == 1200 + TEMPLATE_TOKENS


def test_stop_ends_a_batched_prompt_at_once(make_sim: Callable[..., SimulatorServer]) -> None:
    sim = make_sim(prompt_tokens_per_second=10.0, prompt_batch=4096)
    sock = raw_request(sim, {"messages": LONG_PROMPT, "stream": True})
    with sock:
        request_id = request_id_of(sim, sock)
        sim.wait_for(of(EventKind.SLOT_ACQUIRED, request_id), timeout=5)
        sim.stop()  # A prompt of 400 s: only the stop can end it before the test's timeout.
        finished = sim.wait_for(of(EventKind.REQUEST_FINISHED, request_id), timeout=0)
    assert finished.detail["reason"] == "shutdown"


# -- slots and queue ----------------------------------------------------------


def test_second_client_waits_for_the_only_slot(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim(slots=1, tokens_per_second=100.0, reply_tokens=10)
    url = sim.base_url + "/chat/completions"
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(client.post, url, json={"messages": HELLO})
        sim.wait_for(of(EventKind.SLOT_ACQUIRED, "req-1"), timeout=5)
        second = pool.submit(client.post, url, json={"messages": HELLO})
        queued = sim.wait_for(of(EventKind.REQUEST_QUEUED, "req-2"), timeout=5)
        assert queued.detail["position"] == 1
        assert sim.slots()[0]["request_id"] == "req-1"
        assert first.result(10).status_code == second.result(10).status_code == 200
    freed = sim.wait_for(of(EventKind.SLOT_FREED, "req-1"), timeout=5)
    acquired = sim.wait_for(of(EventKind.SLOT_ACQUIRED, "req-2"), timeout=5)
    assert queued.seq < freed.seq < acquired.seq
    # The reply is sent before the simulator records its end: wait for that end.
    sim.wait_for(of(EventKind.REQUEST_FINISHED, "req-2"), timeout=5)
    assert [s.state for s in sim.requests()] == [RequestState.FINISHED] * 2


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non_stream"])
@pytest.mark.parametrize("how", ["shutdown", "close"])
def test_peer_close_is_noticed_at_the_next_token_and_frees_the_slot(
    make_sim: Callable[..., SimulatorServer], stream: bool, how: str
) -> None:
    # Order and counts only: how soon after the cut it is noticed (within one
    # token interval) is a timing, measured by the benchmarks.
    sim = make_sim(endless=True, tokens_per_second=20.0)
    sock = raw_request(sim, {"messages": HELLO, "stream": stream})
    with sock:
        request_id = request_id_of(sim, sock)
        sim.wait_for(
            lambda ev: ev.request_id == request_id and ev.kind == "token" and ev.detail["n"] >= 3,
            timeout=5,
        )
        if how == "shutdown":
            sock.shutdown(socket.SHUT_RDWR)
        else:
            sock.close()
        closed = sim.wait_for(of(EventKind.PEER_CLOSED, request_id), timeout=5)
        freed = sim.wait_for(of(EventKind.SLOT_FREED, request_id), timeout=5)
    assert closed.detail["where"] == "decode"
    assert freed.seq > closed.seq
    done = summary(sim, request_id)
    assert done.closed_by_peer
    assert done.state is RequestState.PEER_CLOSED
    tokens = [ev for ev in sim.events() if ev.kind == "token" and ev.request_id == request_id]
    assert done.n_decoded == closed.detail["n_decoded"] == len(tokens) >= 3
    assert all(ev.seq < closed.seq for ev in tokens)
    # Not one more token once the close was seen: it is checked before each.
    seen_at = closed.detail["t_disconnect"]
    assert isinstance(seen_at, float)
    assert all(ev.t < seen_at for ev in tokens)
    assert sim.slots()[0]["is_processing"] is False


def test_queued_client_that_leaves_never_takes_a_slot(
    make_sim: Callable[..., SimulatorServer],
) -> None:
    sim = make_sim(slots=1, endless=True, tokens_per_second=50.0)
    holder = raw_request(sim, {"messages": HELLO, "stream": True})
    with holder:
        holder_id = request_id_of(sim, holder)
        sim.wait_for(of(EventKind.FIRST_TOKEN, holder_id), timeout=5)
        with raw_request(sim, {"messages": HELLO}) as leaver:
            leaver_id = request_id_of(sim, leaver)
            sim.wait_for(of(EventKind.REQUEST_QUEUED, leaver_id), timeout=5)
            leaver.shutdown(socket.SHUT_RDWR)
            # In the queue there is no token to wait for: it is noticed while
            # the holder still decodes (the wait ends before the holder is cut).
            closed = sim.wait_for(of(EventKind.PEER_CLOSED, leaver_id), timeout=5)
        assert closed.detail["where"] == "queue"
        assert not any(ev.kind == "slot_freed" for ev in sim.events(closed.seq))
        holder.shutdown(socket.SHUT_RDWR)
        sim.wait_for(of(EventKind.SLOT_FREED, holder_id), timeout=5)

    with httpx.Client(timeout=10) as c:
        after = c.post(
            sim.base_url + "/chat/completions", json={"messages": HELLO, "max_tokens": 2}
        )
    assert after.status_code == 200
    assert not any(ev.request_id == leaver_id and ev.kind == "slot_acquired" for ev in sim.events())
    left = summary(sim, leaver_id)
    assert (left.state, left.n_decoded, left.slot) == (RequestState.PEER_CLOSED, 0, None)


async def _queue_up(pool: SlotPool, waiters: int) -> None:
    # Yield to the event loop until the tasks are queued: no clock involved.
    for _ in range(100):
        if pool.queue_length == waiters:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{pool.queue_length} waiters queued, not {waiters}")


@pytest.mark.parametrize("order", ["release_then_leave", "leave_then_release"])
def test_slot_pool_passes_on_a_slot_handed_to_a_waiter_that_left(order: str) -> None:
    """Give-up and release in the same tick: the slot goes to the next waiter, not lost."""

    async def scenario() -> None:
        pool = SlotPool(1)
        holder = pool.try_acquire("a")
        assert holder is not None
        leaving, staying = asyncio.Event(), asyncio.Event()
        leaver = asyncio.create_task(pool.acquire("b", leaving))
        stayer = asyncio.create_task(pool.acquire("c", staying))
        await _queue_up(pool, 2)
        # No await in between: both happen before either waiter runs again.
        if order == "release_then_leave":
            pool.release(holder)
            leaving.set()
        else:
            leaving.set()
            pool.release(holder)
        assert await leaver is None
        slot = await asyncio.wait_for(stayer, 5)
        assert slot is holder
        assert pool.snapshot()[0]["request_id"] == "c"

    asyncio.run(scenario())


def test_slot_pool_keeps_a_slot_free_when_its_only_waiter_left_as_it_came() -> None:
    async def scenario() -> None:
        pool = SlotPool(1)
        holder = pool.try_acquire("a")
        assert holder is not None
        leaving = asyncio.Event()
        leaver = asyncio.create_task(pool.acquire("b", leaving))
        await _queue_up(pool, 1)
        pool.release(holder)
        leaving.set()
        assert await leaver is None
        assert pool.queue_length == 0
        assert pool.try_acquire("c") is holder
        assert pool.try_acquire("d") is None  # one slot, not two

    asyncio.run(scenario())


def test_events_are_ordered_with_monotonic_timestamps(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim(reply_tokens=4)
    client.post(sim.base_url + "/chat/completions", json={"messages": HELLO})
    sim.wait_for(of(EventKind.SLOT_FREED, "req-1"), timeout=5)
    events = client.get(sim.url + "/sim/events").json()
    assert [e["seq"] for e in events] == list(range(len(events)))
    times = [e["t"] for e in events]
    assert times == sorted(times)
    assert [e["kind"] for e in events] == [
        "request_received",
        "slot_acquired",
        "first_token",
        *["token"] * 4,
        "request_finished",
        "slot_freed",
    ]
    first_token = events[2]["t"]
    assert first_token - events[1]["t"] >= 0.010  # prompt_ms passed before it
    tail = client.get(sim.url + "/sim/events", params={"since": len(events) - 2}).json()
    assert [e["kind"] for e in tail] == ["request_finished", "slot_freed"]
    requests = client.get(sim.url + "/sim/requests").json()
    assert requests[0]["id"] == "req-1"
    assert requests[0]["t_start"] <= requests[0]["t_end"]
    assert client.post(sim.url + "/sim/reset").json() == {"status": "ok"}
    assert sim.events() == []
    assert sim.requests() == []


# -- scripting hook -----------------------------------------------------------


def _tool_script(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "content": "Let me look.",
        "tool_calls": [
            {"function": {"name": "shell", "arguments": {"cmd": "ls -la /tmp/some/long/path"}}},
        ],
    }


def test_scripted_tool_calls_non_stream(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    seen: list[dict[str, Any]] = []

    def responder(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request)
        return _tool_script(request)

    sim = make_sim(responder=responder)
    tools = [{"type": "function", "function": {"name": "shell", "parameters": {}}}]
    body = client.post(
        sim.base_url + "/chat/completions", json={"messages": HELLO, "tools": tools}
    ).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me look."
    (call,) = choice["message"]["tool_calls"]
    assert call["id"] == "call_s1_0"
    assert call["function"]["name"] == "shell"
    assert json.loads(call["function"]["arguments"]) == {"cmd": "ls -la /tmp/some/long/path"}
    assert seen[0]["tools"] == tools
    # One token per word of content, one for the header, one per argument chunk.
    assert body["usage"]["completion_tokens"] == summary(sim, "req-1").n_decoded > 5


def test_scripted_tool_calls_stream_as_indexed_deltas(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim(responder=_tool_script)
    body = {"messages": HELLO, "stream": True}
    with client.stream("POST", sim.base_url + "/chat/completions", json=body) as resp:
        text, chunks = stream_text(resp.iter_lines())
    assert text == "Let me look."
    deltas = [c["choices"][0]["delta"] for c in chunks]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0] == {
        "index": 0,
        "id": "call_s1_0",
        "type": "function",
        "function": {"name": "shell", "arguments": ""},
    }
    assert all(c["index"] == 0 and set(c) == {"index", "function"} for c in calls[1:])
    assert len(calls) > 2
    arguments = "".join(c["function"]["arguments"] for c in calls)
    assert json.loads(arguments) == {"cmd": "ls -la /tmp/some/long/path"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_scripted_reply_works_with_the_openai_sdk(
    make_sim: Callable[..., SimulatorServer],
) -> None:
    openai = pytest.importorskip("openai")
    sim = make_sim(responder=_tool_script)
    with openai.OpenAI(base_url=sim.base_url, api_key="sim", max_retries=0) as sdk:
        stream = sdk.chat.completions.create(model="m", messages=HELLO, stream=True)
        names = [
            call.function.name
            for chunk in stream
            for call in (chunk.choices[0].delta.tool_calls or [] if chunk.choices else [])
            if call.function and call.function.name
        ]
    assert names == ["shell"]


def test_directive_responder_reads_the_reply_from_the_last_user_message(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim(responder=directive_responder)
    url = sim.base_url + "/chat/completions"
    directive = '#sim-reply {"content": "scripted words here"}'
    scripted = client.post(url, json={"messages": [{"role": "user", "content": directive}]})
    plain = client.post(url, json={"messages": HELLO})
    broken = client.post(url, json={"messages": [{"role": "user", "content": "#sim-reply ["}]})
    assert scripted.json()["choices"][0]["message"]["content"] == "scripted words here"
    assert len(plain.json()["choices"][0]["message"]["content"].split()) == 8
    assert broken.status_code == 500
    assert broken.json()["error"]["type"] == "server_error"


# -- lifecycle --------------------------------------------------------------


def test_stop_ends_an_endless_stream_and_joins_the_thread() -> None:
    sim = SimulatorServer(SimConfig(endless=True, tokens_per_second=50.0, prompt_ms=0))
    sim.start()
    try:
        sock = raw_request(sim, {"messages": HELLO, "stream": True})
        with sock:
            request_id = request_id_of(sim, sock)
            sim.wait_for(of(EventKind.FIRST_TOKEN, request_id), timeout=5)
            sim.stop()
            finished = sim.wait_for(of(EventKind.REQUEST_FINISHED, request_id), timeout=0)
            sock.settimeout(5)
            while sock.recv(65536):
                pass  # the server closes the connection: recv reaches EOF
    finally:
        sim.stop()
    assert finished.detail["reason"] == "shutdown"
    with pytest.raises(RuntimeError, match="stopped"):
        sim.start()


def test_server_that_cannot_listen_says_so(make_sim: Callable[..., SimulatorServer]) -> None:
    busy = make_sim()
    clash = SimulatorServer(SimConfig(), port=busy.port)
    with pytest.raises(RuntimeError, match="could not listen"):
        clash.start()
    assert clash.state.value == "stopped"


@pytest.mark.parametrize(
    "bad",
    [
        {"slots": 0},
        {"tokens_per_second": 0},
        {"tokens_per_second": float("nan")},
        {"prompt_ms": -1},
        {"prompt_tokens_per_second": 0},
        {"prompt_tokens_per_second": float("inf")},
        {"prompt_batch": 0},
        {"reply_tokens": -1},
        {"slots": True},
        {"multibyte_every": -1},
        {"multibyte_every": 1.5},
    ],
)
def test_sim_config_rejects_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        SimConfig(**bad)


def test_simulator_imports_nothing_from_the_client_side() -> None:
    code = (
        "import sys, wirecut.simulator\n"
        "bad = [m for m in sys.modules if m.split('.')[:2] in "
        "(['wirecut', 'scope'], ['wirecut', 'http'], ['wirecut', 'provider'],"
        " ['wirecut', 'proxy'])]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


# -- command line -----------------------------------------------------------


def test_provider_help_lists_the_protocol_flags() -> None:
    result = CliRunner().invoke(main, ["provider", "--help"])
    assert result.exit_code == 0
    for flag in ("--host", "--port", "--slots", "--tokens-per-second", "--prompt-ms"):
        assert flag in result.output
    assert "--reply-tokens" in result.output
    assert "--endless" in result.output
    assert "--prompt-tokens-per-second" in result.output
    assert "--prompt-batch" in result.output
    assert "--multibyte-every" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["--tokens-per-second", "-1"],
        ["--tokens-per-second", "nan"],
        ["--prompt-ms", "-5"],
        ["--prompt-tokens-per-second", "0"],
        ["--prompt-tokens-per-second", "nan"],
        ["--prompt-batch", "0"],
        ["--slots", "0"],
        ["--reply-tokens", "-1"],
        ["--multibyte-every", "-1"],
        ["--port", "70000"],
        ["--no-such-flag"],
    ],
)
def test_provider_bad_flag_exits_2(args: list[str]) -> None:
    result = CliRunner().invoke(main, ["provider", *args])
    assert result.exit_code == 2, result.output


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_serves_until_a_signal_then_exits_0(sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "wirecut", "provider", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.fullmatch(r"wirecut provider: (http://127\.0\.0\.1:\d+/v1) \(.*\)\n", line)
        assert match, line
        assert httpx.get(match[1].removesuffix("/v1") + "/health").json() == {"status": "ok"}
        proc.send_signal(sig)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_cli_multibyte_every_makes_generated_replies_multi_byte() -> None:
    argv = [sys.executable, "-m", "wirecut", "provider", "--port", "0", "--prompt-ms", "0"]
    argv += ["--tokens-per-second", "1000", "--reply-tokens", "4", "--multibyte-every", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "a multi-byte word in 1" in line, line
        base = line.partition(": ")[2].split(" ")[0]
        reply = httpx.post(base + "/chat/completions", json={"messages": HELLO}, timeout=10).json()
        text = reply["choices"][0]["message"]["content"]
        assert not text.isascii()
        assert reply["usage"]["completion_tokens"] >= 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
