"""A cut during prompt processing: the console's slot watcher, and the real llama.cpp.

The watcher (``wirecut.console.server._slot_watch``) runs end to end here: a
real console over the simulator, whose prompt is processed in batches that
notice a closed client only between them (``prompt_tokens_per_second``,
``prompt_batch``), a ``chat`` cancelled over the WebSocket while its prompt is
processed, and ``/api/health`` and ``/metrics`` read over HTTP. The watcher
reads ``/slots`` at its default pace (1.5 s), so these take a few seconds.

The ``local`` tests run the embedded llama.cpp (extra ``local``) with the
batch size ``LocalServer`` chooses, and assert what happened in which order
(the prompt tokens llama.cpp processed, the slot's state), never a duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from _console import Console, ConsoleClient, health, running_console, wait_health
from wirecut.console.server import ConsoleConfig, ConsoleServer
from wirecut.console.server._slot_watch import SETTLE, SlotWatch
from wirecut.launch import Provider
from wirecut.record import CompleteFacts, Reason, UsageFacts
from wirecut.simulator import EventKind, SimConfig

#: Batches of 200 prompt tokens, 2 s each: a cut waits up to 2 s for the batch under way.
SLOW_BATCHES = SimConfig(
    slots=1,
    tokens_per_second=200,
    reply_tokens=5,
    prompt_tokens_per_second=100.0,
    prompt_batch=200,
)
LONG_LINE = "chat --new " + " ".join(["word"] * 600)


def _metric(server: ConsoleServer, name: str) -> float:
    text = httpx.get(server.url + "metrics", params={"token": server.token}).text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{name} not in /metrics"
    return float(match.group(1))


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    with running_console(tmp_path, sim=SLOW_BATCHES) as running:
        yield running


def test_a_cut_during_prompt_processing_is_watched_until_the_slot_is_free(
    console: Console,
) -> None:
    server, sim = console.server, console.sim
    assert health(server)["slots"] == {"busy_after_cut": 0}
    with console.client() as client:
        # The control: a command that ends by itself is not watched.
        done = client.complete(client.run("chat hi"))
        assert done["status"] == "ok"

        since = sim.simulator.event_log.next_seq
        id = client.run(LONG_LINE)
        # The first batch is done and the second under way: 2 s of prompt left to cut.
        batch = sim.wait_for(lambda ev: ev.kind == EventKind.PROMPT_BATCH, since=since)
        client.cancel(id)
        complete = client.complete(id)
    assert complete["status"] == "cancelled"
    assert complete["usage"]["requests"] == 1
    assert complete["lifecycle"]["open_requests"] == 0

    # The console's socket is shut; the provider still runs the prompt batch.
    busy = wait_health(server, lambda h: h["slots"]["busy_after_cut"] == 1)
    assert busy["slots"] == {"busy_after_cut": 1}
    closed = sim.wait_for_event(EventKind.PEER_CLOSED, batch.request_id, since=since)
    freed = sim.wait_for_event(EventKind.SLOT_FREED, batch.request_id, since=since)
    assert closed.detail["where"] == "prompt"
    idle = wait_health(server, lambda h: h["slots"]["busy_after_cut"] == 0)
    assert idle["slots"] == {"busy_after_cut": 0}

    assert _metric(server, "wirecut_slot_held_after_cut_ms_count") == 1
    assert _metric(server, "wirecut_slots_busy_after_cut") == 0
    # The reading that saw the slot free came after the simulator freed it:
    # the recorded hold is at least the simulator's own close -> free.
    t_disconnect = closed.detail["t_disconnect"]
    assert isinstance(t_disconnect, float)
    held_ms = _metric(server, "wirecut_slot_held_after_cut_ms_sum")
    assert held_ms >= (freed.t - t_disconnect) * 1000


# -- a provider without /slots ----------------------------------------------------------


class _Listening(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.listening.set()


async def _endless_chat(request: Request) -> Response:
    await request.body()

    async def chunks() -> AsyncIterator[str]:
        chunk = {"choices": [{"index": 0, "delta": {"content": "w "}, "finish_reason": None}]}
        while True:
            yield f"data: {json.dumps(chunk)}\n\n"
            await _pause()

    return StreamingResponse(chunks(), media_type="text/event-stream")


async def _pause() -> None:
    await asyncio.sleep(0.02)  # the provider's own pace of tokens


@contextlib.contextmanager
def _serving(app: Starlette) -> Iterator[str]:
    """``app`` on a loopback port, on a thread; its root URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = _Listening(
        uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    assert server.listening.wait(10)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
def slotless_provider() -> Iterator[str]:
    """An OpenAI-compatible stream without ``/slots`` (404), on loopback."""
    app = Starlette(routes=[Route("/v1/chat/completions", _endless_chat, methods=["POST"])])
    with _serving(app) as root:
        yield root + "/v1"


def test_after_a_cut_a_provider_without_slots_gives_null_not_zero(
    slotless_provider: str, tmp_path: Path
) -> None:
    provider = Provider(slotless_provider, "m", "no /slots (test)")
    with (
        ConsoleServer(ConsoleConfig(port=0, data_dir=tmp_path), provider) as server,
        ConsoleClient(server.ws_url) as client,
    ):
        assert health(server)["slots"] == {"busy_after_cut": 0}  # No cut yet.
        id = client.run("chat tell me a story")
        client.wait_output(id)
        client.cancel(id)
        assert client.complete(id)["status"] == "cancelled"
        after = wait_health(server, lambda h: h["slots"]["busy_after_cut"] is None)
    assert after["slots"] == {"busy_after_cut": None}


def test_the_cuts_of_a_burst_share_the_first_reading_of_slots_after_it() -> None:
    # A reading among a burst's completes held them back: the first waits
    # SETTLE after the first cut, and every cut of the burst shares it.
    reads: list[float] = []

    async def slots(request: Request) -> Response:
        reads.append(time.monotonic())
        return JSONResponse([{"id": 0, "id_task": 7, "is_processing": False}])

    cut = CompleteFacts.unstarted(Reason.USER, elapsed_ms=1.0).replace(usage=UsageFacts(requests=1))

    async def burst(root: str) -> list[float]:
        registry = CollectorRegistry()
        watch = SlotWatch(root, registry=registry, min_interval=0.5)
        completed = []
        try:
            # 16 completes, each in a loop turn of its own, as a burst's are.
            # (Spread over 0.16 s by sleeps, a loaded machine stretched them
            # past SETTLE: a reading then rightly came before the last one.)
            for _ in range(16):
                completed.append(time.monotonic())
                watch.completed(cut, 0.0)
                await asyncio.sleep(0)
            # Until every cut was seen released: the watcher has no event to
            # wait on, its readings are its own clock's.
            deadline = time.monotonic() + 10
            while registry.get_sample_value("wirecut_slot_held_after_cut_ms_count") != 16:
                assert time.monotonic() < deadline, reads
                await asyncio.sleep(0.05)
        finally:
            await watch.aclose()
        return completed

    with _serving(Starlette(routes=[Route("/slots", slots)])) as root:
        completed = asyncio.run(burst(root))
    assert len(reads) == 1, reads
    assert reads[0] > completed[-1]  # after the last cut of the burst
    assert reads[0] - completed[0] >= SETTLE


#: In a fresh interpreter: the console's lifespan, then one cut for its slot
#: watcher over a simulator process; prints the modules its first reading loaded.
_FIRST_READING = """
import asyncio, json, sys, tempfile, time
from pathlib import Path
from wirecut.record import UsageFacts
from wirecut.record import CompleteFacts, Reason
from wirecut.console.server import ConsoleConfig
from wirecut.launch import Provider
from wirecut.console.server import build_state, create_app
from wirecut.proof import SimProcess
from wirecut.simulator import SimConfig

async def main(base_url, data_dir):
    config = ConsoleConfig(port=0, data_dir=Path(data_dir))
    state = build_state(config, Provider(base_url, None, "sim"))
    app = create_app(state)
    watch = state.metrics.slot_watch
    async with app.router.lifespan_context(app):
        before = set(sys.modules)
        cut = CompleteFacts.unstarted(Reason.USER, elapsed_ms=1.0)
        watch.completed(cut.replace(usage=UsageFacts(requests=1)), 0.0)
        registry = state.metrics.registry
        deadline = time.monotonic() + 20
        while registry.get_sample_value("wirecut_slot_held_after_cut_ms_count") != 1:
            assert time.monotonic() < deadline, "no reading"
            await asyncio.sleep(0.05)
        print(json.dumps(sorted(set(sys.modules) - before)))

with SimProcess(SimConfig(slots=1)) as sim, tempfile.TemporaryDirectory() as data_dir:
    asyncio.run(main(sim.base_url, data_dir))
"""


def test_the_first_reading_of_slots_loads_nothing_on_the_event_loop() -> None:
    # httpx's async client imported anyio's backend and streams at its first
    # request, 16 to 35 ms of the event loop's CPU, and the first reading
    # comes SETTLE after a cut: in the middle of the next burst of cancels,
    # the slowest burst of every serve process. The lifespan loads them.
    ran = subprocess.run(
        [sys.executable, "-c", _FIRST_READING],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == []


# -- the real llama.cpp --------------------------------------------------------------------


def test_local_server_takes_batch_sizes_and_refuses_a_ubatch_above_its_batch() -> None:
    from wirecut.local import LocalServer

    default = LocalServer()
    assert (default.batch_size, default.ubatch_size) == (256, 256)
    assert LocalServer(batch_size=64).ubatch_size == 64
    with pytest.raises(ValueError, match="ubatch_size"):
        LocalServer(batch_size=128, ubatch_size=256)
    with pytest.raises(ValueError, match="ubatch_size"):
        LocalServer(batch_size=0)


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _prompt_tokens_total(root: str) -> int:
    with urllib.request.urlopen(root + "/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(r"^llamacpp:prompt_tokens_total (\S+)$", text, re.MULTILINE)
    assert match is not None, text
    return int(float(match.group(1)))


@pytest.mark.local
@pytest.mark.timeout(180)
def test_a_cut_during_a_long_prefill_frees_the_llama_cpp_slot_mid_prompt() -> None:
    from wirecut.local import LocalServer, is_available
    from wirecut.provider import ChatClient
    from wirecut.scope import InterruptScope

    if not is_available():
        pytest.skip("the extra `local` is not installed")
    with LocalServer() as server:
        root = server.root_url
        words = " ".join(["harbour", "storm", "lamp", "keeper"] * 800)  # about 3,200 tokens
        text = f"Logbook {time.time_ns():x}. {words}"
        n_prompt = len(
            httpx.post(root + "/tokenize", json={"content": text}, timeout=30).json()["tokens"]
        )
        assert n_prompt >= 3000
        before = _prompt_tokens_total(root)

        client = ChatClient(server.base_url, model=server.model, max_retries=0)
        scope = InterruptScope("prefill-test")
        tokens: list[str] = []
        future = scope.spawn(
            client.chat,
            [{"role": "user", "content": text}],
            on_token=tokens.append,
            max_tokens=8,
            id_slot=0,
        )
        # Look at once whether slot 0 runs the prompt, and cut then. Quick
        # readings delay only llama.cpp's notice of a closed client (each
        # answer restarts its 1 s wait), and none is made after the cut.
        deadline = time.monotonic() + 30
        while not _get_json(root + "/slots")[0]["is_processing"]:
            assert time.monotonic() < deadline, "slot 0 never took the request"
            assert not future.done()
            time.sleep(0.05)  # a state poll, bounded by the deadline
        assert tokens == []
        scope.cancel("test")
        result = future.result(30)
        assert result.interrupted
        assert scope.wait_quiescent(10)
        client.close()

        # Pinned to slot 0, this waits (deferred by llama.cpp) until slot 0 is free.
        probe = httpx.post(
            server.base_url + "/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "id_slot": 0},
            timeout=120,
        ).json()
        assert probe["choices"], probe
        slot = _get_json(root + "/slots")[0]
        processed = _prompt_tokens_total(root) - before - probe["usage"]["prompt_tokens"]

    assert tokens == []
    assert slot["is_processing"] is False
    # The slot was let go in the middle of the prompt, after fewer tokens
    # than one batch of llama.cpp's default n_batch (2048), let alone all.
    assert 0 < processed < 2048 < n_prompt, (processed, n_prompt)
