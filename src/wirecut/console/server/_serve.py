"""Running the console: its configuration, its provider, and uvicorn.

``ConsoleServer`` serves on a background thread (tests, ``repro``, ``bench``);
``serve_forever`` is ``wirecut serve``: the main thread, the banner,
``serve.json``, and a clean stop on SIGTERM or Ctrl+C.

Connections. uvicorn runs with the guarded protocols of ``_limits.py`` (a
request-head deadline, a connection cap that evicts idle connections first,
bounds on sends and closes) and the app behind ``HostGuard``;
``serve_forever`` first raises the soft descriptor limit to the hard one.
``serve.json`` carries the server's ``instance``, which ``/api/proof`` binds
its proofs to. uvicorn's log lines are passed through a filter that hides
``token=`` values (a WebSocket's URL is logged at level info).

The stop. uvicorn's own shutdown closes every WebSocket at once (code 1012),
which would end the commands as "disconnect" with no ``complete`` sent. So
the server's ``before_shutdown`` (``ConsoleState.shutdown``, run by
``wirecut.serving.Server``) first cancels every command with reason
"shutdown", waits (within the unwind bound) until each has its ``complete``,
lets the frames go out, and only then hands over to uvicorn. The signal
handler itself only sets a flag (uvicorn's): ``scope.cancel()`` takes a lock
and is never called from a signal handler.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import uvicorn

from wirecut.agent import McpServers
from wirecut.console.commands import CommandSet, Services
from wirecut.console.runner import CommandRunner, Runner, RunnerLimits
from wirecut.console.server._access import HostPolicy
from wirecut.console.server._app import ConsoleState, create_app
from wirecut.console.server._metrics import ConsoleMetrics
from wirecut.console.server._serve_file import ServeFile
from wirecut.console.server._slot_watch import SlotWatch
from wirecut.launch import Provider
from wirecut.provider import DEFAULT_MAX_TOKENS, ProviderSpec
from wirecut.serving import (
    BackgroundServer,
    ConnectionGuard,
    ConnectionLimits,
    GuardedConfig,
    Server,
    ServerThread,
    connection_families,
    descriptor_limit,
    http_base,
    listen_all,
    raise_descriptor_limit,
)

__all__ = [
    "ConsoleConfig",
    "ConsoleServer",
    "RunnerFactory",
    "serve_forever",
]

#: Makes the runner of a console from its services and metrics (default: a
#: ``CommandRunner``; ``wirecut serve --ray`` passes a ``ClusterRunner``'s).
RunnerFactory = Callable[[Services, ConsoleMetrics], Runner]

#: A WebSocket message larger than this closes the connection (1009); the
#: protocol's own frame limit (an error frame, the connection kept) is lower.
WS_MAX_BYTES = ConnectionLimits.ws_max_size


#: The runner's defaults: written once, in ``RunnerLimits``.
_RUNNER = RunnerLimits()


@dataclass
class ConsoleConfig:
    """``wirecut serve``'s options (docs/protocol.md, "Command line")."""

    host: str = "127.0.0.1"
    port: int = 8765
    #: None: no token is required (only allowed on a loopback host).
    token: str | None = field(default_factory=lambda: secrets.token_urlsafe(24))
    workers: int = _RUNNER.workers
    command_timeout: float = _RUNNER.command_timeout
    unwind_timeout: float = _RUNNER.unwind_timeout
    escalate_after: float | None = None
    data_dir: Path = field(default_factory=lambda: Path("."))
    provider_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    #: max_tokens of one chat reply.
    max_tokens: int = DEFAULT_MAX_TOKENS
    #: Seconds between two reads of a streaming reply: each takes every token that
    #: came meanwhile, so a reply is shown 12 times a second (its first token at
    #: once) and a token costs a fraction of a worker's wake-up instead of one.
    read_interval: float = 0.08
    #: Host names it answers to besides the ones it is bound to (``--allowed-host``).
    allowed_hosts: tuple[str, ...] = ()
    #: Bounds on connections, timeouts included (docs/security.md).
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)

    def provider_spec(self, provider: Provider) -> ProviderSpec:
        """The one description of ``provider`` that the services and any host share."""
        return ProviderSpec(
            provider.base_url,
            self.api_key,
            provider.model,
            provider.label,
            self.max_tokens,
            read_interval=self.read_interval,
        )

    @property
    def runner_limits(self) -> RunnerLimits:
        """The runner's bounds from these options."""
        return RunnerLimits(
            workers=self.workers,
            command_timeout=self.command_timeout,
            unwind_timeout=self.unwind_timeout,
            escalate_after=self.escalate_after,
        )


def build_state(
    config: ConsoleConfig,
    provider: Provider,
    *,
    runner: RunnerFactory | None = None,
    commands: CommandSet | None = None,
    mcp: McpServers | None = None,
) -> ConsoleState:
    """The runner, services and metrics of one console over ``provider``.

    ``runner`` makes the runner (default: a ``CommandRunner`` per ``config``,
    accepting ``commands``, by default the built-in ones). ``mcp``: the MCP
    servers whose tools the agents get, started (and closed) by the caller.
    """
    from wirecut.memory import NoteStore

    spec = config.provider_spec(provider)
    # No more requests in flight than the provider has slots: a command cut
    # while its request waits here never reaches the engine (fact 11).
    admission = provider.admission(config.api_key)
    client = spec.client(admission)
    services = Services.of(NoteStore.in_data_dir(config.data_dir), spec, lambda: client, mcp=mcp)
    metrics = ConsoleMetrics()
    # How long a cut request kept its provider slot (docs/cancellation-limits.md).
    metrics.slot_watch = SlotWatch(
        provider.base_url.rstrip("/").removesuffix("/v1"),
        registry=metrics.registry,
        api_key=config.api_key,
    )
    made: Runner
    if runner is None:
        made = CommandRunner(
            services, commands=commands, limits=config.runner_limits, observer=metrics
        )
    else:
        made = runner(services, metrics)
    metrics.attach(made)
    state = ConsoleState(
        runner=made,
        metrics=metrics,
        token=config.token,
        hosts=HostPolicy.for_bind(config.host, config.allowed_hosts),
        limits=config.limits,
        mcp=mcp,
        admission=admission,
    )
    state.guard = ConnectionGuard(config.limits, config.limits.connections_for(descriptor_limit()))
    metrics.registry.register(_ConnectionCollector(state))
    return state


class _ConnectionCollector:
    """``/metrics`` gauges and counters of the connections, read at scrape time."""

    def __init__(self, state: ConsoleState) -> None:
        self._console = state

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        guard = self._console.guard
        assert guard is not None
        opened, dropped = connection_families(
            guard,
            open_help="Open TCP connections.",
            dropped_help="Connections the server ended for a limit (docs/security.md), by why.",
        )
        yield opened
        yield GaugeMetricFamily(
            "wirecut_outbox_bytes",
            "Bytes of console frames waiting to be sent, over every connection.",
            value=sum(c.outbox_bytes for c in self._console.connections),
        )
        yield dropped


def _uvicorn_config(state: ConsoleState, host: str, port: int) -> uvicorn.Config:
    assert state.guard is not None, "build the state with build_state()"
    config = GuardedConfig(
        create_app(state),
        guard=state.guard,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    for name in ("uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).addFilter(_REDACT_TOKENS)  # the same filter once
    return config


class _RedactTokens(logging.Filter):
    """Replaces the value of every ``token=`` in a log line (uvicorn logs WebSocket URLs)."""

    _TOKEN = re.compile(r"((?:\?|&|;|%3[Ff]|%26)token=)[^&;#\s\"']*", re.IGNORECASE)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = self._TOKEN.sub(r"\1[redacted]", message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


_REDACT_TOKENS = _RedactTokens()


def _http_url(host: str, port: int) -> str:
    return http_base(host, port) + "/"


class ConsoleServer(BackgroundServer):
    """A console served by uvicorn on a background thread, for tests, ``repro`` and ``bench``.

    ::

        with ConsoleServer(ConsoleConfig(port=0, data_dir=tmp), provider) as console:
            websockets.sync.client.connect(console.ws_url)

    ``stop()`` ends every command with reason "shutdown" (each gets its
    ``complete``), then stops uvicorn and joins its thread; it does not stop
    the provider or the MCP servers, which the caller passed in and owns.
    """

    def __init__(
        self,
        config: ConsoleConfig,
        provider: Provider,
        *,
        runner: RunnerFactory | None = None,
        commands: CommandSet | None = None,
        mcp: McpServers | None = None,
    ) -> None:
        self.config = config
        self.provider = provider
        self.state = build_state(config, provider, runner=runner, commands=commands, mcp=mcp)
        self._thread = ServerThread(
            _uvicorn_config(self.state, config.host, config.port),
            what="console",
            before_shutdown=self.state.shutdown,
        )

    def start(self, timeout: float = 10.0) -> Self:
        """Listen; RuntimeError naming the cause if it cannot (see ``ServerThread``)."""
        self._thread.start(timeout)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """End every command (each gets its complete), stop uvicorn and join its thread."""
        self._thread.stop(timeout)

    @property
    def address(self) -> tuple[str, int]:
        return self._thread.address

    @property
    def url(self) -> str:
        """``http://HOST:PORT/``: the page."""
        return _http_url(*self.address)

    @property
    def ws_url(self) -> str:
        """``ws://HOST:PORT/api/console`` with the token in the query."""
        base = "ws" + self.url[len("http") :] + "api/console"
        return base if self.config.token is None else f"{base}?token={self.config.token}"

    @property
    def token(self) -> str | None:
        return self.config.token

    @property
    def instance(self) -> str:
        """The random id ``serve.json`` carries and ``/api/proof`` binds its proofs to."""
        return self.state.instance


def serve_forever(
    config: ConsoleConfig,
    provider: Provider,
    *,
    echo: Callable[[str], None],
    runner: RunnerFactory | None = None,
    mcp: McpServers | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> int:
    """``wirecut serve``: serve in the main thread until SIGTERM or Ctrl+C; returns the exit code.

    Prints the banner once connections are accepted, writes ``serve.json``
    (mode 0600) into the data directory and removes it at exit, unless
    another live console owns it (``ServeFile``: then a warning, and the
    file stays that console's). ``runner``
    and ``mcp`` as for ``build_state``. ``say`` gets the lines for people (stderr): how
    many requests the provider is handed at once.
    """
    # Before the state: the connection cap is fitted to the limit in force.
    raise_descriptor_limit()
    state = build_state(config, provider, runner=runner, mcp=mcp)
    if state.admission is not None:
        say(f"provider requests: {state.admission.describe()}")
    serve_file = ServeFile(config.data_dir)
    try:
        owner = serve_file.claim()
    except OSError as exc:
        owner = None
        say(f"warning: cannot lock {serve_file.lock_path} ({exc.strerror}): no serve.json written")
    if owner is not None:
        who = f"pid {owner.get('pid', '?')}, {owner.get('url', 'starting')}"
        say(
            f"warning: another console ({who}) owns {serve_file.path}: `wirecut console` "
            "without a URL reaches that one; this one only by its own URL"
        )

    def on_listening(host: str, port: int) -> None:
        # Startup made most of the objects this process will hold (modules,
        # the app, its state); frozen, they are no longer walked by each full
        # collection, a pause on whichever thread allocates at the time (the
        # event loop, in a burst of cancels): 2 to 12 ms instead of 20 to 35
        # on the development machine (docs/architecture.md).
        gc.collect()
        gc.freeze()
        url = _http_url(host, port)
        shown = url if config.token is None else f"{url}?token={config.token}"
        info: dict[str, Any] = {
            "url": url,
            "token": config.token,
            "pid": os.getpid(),
            "instance": state.instance,
        }
        if serve_file.owned:
            serve_file.write(info)
        echo(f"wirecut console: {shown}")
        sys.stdout.flush()

    uvicorn_config = _uvicorn_config(state, config.host, config.port)
    server = Server(uvicorn_config, on_listening=on_listening, before_shutdown=state.shutdown)
    try:
        # Bound here, not by uvicorn: "localhost" is both loopbacks (listen_all).
        sockets = listen_all(config.host, config.port, uvicorn_config.backlog, what="console")
    except RuntimeError as exc:
        serve_file.release()
        say(str(exc))
        return 1
    try:
        with contextlib.ExitStack() as stack:
            for sock in sockets:
                stack.enter_context(sock)
            server.run(sockets=sockets)
    finally:
        serve_file.release()  # Removes serve.json only if this server wrote it.
    return 0 if server.started else 1
