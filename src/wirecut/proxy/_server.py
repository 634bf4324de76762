"""Running the proxy under uvicorn: on a background thread, or in the foreground.

``ProxyServer`` is for tests and benchmarks (its own thread and event loop;
its methods are safe from any other thread); ``serve_forever`` is
``wirecut proxy``: the main thread, until SIGINT or SIGTERM.

The stop: uvicorn waits for the responses in flight before it runs the
app's shutdown, and a stream may never end by itself; so the server first
cuts every live request (reason ``shutdown``, each gets its record), then
hands over to uvicorn.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from types import TracebackType

import uvicorn

from wirecut.proxy._app import create_app
from wirecut.proxy._config import ProxyConfig
from wirecut.proxy._proxy import Proxy

__all__ = ["ProxyServer", "serve_forever"]


class _ProxyUvicorn(uvicorn.Server):
    """uvicorn that cuts the proxy's requests before it waits for them."""

    def __init__(
        self, config: uvicorn.Config, proxy: Proxy, on_listening: Callable[[str, int], None]
    ) -> None:
        super().__init__(config)
        self._proxy = proxy
        self._on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.should_exit:  # The bind failed: uvicorn said so and is leaving.
            return
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        self._on_listening(str(host), int(port))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._proxy.shutdown()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if not hasattr(self, "_captured_signals"):
            raise RuntimeError(
                "uvicorn.Server has no _captured_signals: this uvicorn is not one "
                "wirecut was checked against (see pyproject.toml's cap)"
            )
        with super().capture_signals():
            yield
            # A signal is the normal way to stop `wirecut proxy`: exit 0
            # rather than die of the signal uvicorn would raise again.
            self._captured_signals.clear()


def _uvicorn_config(proxy: Proxy) -> uvicorn.Config:
    return uvicorn.Config(
        create_app(proxy),
        host=proxy.config.host,
        port=proxy.config.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        # Thousands of streams may be open at once.
        backlog=2048,
        timeout_graceful_shutdown=5,
    )


def http_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ProxyServer:
    """A proxy served by uvicorn on a background thread, for tests and benchmarks.

    ::

        with ProxyServer(ProxyConfig(upstream=sim.base_url, port=0)) as proxy:
            client = OpenAI(base_url=proxy.base_url, api_key="none")

    ``start()`` asks the upstream what it is (``upstream_slots="auto"``),
    then listens. ``stop()`` cuts every live request (reason ``shutdown``),
    stops uvicorn and joins its thread; a thread still alive after a forced
    exit is a ``RuntimeError``. Not restartable.
    """

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.proxy = Proxy(config)
        self._address: tuple[str, int] | None = None
        self._listening = threading.Event()
        self._server = _ProxyUvicorn(_uvicorn_config(self.proxy), self.proxy, self._on_listening)
        self._thread = threading.Thread(target=self._server.run, name="wirecut-proxy", daemon=True)

    def _on_listening(self, host: str, port: int) -> None:
        self._address = (host, port)
        self._listening.set()

    def start(self, timeout: float = 10.0) -> ProxyServer:
        self.proxy.probe()
        self._thread.start()
        if not self._listening.wait(timeout) or self._address is None:
            self.stop()
            raise RuntimeError(f"the proxy did not listen on {self.config.host}:{self.config.port}")
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread.is_alive():
            self._server.should_exit = True
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(5)
                raise RuntimeError(f"the proxy thread was still running {timeout} s after stop")
        self.proxy.close()

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._address is None:
            raise RuntimeError("the proxy is not listening")
        return self._address[1]

    @property
    def url(self) -> str:
        """``http://HOST:PORT``: the proxy's root (``/health``, ``/metrics``)."""
        if self._address is None:
            raise RuntimeError("the proxy is not listening")
        return http_url(*self._address)

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``: what an OpenAI client takes as its base URL."""
        return self.url + "/v1"


def serve_forever(proxy: Proxy, *, on_listening: Callable[[str], None]) -> int:
    """``wirecut proxy``: serve in the main thread until SIGTERM or Ctrl+C; the exit code.

    ``on_listening`` gets the API base URL once connections are accepted.
    """

    def listening(host: str, port: int) -> None:
        on_listening(http_url(host, port) + "/v1")

    server = _ProxyUvicorn(_uvicorn_config(proxy), proxy, listening)
    try:
        server.run()
    finally:
        proxy.close()
    return 0 if server.started else 1
