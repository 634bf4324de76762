"""Run a ``Simulator`` under uvicorn: on a background thread, or in the foreground.

``SimulatorServer`` is for tests and benchmarks: it serves on its own thread
and event loop, and its methods are safe to call from any other thread.
``serve_forever`` is for the ``wirecut provider`` command: it runs in the
main thread until SIGINT or SIGTERM.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Self

import uvicorn

from wirecut.serving import BackgroundServer, Server, ServerThread, http_base, listen
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


def _before_shutdown(simulator: Simulator) -> Callable[[], Awaitable[None]]:
    # uvicorn waits for in-flight responses; an endless stream never ends
    # by itself, so end the simulator's work before that wait.
    async def end_work() -> None:
        simulator.begin_shutdown()

    return end_work


class SimulatorServer(BackgroundServer):
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
        self._state = ServerState.NEW
        self._thread = ServerThread(
            _uvicorn_config(self.simulator, host, port),
            what="simulator",
            before_shutdown=_before_shutdown(self.simulator),
        )

    # -- lifecycle --------------------------------------------------------

    @property
    def state(self) -> ServerState:
        return self._state

    def start(self, timeout: float = 10.0) -> Self:
        """Listen, and return once connections are accepted.

        Raises RuntimeError if it cannot listen (the port is taken) and
        TimeoutError if uvicorn is not up within ``timeout`` seconds.
        """
        if self._state is not ServerState.NEW:
            raise RuntimeError(
                f"Cannot start a SimulatorServer that is {self._state.value}; build a new one."
            )
        try:
            self._thread.start(timeout)
        except BaseException:
            self._state = ServerState.STOPPED
            raise
        self._state = ServerState.RUNNING
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread. If already stopped this does nothing."""
        if self._state is ServerState.RUNNING:
            self._state = ServerState.STOPPED
            self._thread.stop(timeout)
        self._state = ServerState.STOPPED

    # -- address ----------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        # The address it listened on stays known once it stopped.
        try:
            return self._thread.address
        except RuntimeError:
            raise RuntimeError(f"SimulatorServer is {self._state.value}, not listening") from None

    @property
    def host(self) -> str:
        return self.address[0]

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
            on_listening(http_base(bound_host, bound_port) + "/v1")

    server = Server(
        _uvicorn_config(simulator, host, port),
        on_listening=listening,
        before_shutdown=_before_shutdown(simulator),
    )
    with listen(host, port, server.config.backlog, what="simulator") as sock:
        try:
            server.run(sockets=[sock])
        except SystemExit as exc:
            raise RuntimeError(f"simulator could not serve on {host}:{port}") from exc
