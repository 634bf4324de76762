"""Run a ``Simulator`` under uvicorn: on a background thread, or in the foreground.

``SimulatorServer`` is for tests and benchmarks: it serves on its own thread
and event loop, and its methods are safe to call from any other thread.
``serve_forever`` is for the ``wirecut provider`` command: it runs in the
main thread until SIGINT or SIGTERM.
"""

from __future__ import annotations

import contextlib
import enum
import socket
import threading
from collections.abc import Callable, Iterator
from types import TracebackType

import uvicorn

from wirecut.simulator._app import Simulator
from wirecut.simulator._config import SimConfig
from wirecut.simulator._events import EventKind, SimEvent
from wirecut.simulator._requests import RequestSummary
from wirecut.simulator._script import Responder

__all__ = ["ServerState", "SimulatorServer", "serve_forever"]


class ServerState(enum.Enum):
    """Lifecycle of a ``SimulatorServer``; it cannot be restarted."""

    # Built; not listening yet.
    NEW = "new"
    # Listening; its thread runs the event loop.
    RUNNING = "running"
    # Stopped, or failed to start; its thread has exited.
    STOPPED = "stopped"


class _UvicornServer(uvicorn.Server):
    """uvicorn, told when it listens and stopping the simulator's work first."""

    def __init__(
        self,
        config: uvicorn.Config,
        simulator: Simulator,
        on_listening: Callable[[str, int], None],
    ) -> None:
        super().__init__(config)
        self._simulator = simulator
        self._on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # A failed bind ends startup with SystemExit, so here it is listening.
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        self._on_listening(str(host), int(port))

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            # uvicorn re-raises the SIGINT/SIGTERM it caught once it has shut
            # down; for the simulator a signal is the normal way to stop, so
            # the process exits 0 rather than dying of the signal again.
            self._captured_signals.clear()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn waits for in-flight responses; an endless stream never ends
        # by itself, so end the simulator's work before that wait.
        self._simulator.begin_shutdown()
        await super().shutdown(sockets)


def _uvicorn_config(simulator: Simulator, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        simulator.app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
    )


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    """A TCP socket listening on ``host:port``, as uvicorn would bind it.

    Bound here rather than by uvicorn so that a failure is a RuntimeError that
    names the cause (uvicorn logs it and exits the thread with SystemExit).
    """
    what = f"simulator could not listen on {host}:{port}"
    # uvicorn's choice: IPv6 for an address with a colon, else IPv4.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, family, socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (OSError, OverflowError, UnicodeError) as exc:
        raise RuntimeError(f"{what}: {getattr(exc, 'strerror', None) or exc}") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except (OSError, OverflowError) as exc:
        sock.close()
        raise RuntimeError(f"{what}: {getattr(exc, 'strerror', None) or exc}") from exc
    return sock


def _base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class SimulatorServer:
    """A ``Simulator`` served by uvicorn on a background thread.

    Safe to call from any thread but its own. Use as a context manager::

        with SimulatorServer(SimConfig(tokens_per_second=100, prompt_ms=10)) as sim:
            client = OpenAI(base_url=sim.base_url, api_key="x")
            ...
            sim.wait_for(lambda ev: ev.kind == "slot_freed", timeout=5)

    Cancellation: ``stop()`` ends every queued and decoding request at once
    (streams end without ``[DONE]``, queued non-stream requests get a 503),
    tells uvicorn to exit and joins its thread; if uvicorn has not exited
    within ``timeout`` it is forced, and a thread still alive after that is a
    ``RuntimeError``, never ignored.
    """

    def __init__(
        self,
        config: SimConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        responder: Responder | None = None,
    ) -> None:
        self.simulator = Simulator(config, responder=responder)
        self._requested = (host, port)
        self._state = ServerState.NEW
        self._address: tuple[str, int] | None = None
        self._listening = threading.Event()
        self._error: BaseException | None = None
        self._socket: socket.socket | None = None
        self._server = _UvicornServer(
            _uvicorn_config(self.simulator, host, port), self.simulator, self._on_listening
        )
        self._thread = threading.Thread(
            target=self._run, name=f"wirecut-simulator-{host}:{port}", daemon=True
        )

    # -- lifecycle --------------------------------------------------------

    @property
    def state(self) -> ServerState:
        return self._state

    def start(self, timeout: float = 10.0) -> None:
        """Listen, and return once connections are accepted.

        Raises RuntimeError if it cannot listen (the port is taken) and
        TimeoutError if uvicorn is not up within ``timeout`` seconds.
        """
        if self._state is not ServerState.NEW:
            raise RuntimeError(
                f"Cannot start a SimulatorServer that is {self._state.value}; build a new one."
            )
        try:
            self._socket = _listen(*self._requested, self._server.config.backlog)
        except RuntimeError:
            self._state = ServerState.STOPPED
            raise
        self._state = ServerState.RUNNING
        self._thread.start()
        if not self._listening.wait(timeout):
            self.stop()
            raise TimeoutError(f"simulator did not start listening within {timeout} s")
        if self._address is None:
            self._thread.join(timeout)
            self._state = ServerState.STOPPED
            host, port = self._requested
            raise RuntimeError(
                f"simulator could not serve on {host}:{port}: {self._error!r}"
            ) from self._error

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread. If already stopped this does nothing."""
        if self._state is ServerState.NEW:
            self._state = ServerState.STOPPED
            return
        if self._state is ServerState.STOPPED:
            return
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)
        self._state = ServerState.STOPPED
        if self._thread.is_alive():
            raise RuntimeError(f"simulator thread still running {timeout} s after force_exit")

    def __enter__(self) -> SimulatorServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- address ----------------------------------------------------------

    @property
    def host(self) -> str:
        return self._bound()[0]

    @property
    def port(self) -> int:
        return self._bound()[1]

    @property
    def url(self) -> str:
        """The server root, ``http://HOST:PORT`` (for ``/health``, ``/slots``, ``/sim/...``)."""
        return _base_url(*self._bound())

    @property
    def base_url(self) -> str:
        """The OpenAI API base, ``http://HOST:PORT/v1``."""
        return self.url + "/v1"

    # -- observation (any thread) -------------------------------------------

    def events(self, since: int = 0) -> list[SimEvent]:
        """The event log from ``seq`` ``since`` on, oldest first."""
        return self.simulator.events(since)

    def requests(self) -> list[RequestSummary]:
        """A summary of each request since the last reset, oldest first."""
        return self.simulator.requests()

    def slots(self) -> list[dict[str, object]]:
        """Each slot as ``{"id", "is_processing", "n_decoded", "request_id"}``."""
        return self.simulator.slots()

    def reset(self) -> None:
        """Clear the event log and finished request records (see ``Simulator.reset``)."""
        self.simulator.reset()

    def wait_for(
        self, predicate: Callable[[SimEvent], bool], timeout: float = 5.0, since: int = 0
    ) -> SimEvent:
        """Block until an event (``seq >= since``, past ones included) matches; return it.

        Raises TimeoutError after ``timeout`` seconds. Waits on a condition
        that each new event notifies; it never polls.
        """
        return self.simulator.event_log.wait_for(predicate, timeout, since)

    def wait_for_event(
        self,
        kind: EventKind | str,
        request_id: str | None = None,
        timeout: float = 5.0,
        since: int = 0,
    ) -> SimEvent:
        """``wait_for`` an event of ``kind``, for ``request_id`` if given."""
        return self.wait_for(
            lambda ev: ev.kind == kind and (request_id is None or ev.request_id == request_id),
            timeout,
            since,
        )

    # -- the server thread ------------------------------------------------

    def _run(self) -> None:
        assert self._socket is not None
        try:
            with self._socket:
                self._server.run(sockets=[self._socket])
        except BaseException as exc:
            # uvicorn ends a failed startup with SystemExit; report it to start().
            self._error = exc
        finally:
            self._listening.set()

    def _on_listening(self, host: str, port: int) -> None:
        self._address = (host, port)
        self._listening.set()

    def _bound(self) -> tuple[str, int]:
        if self._address is None:
            raise RuntimeError(f"SimulatorServer is {self._state.value}, not listening")
        return self._address


def serve_forever(
    config: SimConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    responder: Responder | None = None,
    on_listening: Callable[[str], None] | None = None,
) -> None:
    """Serve in the calling (main) thread until SIGINT or SIGTERM.

    ``on_listening`` gets the API base URL once connections are accepted.
    A signal is the normal way to stop: this returns once the server has
    shut down. Raises RuntimeError, naming the cause, if it cannot listen.
    """
    simulator = Simulator(config, responder=responder)

    def listening(bound_host: str, bound_port: int) -> None:
        if on_listening is not None:
            on_listening(_base_url(bound_host, bound_port) + "/v1")

    server = _UvicornServer(_uvicorn_config(simulator, host, port), simulator, listening)
    with _listen(host, port, server.config.backlog) as sock:
        try:
            server.run(sockets=[sock])
        except SystemExit as exc:
            raise RuntimeError(f"simulator could not serve on {host}:{port}") from exc
