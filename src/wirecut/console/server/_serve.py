"""Running the console: its configuration, its provider, and uvicorn.

``ConsoleServer`` serves on a background thread (tests, ``repro``, ``bench``);
``serve_forever`` is ``wirecut serve``: the main thread, the banner,
``serve.json``, and a clean stop on SIGTERM or Ctrl+C.

The stop. uvicorn's own shutdown closes every WebSocket at once (code 1012),
which would end the commands as "disconnect" with no ``complete`` sent. So
``_ConsoleUvicorn.shutdown`` first cancels every command with reason
"shutdown", waits (within the unwind bound) until each has its ``complete``,
lets the frames go out, and only then hands over to uvicorn. The signal
handler itself only sets a flag (uvicorn's): ``scope.cancel()`` takes a lock
and is never called from a signal handler.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn

from wirecut.console.commands import Services
from wirecut.console.runner import CommandRunner, Runner
from wirecut.console.server._app import ConsoleState, create_app
from wirecut.console.server._metrics import ConsoleMetrics

__all__ = [
    "ConsoleConfig",
    "ConsoleServer",
    "Provider",
    "ProviderUnavailable",
    "RunnerFactory",
    "resolve_provider",
    "serve_forever",
]

#: Makes the runner of a console from its services and metrics (default: a
#: ``CommandRunner``; ``wirecut serve --ray`` passes a ``ClusterRunner``'s).
RunnerFactory = Callable[[Services, ConsoleMetrics], Runner]

#: A WebSocket message larger than this closes the connection (1009); the
#: protocol's own frame limit (an error frame, the connection kept) is lower.
WS_MAX_BYTES = 1 << 20
SERVE_JSON = "serve.json"


@dataclass
class ConsoleConfig:
    """``wirecut serve``'s options (docs/protocol.md, "Command line")."""

    host: str = "127.0.0.1"
    port: int = 8765
    #: None: no token is required (only allowed on a loopback host).
    token: str | None = field(default_factory=lambda: secrets.token_urlsafe(24))
    workers: int = 4
    command_timeout: float = 60.0
    unwind_timeout: float = 10.0
    escalate_after: float | None = None
    data_dir: Path = field(default_factory=lambda: Path("."))
    provider_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    #: max_tokens of one chat reply.
    max_tokens: int = 256


class ProviderUnavailable(Exception):
    """No provider could be started; the message says why, in one line."""


@dataclass
class Provider:
    """The provider the console's commands talk to, and how to stop it if we started it."""

    base_url: str
    model: str | None
    label: str
    note: str | None = None
    stop: Callable[[], None] = lambda: None


def resolve_provider(
    url: str | None,
    model: str | None,
    data_dir: Path,
    *,
    embedded: str = "auto",
    local_model: str = "smollm2",
    echo: Callable[[str], None] | None = None,
) -> Provider:
    """The provider at ``url``; with none, the embedded llama.cpp if installed, else the simulator.

    ``embedded`` is "auto", "local" or "simulator" (which one to start with no URL).
    ``local_model`` is the embedded llama.cpp's model ("smollm2", "gemma" or a
    ``.gguf`` path; docs/local-model.md); ``echo`` gets its fetch's progress
    line and the line saying it fell back to Gemma.
    """
    if url:
        return Provider(url.rstrip("/"), model, f"{url.rstrip('/')} (given)")
    from wirecut.local import LocalError, LocalServer, is_available

    if embedded == "local" or (embedded == "auto" and is_available()):
        server = LocalServer(local_model, echo=echo)
        try:
            server.start()
        except LocalError as exc:
            raise ProviderUnavailable(f"the embedded llama.cpp did not start: {exc}") from None
        chosen = server.local_model
        assert chosen is not None  # resolved by start()
        return Provider(
            server.base_url,
            model or chosen.name,
            f"embedded llama.cpp at {server.base_url} ({chosen.name}, {chosen.path})",
            note=chosen.note,
            stop=server.stop,
        )
    from wirecut.simulator import SimConfig, SimulatorServer

    sim = SimulatorServer(SimConfig(slots=2, tokens_per_second=30, prompt_ms=200))
    sim.start()
    return Provider(
        sim.base_url,
        model,
        f"built-in simulator at {sim.base_url} (install the extra `local` for a real model)",
        stop=sim.stop,
    )


def build_state(
    config: ConsoleConfig, provider: Provider, *, runner: RunnerFactory | None = None
) -> ConsoleState:
    """The runner, services and metrics of one console over ``provider``.

    ``runner`` makes the runner (default: a ``CommandRunner`` per ``config``).
    """
    from wirecut.memory import NoteStore
    from wirecut.provider import ChatClient

    client = ChatClient(provider.base_url, api_key=config.api_key, model=provider.model)
    services = Services(
        store=NoteStore.in_data_dir(config.data_dir),
        chat_client=lambda: client,
        model=provider.model,
        provider_label=provider.label,
        max_tokens=config.max_tokens,
    )
    metrics = ConsoleMetrics()
    made: Runner
    if runner is None:
        made = CommandRunner(
            services,
            workers=config.workers,
            command_timeout=config.command_timeout,
            unwind_timeout=config.unwind_timeout,
            escalate_after=config.escalate_after,
            observer=metrics,
        )
    else:
        made = runner(services, metrics)
    metrics.attach(made)
    return ConsoleState(runner=made, metrics=metrics, token=config.token)


class _ConsoleUvicorn(uvicorn.Server):
    """uvicorn that ends the console's commands before it closes their connections."""

    def __init__(
        self,
        config: uvicorn.Config,
        state: ConsoleState,
        on_listening: Callable[[str, int], None],
    ) -> None:
        super().__init__(config)
        self._console = state
        self._on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.should_exit:  # The bind failed: uvicorn said so and is leaving.
            return
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        self._on_listening(str(host), int(port))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._console.shutdown()
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
            # uvicorn re-raises the SIGINT/SIGTERM it caught once it has shut
            # down; for `wirecut serve` a signal is the normal way to stop,
            # so the process exits 0 instead of dying of the signal again.
            self._captured_signals.clear()


def _uvicorn_config(state: ConsoleState, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        create_app(state),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        ws="websockets-sansio",
        ws_max_size=WS_MAX_BYTES,
        timeout_graceful_shutdown=5,
    )


def _http_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


class ConsoleServer:
    """A console served by uvicorn on a background thread, for tests, ``repro`` and ``bench``.

    ::

        with ConsoleServer(ConsoleConfig(port=0, data_dir=tmp), provider) as console:
            websockets.sync.client.connect(console.ws_url)

    ``stop()`` ends every command with reason "shutdown" (each gets its
    ``complete``), then stops uvicorn and joins its thread; it does not stop
    the provider, which the caller passed in and owns.
    """

    def __init__(
        self, config: ConsoleConfig, provider: Provider, *, runner: RunnerFactory | None = None
    ) -> None:
        self.config = config
        self.provider = provider
        self.state = build_state(config, provider, runner=runner)
        self._address: tuple[str, int] | None = None
        self._listening = threading.Event()
        self._server = _ConsoleUvicorn(
            _uvicorn_config(self.state, config.host, config.port), self.state, self._on_listening
        )
        self._thread = threading.Thread(
            target=self._server.run, name="wirecut-console", daemon=True
        )

    def _on_listening(self, host: str, port: int) -> None:
        self._address = (host, port)
        self._listening.set()

    def start(self, timeout: float = 10.0) -> ConsoleServer:
        self._thread.start()
        if not self._listening.wait(timeout) or self._address is None:
            self.stop()
            raise RuntimeError(
                f"the console did not listen on {self.config.host}:{self.config.port}"
            )
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop and join; a thread still alive after a forced exit is a RuntimeError."""
        if not self._thread.is_alive():
            return
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(5)
            raise RuntimeError(f"the console thread was still running {timeout} s after stop")

    def __enter__(self) -> ConsoleServer:
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
        assert self._address is not None, "not listening"
        return self._address[1]

    @property
    def url(self) -> str:
        """``http://HOST:PORT/``: the page."""
        assert self._address is not None, "not listening"
        return _http_url(*self._address)

    @property
    def ws_url(self) -> str:
        """``ws://HOST:PORT/api/console`` with the token in the query."""
        base = "ws" + self.url[len("http") :] + "api/console"
        return base if self.config.token is None else f"{base}?token={self.config.token}"

    @property
    def token(self) -> str | None:
        return self.config.token


def serve_forever(
    config: ConsoleConfig,
    provider: Provider,
    *,
    echo: Callable[[str], None],
    runner: RunnerFactory | None = None,
) -> int:
    """``wirecut serve``: serve in the main thread until SIGTERM or Ctrl+C; returns the exit code.

    Prints the banner once connections are accepted, writes ``serve.json``
    (mode 0600) into the data directory and removes it at exit. ``runner``
    as for ``build_state``.
    """
    state = build_state(config, provider, runner=runner)
    info_path = config.data_dir / SERVE_JSON
    wrote: list[Path] = []

    def on_listening(host: str, port: int) -> None:
        url = _http_url(host, port)
        shown = url if config.token is None else f"{url}?token={config.token}"
        info: dict[str, Any] = {"url": url, "token": config.token, "pid": os.getpid()}
        _write_private(info_path, json.dumps(info))
        wrote.append(info_path)
        echo(f"wirecut console: {shown}")
        sys.stdout.flush()

    server = _ConsoleUvicorn(_uvicorn_config(state, config.host, config.port), state, on_listening)
    try:
        server.run()
    finally:
        for path in wrote:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return 0 if server.started else 1


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (created 0600, never wider)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
