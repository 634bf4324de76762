"""Running the proxy under uvicorn: on a background thread, or in the foreground.

``ProxyServer`` is for tests and benchmarks (its own thread and event loop;
its methods are safe from any other thread); ``serve_forever`` is
``wirecut proxy``: the main thread, until SIGINT or SIGTERM, rereading its
config and keys files on SIGHUP when it has them (the handler is installed
for the run only and the previous one restored).

The stop: uvicorn waits for the responses in flight before it runs the
app's shutdown, and a stream may never end by itself; so the server first
cuts every live request (reason ``shutdown``, each gets its record), then
hands over to uvicorn.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from types import FrameType
from typing import Self

import uvicorn

from wirecut.proxy._app import create_app
from wirecut.proxy._config import ProxyConfig
from wirecut.proxy._proxy import Proxy
from wirecut.serving import (
    BackgroundServer,
    ConnectionGuard,
    GuardedConfig,
    GuardedHttpToolsProtocol,
    Server,
    ServerThread,
    descriptor_limit,
    http_base,
)

__all__ = ["ProxyServer", "serve_forever"]


#: Descriptors one stream may hold: the client's connection, the upstream's,
#: and the upstream socket's registered dup (``wirecut.http.AsyncH1Client``).
DESCRIPTORS_PER_STREAM = 3


def _uvicorn_config(proxy: Proxy) -> uvicorn.Config:
    limits = proxy.config.connection_limits
    fit = max(1, (descriptor_limit() - limits.fd_reserve) // DESCRIPTORS_PER_STREAM)
    proxy.guard = ConnectionGuard(limits, min(limits.max_connections, fit))
    return GuardedConfig(
        create_app(proxy),
        guard=proxy.guard,
        # httptools (C) parses a request in a fraction of h11's time, and
        # writes a streamed piece without h11's state machine: both are on
        # every token's way.
        http=GuardedHttpToolsProtocol,
        host=proxy.config.host,
        port=proxy.config.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )


class ProxyServer(BackgroundServer):
    """A proxy served by uvicorn on a background thread, for tests and benchmarks.

    ::

        with ProxyServer(ProxyConfig(upstream=sim.base_url, port=0)) as proxy:
            client = OpenAI(base_url=proxy.base_url, api_key="none")

    ``start()`` asks the upstream what it is (``upstream_slots="auto"``;
    bounded, see ``Proxy.start``), then listens. ``stop()`` cuts every live
    request (reason ``shutdown``), stops uvicorn and joins its thread; a
    thread still alive after a forced exit is a ``RuntimeError``. Not
    restartable.
    """

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.proxy = Proxy(config)
        self._thread = ServerThread(
            _uvicorn_config(self.proxy), what="proxy", before_shutdown=self.proxy.shutdown
        )

    def start(self, timeout: float = 10.0) -> Self:
        """Ask the upstream what it is, then listen (see ``ServerThread.start``)."""
        self._thread.start(timeout)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        try:
            self._thread.stop(timeout)
        finally:
            self.proxy.close()

    @property
    def address(self) -> tuple[str, int]:
        return self._thread.address

    def reload(self, timeout: float = 10.0) -> bool:
        """``Proxy.reload`` on the proxy's loop (what SIGHUP does to ``wirecut proxy``)."""
        return asyncio.run_coroutine_threadsafe(self.proxy.reload(), self.loop).result(timeout)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the proxy runs on (for ``asyncio.run_coroutine_threadsafe``)."""
        if self.proxy.loop is None:
            raise RuntimeError("the proxy is not running")
        return self.proxy.loop


def serve_forever(
    proxy: Proxy, *, on_listening: Callable[[str], None], reload_on_sighup: bool = False
) -> int:
    """``wirecut proxy``: serve in the main thread until SIGTERM or Ctrl+C; the exit code.

    ``on_listening`` gets the API base URL once connections are accepted.
    With ``reload_on_sighup``, SIGHUP rereads the config and keys files
    (``Proxy.reload``); main thread only.
    """

    def listening(host: str, port: int) -> None:
        on_listening(http_base(host, port) + "/v1")

    def hangup(signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread, between two steps of the loop's own code:
        # hand the reload to the loop rather than run it here.
        if proxy.loop is not None:
            proxy.loop.call_soon_threadsafe(proxy.request_reload)

    server = Server(_uvicorn_config(proxy), on_listening=listening, before_shutdown=proxy.shutdown)
    previous = signal.signal(signal.SIGHUP, hangup) if reload_on_sighup else None
    try:
        server.run()
    finally:
        if reload_on_sighup:
            signal.signal(signal.SIGHUP, previous)
        proxy.close()
    return 0 if server.started else 1
