"""What the MCP tests share: the example server, over stdio or in-process HTTP, and its facts.

``EXAMPLE`` is examples/mcp_server.py, loaded as a module (``example``) for
the in-process servers and run as a program for the stdio ones, with this
tree's ``src`` on its path. ``serve_http`` runs a server's Streamable HTTP
app under uvicorn on a thread of this process, on a socket it bound itself
(port 0: no race for a port). ``Facts`` collects the ``wirecut`` log
notifications a client receives, and waits for them with a bound.
``threads_in`` finds the threads whose stack is inside a function: how a
test sees a tool's thread directly.
"""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import uvicorn
from mcp.client.stdio import StdioServerParameters
from mcp_types import LoggingMessageNotificationParams

from _support import BOUND, until
from wirecut.mcp import LOGGER, StopFacts

__all__ = [
    "BOUND",
    "EXAMPLE",
    "SRC",
    "Facts",
    "HttpServer",
    "example",
    "example_params",
    "serve_http",
    "threads_in",
]

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
EXAMPLE = ROOT / "examples" / "mcp_server.py"


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mcp_server_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = _load_example()


def example_params(*args: str, cwd: Path | None = None) -> StdioServerParameters:
    """The example as a stdio server (``args`` are its flags), with this tree on its path."""
    return StdioServerParameters(
        command=sys.executable,
        args=[str(EXAMPLE), *args],
        env={"PYTHONPATH": str(SRC)},
        cwd=cwd,
    )


class HttpServer(str):
    """The URL of a server ``serve_http`` runs, and ``stop()`` to end it (from any thread)."""

    runner: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.runner.should_exit = True
        self.thread.join(BOUND)
        assert not self.thread.is_alive(), "uvicorn did not stop"


@contextlib.contextmanager
def serve_http(server: Any) -> Iterator[HttpServer]:
    """Serve ``server`` (an SDK ``MCPServer``) over Streamable HTTP; yields its URL.

    Leaving (or ``stop()``) asks uvicorn to exit, so the app's lifespan ends,
    and joins its thread.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = uvicorn.Config(
        server.streamable_http_app(),
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    runner = uvicorn.Server(config)
    thread = threading.Thread(
        target=runner.run, kwargs={"sockets": [listener]}, name="mcp-http", daemon=True
    )
    thread.start()
    url = HttpServer(f"http://127.0.0.1:{port}/mcp")
    url.runner, url.thread = runner, thread
    try:
        until(lambda: runner.started or not thread.is_alive())
        assert runner.started, "uvicorn did not start"
        yield url
    finally:
        url.stop()
        listener.close()


class Facts:
    """The ``wirecut`` log notifications one client received; a ``logging_callback``."""

    def __init__(self) -> None:
        self.received: list[StopFacts] = []
        self.other: list[LoggingMessageNotificationParams] = []
        self._arrived = anyio.Event()

    async def __call__(self, params: LoggingMessageNotificationParams) -> None:
        facts = StopFacts.from_json(params.data) if params.logger == LOGGER else None
        if facts is None:
            self.other.append(params)
            return
        self.received.append(facts)
        self._arrived.set()

    async def first(self) -> StopFacts:
        """The first facts to arrive; fails after ``BOUND`` seconds."""
        with anyio.fail_after(BOUND):
            await self._arrived.wait()
        return self.received[0]


def threads_in(fn: Callable[..., Any]) -> list[int]:
    """The ids of the threads whose stack is inside ``fn`` right now."""
    code = fn.__code__
    found = []
    for ident, frame in sys._current_frames().items():
        current: Any = frame
        while current is not None:
            if current.f_code is code:
                found.append(ident)
                break
            current = current.f_back
    return found
