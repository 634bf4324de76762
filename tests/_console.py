"""A real console server over the simulator, and a WebSocket client, for tests.

``running_console(...)`` starts a ``SimulatorServer`` and a ``ConsoleServer``
on loopback (real uvicorn, real sockets) in a fresh data directory.
``ConsoleClient`` speaks the protocol over a real WebSocket (the
``websockets`` sync client) and collects frames per id; every wait is
bounded and wakes on the frame it waits for, never on a sleep.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

from wirecut.console.commands import CommandSet
from wirecut.console.server import ConsoleConfig, ConsoleServer, Provider
from wirecut.simulator import SimConfig, SimulatorServer

__all__ = ["Console", "ConsoleClient", "running_console"]

Frame = dict[str, Any]


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


class ConsoleClient:
    """A protocol client on one WebSocket; frames are read by a background thread."""

    def __init__(self, url: str, **connect_kwargs: Any) -> None:
        self._stack = contextlib.ExitStack()
        self.ws: ClientConnection = self._stack.enter_context(connect(url, **connect_kwargs))
        self.frames: list[Frame] = []
        self.by_id: dict[str | None, list[Frame]] = defaultdict(list)
        self.closed: BaseException | None = None
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._reader = threading.Thread(target=self._read, name="console-client", daemon=True)
        self._reader.start()
        self.ready = self.wait_for(lambda f: f["type"] == "ready")

    def _read(self) -> None:
        try:
            for message in self.ws:
                frame = json.loads(message)
                frame["_received"] = time.monotonic()  # for ordering checks in tests
                with self._cond:
                    self.frames.append(frame)
                    self.by_id[frame.get("id")].append(frame)
                    self._cond.notify_all()
        except Exception as exc:
            with self._cond:
                self.closed = exc
                self._cond.notify_all()
            return
        with self._cond:
            self.closed = ConnectionError("closed")
            self._cond.notify_all()

    def send(self, frame: Frame | str) -> None:
        self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))

    def run(self, line: str, *, id: str | None = None, timeout: float | None = None) -> str:
        id = id or f"t{next(self._ids)}"
        frame: Frame = {"type": "run", "id": id, "line": line}
        if timeout is not None:
            frame["timeout"] = timeout
        self.send(frame)
        return id

    def cancel(self, id: str | None = None) -> None:
        self.send({"type": "cancel"} if id is None else {"type": "cancel", "id": id})

    def wait_for(self, match: Callable[[Frame], bool], timeout: float = 10) -> Frame:
        """The first frame (received so far or later) that ``match``es."""
        deadline = time.monotonic() + timeout
        with self._cond:
            seen = 0
            while True:
                for frame in self.frames[seen:]:
                    if match(frame):
                        return frame
                seen = len(self.frames)
                remaining = deadline - time.monotonic()
                if self.closed is not None or remaining <= 0:
                    raise TimeoutError(
                        f"no matching frame ({self.closed!r}); last frames: {self.frames[-5:]}"
                    )
                self._cond.wait(remaining)

    def complete(self, id: str, timeout: float = 20) -> Frame:
        return self.wait_for(lambda f: f["type"] == "complete" and f.get("id") == id, timeout)

    def wait_output(self, id: str, timeout: float = 10) -> Frame:
        return self.wait_for(lambda f: f["type"] == "output" and f.get("id") == id, timeout)

    def output(self, id: str) -> str:
        with self._cond:
            return "".join(f["data"] for f in self.by_id[id] if f["type"] == "output")

    def of(self, id: str) -> list[Frame]:
        with self._cond:
            return list(self.by_id[id])

    def close(self) -> None:
        self._stack.close()
        self._reader.join(5)
        assert not self._reader.is_alive(), "the client's reader did not end"

    def __enter__(self) -> ConsoleClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def health(server: ConsoleServer) -> dict[str, Any]:
    """``/api/health`` of ``server``, with its token."""
    response = httpx.get(server.url + "api/health", params={"token": server.token})
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


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
