"""``wirecut doctor``: which provider is this, and does a cut free its slot?

Every test runs the real command in a subprocess against a real loopback
server: the simulator (which answers ``/slots`` like llama.cpp), small
Starlette fakes of vLLM's ``/metrics`` and Ollama's ``/api/ps`` whose
requests end when their client leaves, a fake that keeps "decoding" after
its client left, one that exposes nothing, and (``local`` marker) the real
embedded llama.cpp. The simulator and the fakes need no 1.5 s between polls:
``--min-poll`` (hidden) shortens it, ``--window`` the watch after a cut.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from wirecut.simulator import EventKind, SimConfig, SimulatorServer

FAST = ("--min-poll", "0.05", "--window", "2")
#: The fakes answer at once: there is no prompt phase to cut.
NO_PREFILL = ("--modes", "stream,non-stream,queued")


def _doctor(url: str | None, *args: str, timeout: float = 50) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "wirecut", "doctor"]
    if url is not None:
        argv += ["--provider-url", url]
    env = {k: v for k, v in __import__("os").environ.items() if not k.endswith("_URL")}
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def _json(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(run.stdout)
    return found


def _checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {check["mode"]: check for check in report["checks"]}


# -- a fake provider ------------------------------------------------------------------


#: How long a "stuck-late" fake takes to give a non-streaming request its slot.
LATE_START = 0.5


class FakeProvider:
    """A tiny OpenAI-compatible provider on loopback, dressed as ``kind``.

    ``kind``: "vllm" (``/metrics`` with ``vllm:num_requests_running``),
    "ollama" (``/api/version``, ``/api/ps`` whose ``expires_at`` moves when
    the last request ends), "plain" (nothing but the chat endpoint), or
    "stuck" (llama.cpp-like ``/slots``; a request keeps its slot after its
    client left, until the test sets ``let_go``), "stuck-late" (the same, and
    a non-streaming request takes its slot ``LATE_START`` after it came, as a
    provider that starts work whose client left meanwhile), "llama" (the same ``/slots``,
    released when the client leaves), or "web" (not an LLM API: an HTML page
    for every GET, 501 for every POST). Replies stream a chunk every 20 ms
    until the client leaves. ``slot_reads`` holds the time of each ``/slots``
    request.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.let_go = threading.Event()
        self._pending: set[asyncio.Task[None]] = set()
        # Guards the counters; the test's teardown waits on it for running == 0.
        self.cond = threading.Condition()
        self.running = 0
        self.requests = 0
        self.expires_at = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
        self.slot_reads: list[float] = []
        if kind == "web":
            self.app = Starlette(routes=[Route("/{path:path}", self.web, methods=["GET", "POST"])])
            return
        routes = [Route("/v1/chat/completions", self.chat, methods=["POST"])]
        if kind == "vllm":
            routes.append(Route("/metrics", self.metrics))
        if kind == "ollama":
            routes += [Route("/api/version", self.version), Route("/api/ps", self.ps)]
        if kind in ("stuck", "stuck-late", "llama"):
            routes.append(Route("/slots", self.slots))
        self.app = Starlette(routes=routes)

    def _begin(self) -> None:
        with self.cond:
            self.running += 1
            self.requests += 1

    def _end(self) -> None:
        with self.cond:
            self.running -= 1
            self.expires_at = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
            self.cond.notify_all()

    async def _finish_later(self) -> None:
        await asyncio.to_thread(self.let_go.wait, 30)
        self._end()

    def wait_idle(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.running == 0, timeout)

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        if self.kind == "stuck-late" and not body.get("stream"):
            await asyncio.sleep(LATE_START)
        self._begin()
        stuck = self.kind in ("stuck", "stuck-late")
        if stuck:
            # The "slot" is let go on its own clock, whatever the client does.
            self._pending.add(asyncio.get_running_loop().create_task(self._finish_later()))
        if body.get("stream"):
            return StreamingResponse(self._chunks(stuck), media_type="text/event-stream")
        try:
            # The body was read: the next message is the client leaving.
            while (await request.receive())["type"] != "http.disconnect":
                pass
        finally:
            if not stuck:
                self._end()
        return Response(status_code=499)

    async def _chunks(self, stuck: bool) -> AsyncIterator[str]:
        chunk = {"choices": [{"index": 0, "delta": {"content": "word "}, "finish_reason": None}]}
        try:
            while True:
                yield f"data: {json.dumps(chunk)}\n\n"
                await asyncio.sleep(0.02)
        finally:
            if not stuck:
                self._end()

    async def metrics(self, request: Request) -> Response:
        label = '{model_name="fake"}'
        return PlainTextResponse(
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{label} {float(self.running)}\n"
            f"vllm:num_requests_waiting{label} 0.0\n"
        )

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": "0.9.0"})

    async def ps(self, request: Request) -> Response:
        model = {"name": "fake:1b", "model": "fake:1b", "expires_at": self.expires_at}
        return JSONResponse({"models": [model]})

    async def web(self, request: Request) -> Response:
        page = "<!DOCTYPE html><html><head><title>Welcome</title></head><body>hi</body></html>"
        return HTMLResponse(page, status_code=200 if request.method == "GET" else 501)

    async def slots(self, request: Request) -> Response:
        self.slot_reads.append(time.monotonic())
        return JSONResponse(
            [{"id": 0, "is_processing": self.running > 0, "id_task": self.requests}]
        )


class _Uvicorn(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, listening: threading.Event) -> None:
        super().__init__(config)
        self.listening = listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.listening.set()


@pytest.fixture
def fake(request: pytest.FixtureRequest) -> Iterator[tuple[FakeProvider, str]]:
    provider = FakeProvider(request.param)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    listening = threading.Event()
    config = uvicorn.Config(
        provider.app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2
    )
    server = _Uvicorn(config, listening)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    assert listening.wait(10)
    try:
        yield provider, f"http://127.0.0.1:{port}/v1"
    finally:
        provider.let_go.set()
        provider.wait_idle(10)
        server.should_exit = True
        thread.join(10)
        sock.close()


# -- the simulator --------------------------------------------------------------------


#: The simulator as llama.cpp with small prompt batches: 100 tokens a batch, 0.1 s each.
SMALL_BATCHES = {"prompt_tokens_per_second": 1000.0, "prompt_batch": 100}


def test_doctor_reports_every_cut_released_on_the_simulator() -> None:
    config = SimConfig(slots=1, endless=True, tokens_per_second=50, **SMALL_BATCHES)
    with SimulatorServer(config) as sim:
        run = _doctor(sim.base_url, "--json", *FAST)
        closes = [ev for ev in sim.events() if ev.kind == EventKind.PEER_CLOSED]
    assert run.returncode == 0, run.stdout + run.stderr
    report = _json(run)
    assert report["provider"] == "llama.cpp"
    checks = _checks(report)
    assert list(checks) == ["stream", "non-stream", "queued", "prefill"]
    for check in checks.values():
        assert check["released"] is True, check
        assert check["how"] == "/slots"
    assert checks["stream"]["release_ms"] >= 0
    assert checks["non-stream"]["release_ms"] >= 0
    assert checks["prefill"]["release_ms"] >= 0
    # The provider's own record agrees: stream, non-stream, the queued one and
    # its blocker, the prefill one.
    assert len(closes) == 5
    assert {ev.detail["where"] for ev in closes} == {"decode", "queue", "prompt"}
    assert report["advice"]


def test_doctor_prefill_cut_is_released_between_batches_of_the_simulator() -> None:
    config = SimConfig(slots=1, **SMALL_BATCHES)
    with SimulatorServer(config) as sim:
        run = _doctor(sim.base_url, "--json", "--modes", "prefill", *FAST)
        events = sim.events()
    assert run.returncode == 0, run.stdout + run.stderr
    check = _checks(_json(run))["prefill"]
    assert check["released"] is True, check
    assert check["release_ms"] >= 0
    # The simulator saw the close during the prompt, before its last batch.
    (closed,) = [ev for ev in events if ev.kind == EventKind.PEER_CLOSED]
    assert closed.detail["where"] == "prompt"
    batches = [ev for ev in events if ev.kind == EventKind.PROMPT_BATCH]
    assert batches[-1].detail["n_prompt"] < batches[-1].detail["of"]
    assert batches[-1].detail["of"] >= 3000
    assert not any(ev.kind == EventKind.FIRST_TOKEN for ev in events)


def test_doctor_prefill_says_not_released_when_the_prompt_is_one_long_batch() -> None:
    # llama.cpp's default: a batch (2048 tokens) holds more than the whole prompt,
    # processed at 300 tokens/s: the slot is held for about 10 s after the cut.
    config = SimConfig(slots=1, prompt_tokens_per_second=300.0, prompt_batch=4096)
    with SimulatorServer(config) as sim:
        run = _doctor(sim.base_url, "--json", "--modes", "prefill", *FAST)
        events = sim.events()
    assert run.returncode == 1, run.stdout + run.stderr
    report = _json(run)
    check = _checks(report)["prefill"]
    assert check["released"] is False, check
    assert check["release_ms"] is None
    assert any("--batch-size" in line and "--ubatch-size" in line for line in report["advice"])
    # The slot was still held: the simulator had not yet seen the close.
    assert not any(ev.kind == EventKind.PEER_CLOSED for ev in events)


@pytest.mark.parametrize(
    ("release_ms", "advised"),
    [(1500.0, False), (2994.3, False), (4475.0, True), (None, True)],
)
def test_prefill_advice_comes_only_when_the_slot_was_certainly_held_past_2_s(
    release_ms: float | None, advised: bool
) -> None:
    from wirecut.proof._doctor import Check, CheckMode, advise
    from wirecut.proof._watchers import LlamaWatcher

    with httpx.Client() as http:
        watcher = LlamaWatcher("http://x", http, use_slots=True, use_metrics=True, slots=2)
    checks = [
        Check(CheckMode.STREAM, True, 1500.0, "/slots"),
        Check(CheckMode.PREFILL, release_ms is not None, release_ms, "/slots"),
    ]
    # Readings 1.5 s apart: a release seen at 2994 ms may have come at 1495 ms.
    advice = advise(watcher, checks, poll_interval=1.5)
    assert any("--batch-size" in line for line in advice) is advised
    assert any("nothing to change" in line for line in advice) is (not advised)


def test_queued_advice_names_what_keeps_requests_out_of_the_engines_queue() -> None:
    # No flag of llama.cpp stops it starting a queued request whose client
    # left: the advice must name what a user can do (wirecut's own line).
    from wirecut.proof._doctor import Check, CheckMode, advise
    from wirecut.proof._watchers import LlamaWatcher

    with httpx.Client() as http:
        watcher = LlamaWatcher("http://x", http, use_slots=True, use_metrics=True, slots=2)
    checks = [Check(CheckMode.QUEUED, False, None, "/slots")]
    (queued,) = [line for line in advise(watcher, checks) if "#13262" in line]
    assert "wirecut serve" in queued
    assert "wirecut proxy" in queued


def test_doctor_prints_a_report_for_people_without_json() -> None:
    config = SimConfig(slots=1, endless=True, tokens_per_second=50, **SMALL_BATCHES)
    with SimulatorServer(config) as sim:
        run = _doctor(sim.base_url, *FAST)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("provider: llama.cpp")
    assert any(line.startswith("stream") and "released" in line for line in lines)
    assert "advice:" in lines


# -- fakes ------------------------------------------------------------------------------


@pytest.mark.parametrize("fake", ["vllm"], indirect=True)
def test_doctor_reads_vllm_metrics(fake: tuple[FakeProvider, str]) -> None:
    provider, url = fake
    run = _doctor(url, "--json", *FAST, *NO_PREFILL)
    assert run.returncode == 0, run.stdout + run.stderr
    report = _json(run)
    assert report["provider"] == "vllm"
    checks = _checks(report)
    assert list(checks) == ["stream", "non-stream"]  # No slots: no queued check.
    assert {c["how"] for c in checks.values()} == {"/metrics"}
    assert all(c["released"] is True for c in checks.values())
    assert provider.requests == 2


@pytest.mark.parametrize("fake", ["ollama"], indirect=True)
def test_doctor_reads_ollama_ps(fake: tuple[FakeProvider, str]) -> None:
    _, url = fake
    run = _doctor(url, "--json", *FAST, *NO_PREFILL)
    assert run.returncode == 0, run.stdout + run.stderr
    report = _json(run)
    assert report["provider"] == "ollama"
    checks = _checks(report)
    assert list(checks) == ["stream", "non-stream"]
    assert {c["how"] for c in checks.values()} == {"/api/ps"}
    assert all(c["released"] is True for c in checks.values())


# "stuck-late": the stream check leaves its request running, and the
# non-stream request shows up on the provider only after a while. A baseline
# taken before the first check saw the stuck stream as the new request
# running, then the late one as another task: "released", a false verdict.
@pytest.mark.parametrize("fake", ["stuck", "stuck-late"], indirect=True)
def test_doctor_says_not_released_when_the_provider_keeps_running(
    fake: tuple[FakeProvider, str],
) -> None:
    _, url = fake
    run = _doctor(url, "--json", "--min-poll", "0.05", "--window", "1", *NO_PREFILL)
    assert run.returncode == 1
    report = _json(run)
    checks = _checks(report)
    assert checks["stream"]["released"] is False
    assert checks["non-stream"]["released"] is False
    assert checks["stream"]["release_ms"] is None
    assert any("after its client left" in line for line in report["advice"])


@pytest.mark.parametrize("fake", ["plain"], indirect=True)
def test_doctor_says_unknown_plainly_for_a_provider_that_exposes_nothing(
    fake: tuple[FakeProvider, str],
) -> None:
    _, url = fake
    run = _doctor(url, "--json", *FAST)
    assert run.returncode == 1
    report = _json(run)
    assert report["provider"] == "unknown"
    assert [c["mode"] for c in report["checks"]] == ["stream", "non-stream", "prefill"]
    assert all(c["released"] is None for c in report["checks"])
    assert any("cannot see" in line for line in report["advice"])


@pytest.mark.parametrize("fake", ["llama"], indirect=True)
def test_doctor_reads_llama_cpp_slots_no_faster_than_every_1_5_s_by_default(
    fake: tuple[FakeProvider, str],
) -> None:
    provider, url = fake
    # No --min-poll: the default pace. identify() reads /slots too, and counts.
    run = _doctor(url, "--json", "--window", "2", "--modes", "stream,prefill")
    assert run.returncode == 1, run.stdout + run.stderr  # prefill: the fake answers at once
    report = _json(run)
    assert report["provider"] == "llama.cpp"
    assert _checks(report)["stream"]["released"] is True
    reads = provider.slot_reads
    assert len(reads) >= 4  # identify, idle, busy, after the cut (and the prefill's)
    gaps = [later - earlier for earlier, later in itertools.pairwise(reads)]
    # 50 ms for the requests' own way to the server; a faster pace is a bug.
    assert min(gaps) >= 1.5 - 0.05, gaps


@pytest.mark.parametrize("fake", ["web"], indirect=True)
def test_doctor_says_in_one_line_that_a_web_server_is_not_an_openai_api(
    fake: tuple[FakeProvider, str],
) -> None:
    _, url = fake
    run = _doctor(url, "--json", *FAST)
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1, run.stderr
    assert f"{url} is not an OpenAI-compatible API" in run.stderr
    assert "<" not in run.stderr  # no HTML snippet
    assert "unknown" not in run.stderr
    assert "Traceback" not in run.stderr


# -- usage ---------------------------------------------------------------------------------


def test_doctor_without_a_provider_url_is_a_usage_error() -> None:
    run = _doctor(None)
    assert run.returncode == 2
    assert "--provider-url" in run.stderr
    assert "Traceback" not in run.stderr


def test_doctor_with_a_bad_url_is_a_usage_error() -> None:
    run = _doctor("localhost:8080")
    assert run.returncode == 2
    assert "Traceback" not in run.stderr


def test_doctor_says_in_one_line_when_the_provider_is_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # Bound, not listening: connections are refused.
        run = _doctor(f"http://127.0.0.1:{port}/v1")
    assert run.returncode == 1
    assert "cannot reach the provider" in run.stderr
    assert "Traceback" not in run.stderr


# -- the real llama.cpp ----------------------------------------------------------------------


@pytest.mark.local
@pytest.mark.timeout(120)
def test_doctor_reports_stream_non_stream_and_prefill_released_on_the_real_llama_cpp(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from wirecut.local import LocalServer, is_available

    if not is_available():
        pytest.skip("the extra `local` is not installed")
    started = time.monotonic()
    with LocalServer() as server:
        # The queued check is left out: its 1.5 s polls add a dozen seconds.
        run = _doctor(
            server.base_url,
            "--json",
            "--modes",
            "stream,non-stream,prefill",
            timeout=max(10.0, 110 - (time.monotonic() - started)),
        )
    assert run.returncode == 0, run.stdout + run.stderr
    report = _json(run)
    assert report["provider"] == "llama.cpp"
    checks = _checks(report)
    assert list(checks) == ["stream", "non-stream", "prefill"]
    assert checks["stream"]["released"] is True, checks
    assert checks["non-stream"]["released"] is True, checks
    # A prompt of about 3,000 tokens, cut while llama.cpp processed it: let go
    # within the watch, between two of the embedded server's batches.
    assert checks["prefill"]["released"] is True, checks
    assert "/slots" in checks["stream"]["how"]
