"""``wirecut.aio``: a cancel of the awaiting task cuts the thread's work, waits for it, says so.

End to end: the work is a real ``ChatClient`` request to the simulator over
loopback sockets (or a thread blocked in ``scope.sleep``), the cancel is a
real ``Task.cancel()``, and the claims are read from the simulator's event
log and the thread's own state, never from timing. The docs' web-app example
runs as written, under uvicorn in its own process.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import wirecut.scope as ws
from _support import BOUND, until
from wirecut.aio import CANCEL_REASON, Unwind, cancel_on_disconnect, run_sync, unwind_of
from wirecut.provider import ChatClient, ChatResult
from wirecut.scope import Interrupted, InterruptScope, TimelineEvent
from wirecut.simulator import EventKind, SimConfig, SimulatorServer

MESSAGES = [{"role": "user", "content": "tell me a long story"}]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def sim() -> Iterator[SimulatorServer]:
    config = SimConfig(slots=2, tokens_per_second=100, prompt_ms=5, endless=True)
    with SimulatorServer(config) as server:
        yield server


@pytest.fixture
def client(sim: SimulatorServer) -> Iterator[ChatClient]:
    with ChatClient(sim.base_url) as chat:
        yield chat


async def _cancel_after_first_token(
    client: ChatClient, **kwargs: Any
) -> tuple[asyncio.CancelledError, threading.Event]:
    """Start a streaming chat under run_sync, cancel its task at the first token; the error."""
    loop = asyncio.get_running_loop()
    first = asyncio.Event()
    returned = threading.Event()

    def work() -> ChatResult:
        try:
            return client.chat(MESSAGES, on_token=lambda _: loop.call_soon_threadsafe(first.set))
        finally:
            returned.set()

    task = asyncio.create_task(run_sync(work, **kwargs))
    async with asyncio.timeout(BOUND):
        await first.wait()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError as exc:
        # The thread returned before the task said it was cancelled.
        assert returned.is_set()
        return exc, returned
    raise AssertionError("run_sync returned instead of raising CancelledError")


# -- the plain path ---------------------------------------------------------------


def test_run_sync_returns_what_fn_returns_in_a_copy_of_the_context_with_the_scope_bound() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var")
    scope = InterruptScope("mine")
    seen: dict[str, Any] = {}

    def work(a: int, b: int) -> int:
        seen["var"] = var.get()
        seen["scope"] = ws.current_scope()
        seen["thread"] = threading.current_thread()
        var.set("changed in the thread")
        return a + b

    async def main() -> int:
        var.set("from the caller")
        result = await run_sync(work, 2, 3, scope=scope)
        assert var.get() == "from the caller"  # A copy: the thread's set stays there.
        return result

    assert asyncio.run(main()) == 5
    assert seen["var"] == "from the caller"
    assert seen["scope"] is scope
    assert seen["thread"] is not threading.main_thread()
    assert scope.wait_quiescent(BOUND)


def test_an_exception_of_fn_passes_through() -> None:
    def work() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        asyncio.run(run_sync(work))


def test_on_a_cancelled_scope_fn_never_runs_and_interrupted_is_raised() -> None:
    scope = InterruptScope()
    scope.cancel("user")
    ran = threading.Event()
    with pytest.raises(Interrupted, match="user"):
        asyncio.run(run_sync(ran.set, scope=scope))
    assert not ran.is_set()


@pytest.mark.parametrize("bad", [float("nan"), -1.0, float("inf"), True, "10"])
def test_a_bad_unwind_timeout_is_a_value_error(bad: Any) -> None:
    with pytest.raises(ValueError, match="unwind_timeout"):
        asyncio.run(run_sync(int, unwind_timeout=bad))


# -- cancel -----------------------------------------------------------------------


def test_cancel_cuts_the_request_and_the_provider_sees_the_close(
    sim: SimulatorServer, client: ChatClient
) -> None:
    exc, _ = asyncio.run(_cancel_after_first_token(client))
    unwind = unwind_of(exc)
    assert isinstance(unwind, Unwind)
    assert unwind.started
    assert unwind.worker_exited
    assert unwind.cancel_to_exit_ms is not None
    assert [event for event, _ in unwind.timeline][:2] == [
        TimelineEvent.CANCEL_REQUESTED,
        TimelineEvent.SOCKETS_SHUT,
    ]
    assert unwind.open == {"threads": 0, "sockets": 0, "processes": 0, "objects": 0}
    assert unwind.scope.reason == CANCEL_REASON
    # The cut request returned its partial answer to the thread.
    result = unwind.future.result()
    assert result.interrupted
    assert result.usage.completion_tokens >= 1
    assert any("thread returned" in note for note in getattr(exc, "__notes__", ()))
    (request,) = sim.requests()
    closed = sim.wait_for_event(EventKind.PEER_CLOSED, request.id, timeout=BOUND)
    assert closed.detail["where"] == "decode"
    sim.wait_for_event(EventKind.SLOT_FREED, request.id, timeout=BOUND)


def test_a_scope_cancelled_first_keeps_its_reason(client: ChatClient) -> None:
    scope = InterruptScope()

    async def main() -> asyncio.CancelledError:
        loop = asyncio.get_running_loop()
        first = asyncio.Event()
        task = asyncio.create_task(
            run_sync(
                lambda: client.chat(
                    MESSAGES, on_token=lambda _: loop.call_soon_threadsafe(first.set)
                ),
                scope=scope,
            )
        )
        await asyncio.wait_for(first.wait(), BOUND)
        scope.cancel("user")
        task.cancel()
        try:
            await task
        except asyncio.CancelledError as exc:
            return exc
        raise AssertionError("not cancelled")

    exc = asyncio.run(main())
    unwind = unwind_of(exc)
    assert unwind is not None
    assert unwind.scope.reason == "user"


def test_the_unwind_is_found_through_a_task_awaiting_the_task(client: ChatClient) -> None:
    async def main() -> asyncio.CancelledError:
        inner: list[asyncio.Task[Any]] = []

        async def outer() -> None:
            exc_holder = asyncio.ensure_future(_cancel_after_first_token(client))
            inner.append(exc_holder)
            exc, _ = await exc_holder
            raise exc

        task = asyncio.create_task(outer())
        try:
            await task
        except asyncio.CancelledError as exc:
            return exc
        raise AssertionError("not cancelled")

    exc = asyncio.run(main())
    unwind = unwind_of(exc)
    assert unwind is not None
    assert unwind.worker_exited


def test_a_thread_that_ignores_the_cut_is_reported_at_the_bound_not_abandoned_silently() -> None:
    release = threading.Event()
    entered = threading.Event()

    def stubborn() -> None:
        entered.set()
        release.wait(BOUND)  # A plain wait: the scope cannot wake it.

    async def main() -> asyncio.CancelledError:
        task = asyncio.create_task(run_sync(stubborn, unwind_timeout=0.2))
        await asyncio.to_thread(entered.wait, BOUND)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError as exc:
            return exc
        raise AssertionError("not cancelled")

    try:
        exc = asyncio.run(main())
    finally:
        release.set()
    unwind = unwind_of(exc)
    assert unwind is not None
    assert unwind.started
    assert not unwind.worker_exited
    assert unwind.cancel_to_exit_ms is None
    assert unwind.open["threads"] == 1
    assert unwind.scope.wait_quiescent(BOUND)  # It returns once released.


def test_work_that_raises_on_the_cut_leaves_no_unretrieved_exception_behind() -> None:
    # A tool that leaves with Interrupted: the loop must not log the thread's
    # exception as "never retrieved" once the wait's future is collected.
    entered = threading.Event()
    reported: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        task = asyncio.create_task(run_sync(lambda: (entered.set(), ws.sleep(BOUND))))
        await asyncio.to_thread(entered.wait, BOUND)
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as caught:
            await task
        unwind = unwind_of(caught.value)
        assert unwind is not None
        assert unwind.worker_exited
        assert isinstance(unwind.future.exception(), Interrupted)

    asyncio.run(main())
    gc.collect()  # The task and the frames of its wait are gone with the loop's run.
    assert [ctx["message"] for ctx in reported] == []


def test_a_second_cancel_does_not_cut_the_wait_for_the_thread_short() -> None:
    release = threading.Event()
    entered = threading.Event()
    exited = threading.Event()

    def slow_to_leave() -> None:
        entered.set()
        try:
            ws.sleep(BOUND)
        finally:
            # The cut woke us; leaving takes until the test lets go.
            release.wait(BOUND)
            exited.set()

    async def main() -> None:
        task = asyncio.create_task(run_sync(slow_to_leave))
        await asyncio.to_thread(entered.wait, BOUND)
        task.cancel()
        for _ in range(3):
            await asyncio.sleep(0)
            task.cancel()
        assert not task.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert exited.is_set()

    asyncio.run(main())


def test_work_queued_in_an_executor_never_runs_after_the_cancel() -> None:
    blocker = threading.Event()
    ran = threading.Event()
    busy = threading.Event()

    async def main() -> asyncio.CancelledError:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(lambda: (busy.set(), blocker.wait(BOUND)))
            await asyncio.to_thread(busy.wait, BOUND)
            task = asyncio.create_task(run_sync(ran.set, executor=pool))
            await asyncio.sleep(0)  # Let it submit.
            task.cancel()
            try:
                await task
            except asyncio.CancelledError as exc:
                return exc
            finally:
                blocker.set()
        raise AssertionError("not cancelled")

    exc = asyncio.run(main())
    unwind = unwind_of(exc)
    assert unwind is not None
    assert not unwind.started
    assert unwind.worker_exited
    assert not ran.is_set()


def test_an_executor_run_cuts_like_a_thread_of_its_own(
    sim: SimulatorServer, client: ChatClient
) -> None:
    async def main() -> asyncio.CancelledError:
        with ThreadPoolExecutor(2) as pool:
            exc, _ = await _cancel_after_first_token(client, executor=pool)
            return exc

    unwind = unwind_of(asyncio.run(main()))
    assert unwind is not None
    assert unwind.worker_exited
    (request,) = sim.requests()
    sim.wait_for_event(EventKind.PEER_CLOSED, request.id, timeout=BOUND)


def test_asyncio_timeout_still_becomes_timeout_error() -> None:
    # A CancelledError subclass would escape asyncio.timeout() in Python 3.11.
    async def main() -> None:
        async with asyncio.timeout(0.05):
            await run_sync(ws.sleep, float("inf"))

    with pytest.raises(TimeoutError):
        asyncio.run(main())


# -- cancel_on_disconnect -----------------------------------------------------------


class _App:
    """A Starlette app served by uvicorn on a thread; its endpoint reports each reply."""

    def __init__(self, client: ChatClient) -> None:
        self.replies: list[ChatResult] = []
        self.done = threading.Event()

        async def chat(request: Request) -> JSONResponse:
            prompt = (await request.json())["prompt"]
            async with cancel_on_disconnect(request) as scope:
                reply = await run_sync(
                    client.chat, [{"role": "user", "content": prompt}], scope=scope
                )
            self.replies.append(reply)
            self.done.set()
            return JSONResponse({"reply": reply.text})

        app = Starlette(routes=[Route("/chat", chat, methods=["POST"])])
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self.server.run, args=([self.sock],), daemon=True)

    def __enter__(self) -> _App:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(BOUND)
        self.sock.close()


def _post(port: int, path: str, payload: dict[str, Any]) -> socket.socket:
    body = json.dumps(payload).encode()
    conn = socket.create_connection(("127.0.0.1", port), timeout=BOUND)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    conn.sendall(head.encode() + body)
    return conn


def test_cancel_on_disconnect_cuts_the_model_when_the_client_leaves(
    sim: SimulatorServer, client: ChatClient
) -> None:
    with _App(client) as app:
        conn = _post(app.port, "/chat", {"prompt": "hi"})
        first = sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)
        conn.close()
        closed = sim.wait_for_event(EventKind.PEER_CLOSED, first.request_id, timeout=BOUND)
        assert closed.detail["where"] == "decode"
        assert app.done.wait(BOUND)
    (reply,) = app.replies
    assert reply.interrupted
    assert reply.reason == "disconnect"


def test_cancel_on_disconnect_leaves_a_finished_request_alone() -> None:
    with SimulatorServer(SimConfig(tokens_per_second=500, prompt_ms=1, reply_tokens=3)) as short:
        with ChatClient(short.base_url) as chat, _App(chat) as app:
            conn = _post(app.port, "/chat", {"prompt": "hi"})
            try:
                assert app.done.wait(BOUND)
                response = conn.recv(65536)
            finally:
                conn.close()
    (reply,) = app.replies
    assert not reply.interrupted
    assert reply.finish_reason == "stop"
    assert b"200 OK" in response


def test_after_the_block_the_scope_says_the_client_left_though_the_work_came_back_whole() -> None:
    # The work ignores the cut (its last token had come): the answer is whole,
    # and still the client is gone, which the scope says after the block.
    scopes: list[InterruptScope] = []
    release = threading.Event()
    answered: list[str] = []

    def whole_answer() -> str:
        release.wait(BOUND)
        return "whole"

    async def endpoint(request: Request) -> Response:
        async with cancel_on_disconnect(request) as scope:
            scopes.append(scope)
            reply = await run_sync(whole_answer, scope=scope)
        answered.append("left" if scope.cancelled else reply)
        return Response(status_code=499 if scope.cancelled else 200)

    app = Starlette(routes=[Route("/x", endpoint, methods=["POST"])])
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    sock = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, args=([sock],), daemon=True)
    thread.start()
    try:
        conn = _post(sock.getsockname()[1], "/x", {})
        until(lambda: bool(scopes))
        conn.close()
        until(lambda: scopes[0].cancelled)  # the watch saw the disconnect
        release.set()
        until(lambda: bool(answered))
    finally:
        release.set()
        server.should_exit = True
        thread.join(BOUND)
        sock.close()
    assert answered == ["left"]


# -- the example of docs/aio.md, as written ------------------------------------------------

EXAMPLE_URL = "http://127.0.0.1:8080"


def _app_blocks(path: Path) -> list[str]:
    text = path.read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    return [block for block in blocks if "cancel_on_disconnect" in block and "app = " in block]


DOC_BLOCKS = _app_blocks(ROOT / "docs" / "aio.md")


def test_docs_aio_has_one_web_app_example() -> None:
    assert len(DOC_BLOCKS) == 1
    assert EXAMPLE_URL in DOC_BLOCKS[0]
    # The README carries the same example, or none.
    readme = _app_blocks(ROOT / "README.md")
    assert readme in ([], DOC_BLOCKS)


class _Uvicorn:
    """``python -m uvicorn app:app`` in its own process, on a free port."""

    def __init__(self, directory: Path) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.sock.close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app:app", "--port", str(self.port)],
            cwd=directory,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 30
        for line in self.proc.stderr:
            if "Uvicorn running" in line:
                break
            if time.monotonic() > deadline:
                break
        else:
            raise RuntimeError(f"uvicorn exited: {self.proc.wait()}")

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM and wait (or SIGKILL: a server whose request never ends never stops)."""
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(BOUND)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            assert self.proc.stderr is not None
            self.proc.stderr.close()


def _serve_example(tmp_path: Path, code: str, sim: SimulatorServer) -> _Uvicorn:
    (tmp_path / "app.py").write_text(code.replace(EXAMPLE_URL, sim.url))
    return _Uvicorn(tmp_path)


def test_docs_example_frees_the_slot_when_the_client_leaves(
    tmp_path: Path, sim: SimulatorServer
) -> None:
    server = _serve_example(tmp_path, DOC_BLOCKS[0], sim)
    try:
        conn = _post(server.port, "/chat", {"prompt": "tell me a long story"})
        first = sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)
        conn.close()
        closed = sim.wait_for_event(EventKind.PEER_CLOSED, first.request_id, timeout=BOUND)
        assert closed.detail["where"] == "decode"
        sim.wait_for_event(EventKind.SLOT_FREED, first.request_id, timeout=BOUND)
    finally:
        server.stop()


def test_the_seeds_version_of_the_example_does_not(tmp_path: Path, sim: SimulatorServer) -> None:
    # The baseline the example fixes: asyncio.to_thread abandons the thread.
    seed = DOC_BLOCKS[0].replace(
        "reply = await run_sync(client.chat, messages, scope=scope)",
        "reply = await asyncio.to_thread(client.chat, messages)",
    )
    assert seed != DOC_BLOCKS[0]
    server = _serve_example(tmp_path, "import asyncio\n" + seed, sim)
    try:
        conn = _post(server.port, "/chat", {"prompt": "tell me a long story"})
        first = sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)
        conn.close()
        # Still decoding 30 tokens later: nobody told the provider.
        sim.wait_for(
            lambda ev: (
                ev.kind == EventKind.TOKEN
                and ev.request_id == first.request_id
                and int(str(ev.detail["n"])) >= 30
            ),
            timeout=BOUND,
        )
        assert not any(
            ev.kind == EventKind.PEER_CLOSED and ev.request_id == first.request_id
            for ev in sim.events()
        )
    finally:
        server.stop(kill=True)
