"""A real console server over the simulator, and a WebSocket client, for tests.

``running_console(...)`` starts a ``SimulatorServer`` and a ``ConsoleServer``
on loopback (real uvicorn, real sockets) in a fresh data directory.
``ConsoleClient`` is the product's protocol client (``wirecut.proof``: a real
WebSocket, frames collected per id by a reader thread, every wait bounded and
woken by the frame it waits for) with the tests' conveniences on top.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from wirecut.client import ConsoleClient as _Client
from wirecut.client import Received
from wirecut.console.commands import Args, Command, CommandContext, CommandSet, command
from wirecut.console.server import ConsoleConfig, ConsoleServer
from wirecut.launch import Provider
from wirecut.record import Frame
from wirecut.simulator import SimConfig, SimulatorServer

__all__ = [
    "Console",
    "ConsoleClient",
    "Serving",
    "close_code",
    "gate_command",
    "running_console",
    "serving",
]


@dataclass
class Console:
    server: ConsoleServer
    sim: SimulatorServer
    data_dir: Path

    def client(self, **kwargs: Any) -> ConsoleClient:
        return ConsoleClient(self.server.ws_url, **kwargs)


@contextlib.contextmanager
def running_console(
    tmp_path: Path,
    *,
    sim: SimConfig | None = None,
    responder: Any = None,
    commands: CommandSet | None = None,
    **config: Any,
) -> Iterator[Console]:
    """A console (port 0, data in ``tmp_path``) over a fresh simulator.

    ``commands``: the console's command set (default: the built-in commands).
    """
    sim_config = sim or SimConfig(slots=4, tokens_per_second=200, prompt_ms=5, endless=True)
    with SimulatorServer(sim_config, responder=responder) as simulator:
        provider = Provider(simulator.base_url, None, "simulator (tests)")
        console_config = ConsoleConfig(port=0, data_dir=tmp_path, **config)
        with ConsoleServer(console_config, provider, commands=commands) as server:
            yield Console(server, simulator, tmp_path)


def gate_command(opened: threading.Event, bound: float = 60.0) -> Command:
    """``test-gate``: runs, silent, until ``opened`` is set (or ``bound`` seconds), then ends ok.

    A command that ends on its own exactly when the test says so; a cancel
    ends it at once, as any command (the scope's wait is a cancellation point).
    """

    @command("test-gate", summary="(tests) runs until the test opens a gate")
    def gate(ctx: CommandContext, args: Args) -> None:
        ctx.scope.wait(opened, bound)

    return gate


class ConsoleClient:
    """The tests' face of the product's protocol client (``wirecut.proof``).

    Frames are returned as dicts stamped with ``"_received"`` (the
    ``time.monotonic()`` at which the reader took them off the socket), and the
    waits have the tests' default bounds. ``connect_kwargs`` go to
    ``websockets.sync.client.connect``.
    """

    def __init__(self, url: str, **connect_kwargs: Any) -> None:
        self._client = _Client(url, **connect_kwargs)
        self.ready: Frame = self._client.ready

    @property
    def ws(self) -> ClientConnection:
        return self._client.ws

    @property
    def frames(self) -> list[Frame]:
        """Every frame so far, in order."""
        return [_stamped(r) for r in self._client.received()]

    def send(self, frame: Frame | str) -> None:
        self._client.send(frame)

    def run(self, line: str, *, id: str | None = None, timeout: float | None = None) -> str:
        return self._client.run(line, id=id, timeout=timeout)

    def cancel(self, id: str | None = None) -> None:
        self._client.cancel(id)

    def wait_for(
        self, match: Callable[[Frame], bool], timeout: float = 10, *, id: str | None = None
    ) -> Frame:
        """The first frame (received so far or later) that ``match``es (of ``id``, if given)."""
        return _stamped(self._client.wait_for(match, timeout, id=id))

    def complete(self, id: str, timeout: float = 20) -> Frame:
        return _stamped(self._client.complete(id, timeout))

    def completes(self, ids: list[str], timeout: float = 20) -> dict[str, Frame]:
        """The ``complete`` of each of ``ids``; TimeoutError if one did not come in time."""
        found = self._client.completes(set(ids), timeout)
        missing = [id for id in ids if id not in found]
        if missing:
            raise TimeoutError(f"no complete for {missing} in {timeout} s")
        return {id: _stamped(found[id]) for id in ids}

    def wait_output(self, id: str, timeout: float = 10) -> Frame:
        return self.wait_for(lambda f: f["type"] == "output", timeout, id=id)

    def output(self, id: str) -> str:
        return "".join(
            r.frame["data"] for r in self._client.received(id) if r.frame["type"] == "output"
        )

    def of(self, id: str) -> list[Frame]:
        return [_stamped(r) for r in self._client.received(id)]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ConsoleClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _stamped(received: Received) -> Frame:
    return {**received.frame, "_received": received.at}


def close_code(url: str, **kwargs: Any) -> int | None:
    """The close code the console sends a connection to ``url`` (None: closed without one)."""
    with connect(url, **kwargs) as ws:
        try:
            ws.recv(timeout=5)
        except ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd else None
    return None


def health(server: ConsoleServer) -> dict[str, Any]:
    """``/api/health`` of ``server``, with its token."""
    response = httpx.get(server.url + "api/health", params={"token": server.token})
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def metrics(console: Console) -> dict[str, float]:
    """``/metrics`` of the console, as ``{"name{labels}": value}``."""
    text = httpx.get(console.server.url + "metrics", params={"token": console.server.token}).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def wait_health(
    server: ConsoleServer, match: Callable[[dict[str, Any]], bool], timeout: float = 15
) -> dict[str, Any]:
    """Poll ``/api/health`` until ``match(health)`` (bounded): the server has no push for it."""
    deadline = time.monotonic() + timeout
    while True:
        current = health(server)
        if match(current) or time.monotonic() > deadline:
            return current
        time.sleep(0.02)


def serve_argv(data_dir: Path, *args: str) -> list[str]:
    """The command line of ``wirecut serve`` on a free port, its files in ``data_dir``."""
    wirecut = [sys.executable, "-m", "wirecut"]
    return [*wirecut, "serve", "--port", "0", "--data-dir", str(data_dir), *args]


def start_serve(data_dir: Path, *args: str, **popen: Any) -> subprocess.Popen[str]:
    """``wirecut serve ARGS`` as a program, its stdout and stderr piped as text."""
    return subprocess.Popen(
        serve_argv(data_dir, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


@dataclass
class Serving:
    """A running ``wirecut serve``: its process, its URL, and its stderr once it stopped."""

    proc: subprocess.Popen[str]
    url: str = ""
    err: str = ""

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://").replace("/?token=", "/api/console?token=")


@contextlib.contextmanager
def serving(data_dir: Path, *args: str, **popen: Any) -> Iterator[Serving]:
    """``wirecut serve ARGS`` once it listens; on a clean exit of the block, SIGTERM and its stderr.

    The banner (``wirecut console: URL``) is checked, and after the block
    the process must exit 0 within 30 s; it is killed if anything failed.
    """
    proc = start_serve(data_dir, *args, **popen)
    running = Serving(proc)
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()  # Blocks until it listens (or exits).
        assert banner.startswith("wirecut console: http://127.0.0.1:"), banner
        running.url = banner.split(": ", 1)[1].strip()
        yield running
        proc.send_signal(signal.SIGTERM)
        _, running.err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, running.err
    assert "Traceback" not in running.err
