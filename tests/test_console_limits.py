"""The console's bounds on connections: slow readers, idle sockets, descriptors.

End to end through real sockets against a real uvicorn server (in this
process, or ``wirecut serve`` as a process where the descriptor limit is the
point). A client that "does not read" is a ``RawClient``: nothing reads its
socket, so the kernel's buffers fill and the server's writes stall for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import resource
import select
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from websockets.sync.client import connect

from _console import Console, ConsoleClient, metrics, running_console, start_serve, wait_health
from _rawws import RawClient
from _support import PROCESS_BOUND, eventually
from wirecut.console.commands import Args, Argument, CommandContext, builtin_commands, command
from wirecut.console.server import ConnectionLimits
from wirecut.serving import ConnectionGuard, Dropped, GuardedConfig
from wirecut.simulator import SimConfig, SimulatorServer

PING = {"type": "ping"}


def dropped(console: Console, why: str) -> float:
    return metrics(console).get(f'wirecut_connections_dropped_total{{why="{why}"}}', 0.0)


def flood_pings(ws: RawClient, until: Callable[[], bool], batch: int = 20_000) -> None:
    """Send protocol pings and read nothing until ``until()`` (or the server cuts us)."""
    data = ws.encode_many(PING, batch)
    for _ in range(60):  # 1.2 M pings: far past the kernel's buffers and any outbox here
        try:
            ws.sock.sendall(data)
        except OSError:
            return
        if until():
            return
    raise AssertionError("the server never stopped the flood")


# -- a client that does not read ---------------------------------------------------------


def test_a_client_that_stops_reading_is_closed_4429_and_its_commands_cancelled(
    tmp_path: Path,
) -> None:
    limits = ConnectionLimits(max_outbox=256 * 1024, close_timeout=60)
    # 10 tokens a second: the chat's 256 take 25 s, past any flood here, so it
    # is still running when the server gives up on the client (it is cut,
    # not finished: the simulator sees its close).
    sim = SimConfig(slots=2, tokens_per_second=10, prompt_ms=5, endless=True)
    with running_console(tmp_path, sim=sim, limits=limits) as console:
        since = console.sim.simulator.event_log.next_seq
        with RawClient(console.server.ws_url) as ws:
            ws.send({"type": "run", "id": "sleeper", "line": "sleep 60"})
            ws.send({"type": "run", "id": "chat", "line": "chat tell me a long story"})
            assert eventually(
                lambda: console.server.state.runner.health()["workers"]["busy"] == 2, PROCESS_BOUND
            )
            flood_pings(ws, until=lambda: dropped(console, "slow_reader") == 1)
            # The server gave up on it: its commands are cancelled as if it had left...
            health = wait_health(console.server, lambda h: h["workers"]["busy"] == 0)
            assert health["workers"]["busy"] == 0
            console.sim.wait_for_event("peer_closed", since=since)
            counts = metrics(console)
            key = 'wirecut_commands_total{reason="disconnect",status="cancelled"}'
            assert counts[key] == 2
            # ...and when it reads at last: what was sent before, then close 4429.
            frames = ws.recv_frames(timeout=30)
            assert ws.close is not None
            assert ws.close.code == 4429
            assert "did not read" in ws.close.reason
        # No complete reached it: they were dropped with the connection.
        assert not [f for f in frames if f["type"] == "complete"]
        assert metrics(console)["wirecut_outbox_bytes"] == 0
        # The server serves on.
        with console.client() as c:
            assert c.complete(c.run("sleep 0"))["status"] == "ok"


def test_the_console_declines_permessage_deflate(tmp_path: Path) -> None:
    # Browsers and the websockets client offer it; each accepted offer held a
    # zlib context per connection and compressed every small frame on the
    # event loop. The connection works the same without it.
    with running_console(tmp_path) as console:
        with connect(console.server.ws_url, compression="deflate") as ws:
            assert ws.response.headers.get("Sec-WebSocket-Extensions") is None
            assert json.loads(ws.recv(timeout=10))["type"] == "ready"
            ws.send(json.dumps(PING))
            assert json.loads(ws.recv(timeout=10)) == {"type": "pong"}


def test_a_client_that_never_reads_is_cut_after_the_close_timeout(tmp_path: Path) -> None:
    limits = ConnectionLimits(max_outbox=256 * 1024, close_timeout=0.5)
    with running_console(tmp_path, limits=limits) as console:
        with RawClient(console.server.ws_url) as ws:
            flood_pings(ws, until=lambda: dropped(console, "slow_reader") == 1)
            assert dropped(console, "slow_reader") == 1
            # Not even the close frame fits: the transport is cut, and the
            # descriptor goes with it.
            assert eventually(
                lambda: metrics(console)["wirecut_connections_open"] <= 1, PROCESS_BOUND
            )
            ws.recv_frames(timeout=30)
            assert ws.closed
        assert console.server.state.connections == set()


def test_a_websocket_ping_flood_that_reads_no_pongs_is_cut(tmp_path: Path) -> None:
    limits = ConnectionLimits(max_outbox=64 * 1024)
    with running_console(tmp_path, limits=limits) as console:
        with RawClient(console.server.ws_url) as ws:
            with contextlib.suppress(OSError):
                for _ in range(400):
                    ws.ping_many(20_000)
                    if dropped(console, "ping_flood"):
                        break
            assert eventually(lambda: dropped(console, "ping_flood") == 1, PROCESS_BOUND)
            ws.recv_frames(timeout=30)
            assert ws.closed


# -- idle and half-open connections -------------------------------------------------------


def _closed_by_server(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True when the server closes ``sock`` within ``timeout`` (whatever it sent first)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


@pytest.mark.parametrize(
    "sent",
    [
        b"",
        b"GET /api/health HTTP/1.1\r\nHost: 127",
        b"GET /api/console HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n",
    ],
    ids=["nothing", "half-a-head", "half-an-upgrade"],
)
def test_an_incomplete_request_head_is_timed_out(tmp_path: Path, sent: bytes) -> None:
    limits = ConnectionLimits(head_timeout=0.5)
    with running_console(tmp_path, limits=limits) as console:
        with socket.create_connection(("127.0.0.1", console.server.port)) as sock:
            sock.sendall(sent)
            assert _closed_by_server(sock)
        assert dropped(console, "head_timeout") == 1


def test_a_refused_websocket_that_never_answers_the_close_is_cut(tmp_path: Path) -> None:
    limits = ConnectionLimits(close_timeout=0.5)
    with running_console(tmp_path, limits=limits) as console:
        base = console.server.ws_url.split("?")[0]
        ws = RawClient(base)  # no token: the server accepts, then closes 4401
        # It never answers the close: the server ends the connection itself
        # (uvicorn alone waits 10 s; the bound here is 0.5 s).
        assert _closed_by_server(ws.sock, timeout=5)
        ws.abort()


@contextlib.contextmanager
def guarded_uvicorn(app: Any, limits: ConnectionLimits) -> Iterator[tuple[int, ConnectionGuard]]:
    """uvicorn with the console's guarded protocols around ``app``, on a thread."""
    guard = ConnectionGuard(limits, limits.max_connections)
    config = GuardedConfig(
        app,
        guard=guard,
        host="127.0.0.1",
        port=0,
        lifespan="off",
        log_level="warning",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert eventually(lambda: server.started, 10)
        yield server.servers[0].sockets[0].getsockname()[1], guard
    finally:
        server.should_exit = True
        thread.join(10)
        assert not thread.is_alive()


def test_a_websocket_the_app_does_not_accept_is_cut_after_the_handshake_timeout() -> None:
    never = asyncio.Event()

    async def stuck(scope: Any, receive: Any, send: Any) -> None:
        await never.wait()  # an app that never accepts: no 101, no refusal

    with guarded_uvicorn(stuck, ConnectionLimits(handshake_timeout=0.5)) as (port, guard):
        with pytest.raises((TimeoutError, OSError)):
            RawClient(f"ws://127.0.0.1:{port}/", timeout=10)
        assert guard.dropped[Dropped.HANDSHAKE_TIMEOUT] == 1
        assert eventually(lambda: guard.open == 0, PROCESS_BOUND)


def _idle(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]


def _open(sock: socket.socket) -> bool:
    """True while the server has not closed ``sock`` (nothing to read, no EOF)."""
    # poll, not select: with a thousand sockets open the descriptor can pass
    # select's FD_SETSIZE (1,024), as it did on two test workers in CI.
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return not poller.poll(0)


def test_at_the_cap_a_new_connection_closes_the_oldest_idle_one(tmp_path: Path) -> None:
    limits = ConnectionLimits(max_connections=8)
    with running_console(tmp_path, limits=limits) as console:
        idle = _idle(console.server.port, 8)
        try:
            guard = console.server.state.guard
            assert guard is not None
            assert eventually(lambda: guard.open == 8, PROCESS_BOUND)
            # The token holder's request gets through: the oldest idle socket goes.
            health = httpx.get(
                console.server.url + "api/health", params={"token": console.server.token}
            )
            assert health.status_code == 200
            assert _closed_by_server(idle[0], timeout=10)
            assert all(_open(sock) for sock in idle[1:])
            assert dropped(console, "evicted") >= 1
        finally:
            for sock in idle:
                sock.close()


def test_at_the_cap_with_every_connection_busy_a_new_one_is_refused(tmp_path: Path) -> None:
    limits = ConnectionLimits(max_connections=3)
    with running_console(tmp_path, limits=limits) as console, contextlib.ExitStack() as stack:
        clients = [stack.enter_context(console.client()) for _ in range(3)]
        with pytest.raises(httpx.TransportError):
            httpx.get(console.server.url + "api/health", params={"token": console.server.token})
        # Nothing of theirs was touched.
        for c in clients:
            assert c.complete(c.run("sleep 0"))["status"] == "ok"
        assert console.server.state.guard is not None
        assert console.server.state.guard.dropped


# -- descriptors: wirecut serve as a process ----------------------------------------------


def _serve(tmp_path: Path, nofile: tuple[int, int], *args: str) -> subprocess.Popen[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

    return start_serve(tmp_path, *args, preexec_fn=limit)


@contextlib.contextmanager
def serving(tmp_path: Path, nofile: tuple[int, int], *args: str) -> Iterator[dict[str, Any]]:
    with SimulatorServer(SimConfig()) as sim:
        proc = _serve(tmp_path, nofile, "--provider-url", sim.base_url, *args)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("wirecut console: ")
            info = json.loads((tmp_path / "serve.json").read_text())
            yield {**info, "proc": proc}
        finally:
            proc.terminate()
            proc.communicate(timeout=30)


def _soft_nofile(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no Max open files line")


def test_serve_raises_its_soft_descriptor_limit_to_the_hard_one(tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 512:
        pytest.skip(f"needs a finite hard descriptor limit of at least 512, not {hard}")
    with serving(tmp_path, (256, hard)) as info:
        assert _soft_nofile(info["proc"].pid) == hard


@pytest.mark.timeout(120)
def test_health_answers_the_token_holder_with_1000_idle_connections_open(
    tmp_path: Path,
) -> None:
    # The finding: at a 1,024-descriptor limit, 1,030 idle connections made
    # /api/health time out. Here the hard limit is 1,024 too (nothing to raise
    # it to), and 1,000 idle connections are open when the token holder asks.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this test opens 1,000 sockets: needs a hard limit >= 1200, not {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    idle: list[socket.socket] = []
    try:
        with serving(tmp_path, (1024, 1024), "--head-timeout", "120") as info:
            url, token = info["url"], info["token"]
            port = int(url.rsplit(":", 1)[1].rstrip("/"))
            idle = _idle(port, 1000)
            health = httpx.get(url + "api/health", params={"token": token}, timeout=30)
            assert health.status_code == 200
            assert health.json()["status"] == "ok"
            text = httpx.get(url + "metrics", params={"token": token}, timeout=30).text
            assert 'wirecut_connections_dropped_total{why="evicted"}' in text
            # Idle sockets that were not evicted are still open: the server
            # took the newest ones and kept serving.
            assert any(_open(sock) for sock in idle[-10:])
    finally:
        for sock in idle:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.timeout(120)
def test_the_descriptor_reserve_keeps_health_answering_the_token_holder_at_a_low_limit(
    tmp_path: Path,
) -> None:
    # 256 descriptors (soft and hard: serve cannot raise it) and more idle
    # connections than that: without the reserve the cap would be 256, accept
    # would fail for want of descriptors, and the token holder would wait.
    idle: list[socket.socket] = []
    try:
        with serving(tmp_path, (256, 256), "--head-timeout", "120") as info:
            url, token = info["url"], info["token"]
            port = int(url.rsplit(":", 1)[1].rstrip("/"))
            idle = _idle(port, 300)
            health = httpx.get(url + "api/health", params={"token": token}, timeout=30)
            assert health.status_code == 200
            assert health.json()["status"] == "ok"
            text = httpx.get(url + "metrics", params={"token": token}, timeout=30).text
            open_now = re.search(r"^wirecut_connections_open (\S+)$", text, re.MULTILINE)
            assert open_now is not None
            assert float(open_now.group(1)) <= 256 - ConnectionLimits().fd_reserve
    finally:
        for sock in idle:
            sock.close()


def test_a_console_client_survives_idle_connections_being_evicted(tmp_path: Path) -> None:
    limits = ConnectionLimits(max_connections=4)
    with running_console(tmp_path, limits=limits) as console:
        with ConsoleClient(console.server.ws_url) as c:
            sleeper = c.run("sleep 30")
            c.wait_for(lambda f: f["type"] == "started" and f["id"] == sleeper)
            idle = _idle(console.server.port, 10)
            try:
                # The WebSocket is never the one evicted: its command runs on.
                c.send(PING)
                c.wait_for(lambda f: f["type"] == "pong")
                c.cancel(sleeper)
                assert c.complete(sleeper)["reason"] == "user"
            finally:
                for sock in idle:
                    sock.close()


# -- limits leave normal clients alone ---------------------------------------------------


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_a_console_started_as_localhost_is_reached_by_127_0_0_1_and_by_ipv6_loopback(
    tmp_path: Path,
) -> None:
    if not _has_ipv6_loopback():
        pytest.skip("this machine has no IPv6 loopback")
    with running_console(tmp_path, host="localhost") as console:
        port, token = console.server.port, console.server.token
        for host in ("127.0.0.1", "[::1]", "localhost"):
            health = httpx.get(f"http://{host}:{port}/api/health", params={"token": token})
            assert health.status_code == 200, host
            url = f"ws://{host}:{port}/api/console?token={token}"
            with ConsoleClient(url) as c:
                assert c.complete(c.run("sleep 0"))["status"] == "ok"


def test_a_console_connection_stays_open_past_the_head_and_handshake_timeouts(
    tmp_path: Path,
) -> None:
    # The bounds are on reaching the app, not on a connection's life: a
    # command that takes longer than both runs on one connection, and so
    # does the next.
    limits = ConnectionLimits(head_timeout=0.2, handshake_timeout=0.2)
    with running_console(tmp_path, limits=limits) as console, console.client() as c:
        assert c.complete(c.run("sleep 0.6"))["status"] == "ok"
        assert c.complete(c.run("sleep 0"))["status"] == "ok"
        guard = console.server.state.guard
        assert guard is not None
        assert not any(guard.dropped.values())


_BURST = "x" * 1023 + "\n"


@command("test-burst", Argument("KIB", convert=int), summary="(tests) writes KIB KiB at once")
def _burst(ctx: CommandContext, args: Args) -> None:
    for _ in range(args["kib"]):
        ctx.write(_BURST)


def test_a_client_that_reads_gets_more_than_the_outbox_bound_and_stays(tmp_path: Path) -> None:
    # A reader that keeps up is never a slow reader, however much it gets:
    # here 16 times the outbox bound, in one command and then in another.
    limits = ConnectionLimits(max_outbox=64 * 1024)
    commands = builtin_commands().plus(_burst)
    with running_console(tmp_path, limits=limits, commands=commands) as console:
        with console.client() as c:
            for _ in range(2):
                id = c.run("test-burst 1024")
                assert c.complete(id, timeout=60)["status"] == "ok"
                assert c.output(id) == _BURST * 1024
        assert dropped(console, "slow_reader") == 0


def test_two_requests_on_one_keep_alive_connection_are_both_answered(tmp_path: Path) -> None:
    with running_console(tmp_path) as console:
        port, token = console.server.port, console.server.token
        request = (
            f"GET /api/health?token={token} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            answers = []
            for _ in range(2):
                sock.sendall(request)
                answers.append(_read_response(sock))
        assert [status for status, _ in answers] == [200, 200]
        assert all(json.loads(body)["status"] == "ok" for _, body in answers)


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length, read off ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        body += chunk
    assert len(body) == length  # nothing more: the next response starts clean
    return int(lines[0].split()[1]), body
