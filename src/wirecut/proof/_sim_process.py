"""The simulator in a process of its own: a provider must not share the GIL it is timed against.

``wirecut bench`` times when the provider saw a cut request's close
(``t_disconnect``). A simulator running in the bench's own process gets to
the close only when it gets the GIL, after the 64 workers a burst woke have
unwound: every close of a batch then came at once, 20 to 50 ms after the
cancel, though the sockets were shut in the first few milliseconds. A real
provider (llama.cpp, vLLM) is a process of its own; so is this one.

``SimProcess`` runs ``python -m wirecut provider`` with a ``SimConfig``'s
settings and reads its event log over ``GET /sim/events`` (the stamps are
``time.monotonic()``, CLOCK_MONOTONIC: one clock for every process of the
machine, so they subtract from this process's). Its waits poll, with a
cursor, every ``POLL`` seconds: another process's log has no condition to
wait on.

Its keep-alive connection is let go after ``KEEPALIVE_EXPIRY`` idle seconds,
before the simulator (uvicorn: 5 s) closes it; a GET that still meets a
connection the server closed just as it was sent (the classic keep-alive
race: "Server disconnected without sending a response") is sent once more on
a new connection. Its answer is the same: these reads change nothing.

The child leads a session of its own, watched by the scope's group reaper
(``_child``): a bench killed with SIGKILL takes the simulator with it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import httpx

from wirecut.proof._child import Child, ChildService
from wirecut.serving import http_address
from wirecut.simulator import SimConfig, SimEvent

__all__ = ["POLL", "SimProcess", "get_idempotent", "poll_client"]

#: Seconds between two readings of the event log while waiting.
POLL = 0.01
#: Seconds the simulator may take to listen.
START_TIMEOUT = 30.0
#: Seconds an idle keep-alive connection is kept: below the simulator's (uvicorn's 5 s).
KEEPALIVE_EXPIRY = 2.0
#: What a GET on a connection the server closed under it raises (it is sent again).
_STALE_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def poll_client() -> httpx.Client:
    """The client of a process's readings: idle connections go before the server closes them."""
    return httpx.Client(timeout=10.0, limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY))


def get_idempotent(
    http: httpx.Client, url: str, params: dict[str, int] | None = None
) -> httpx.Response:
    """``GET url``, sent again once when the connection it went on was closed under it.

    Only for a GET that changes nothing. Raises ``httpx.HTTPError`` for an
    error status or a second failure.
    """
    try:
        response = http.get(url, params=params)
    except _STALE_CONNECTION:
        # The closed connection left the pool: this goes on a new one.
        response = http.get(url, params=params)
    response.raise_for_status()
    return response


class SimProcess(ChildService):
    """``wirecut provider`` in a child process, with ``config``'s settings; a context manager.

    Offers the part of ``SimulatorServer`` that the proof tools read:
    ``base_url``, ``events(since)``, ``slots()``, ``wait_for(match,
    timeout=, since=)``, and ``next_seq()``. ``config.model`` must be the simulator's default
    (the command line does not set it).
    """

    def __init__(self, config: SimConfig) -> None:
        default = SimConfig().model
        if config.model != default:
            raise ValueError(f"a simulator process serves {default!r}, not {config.model!r}")
        self.config = config
        super().__init__(Child("simulator"))
        self._url: str | None = None
        self._http: httpx.Client | None = None

    def argv(self) -> list[str]:
        """The command line that runs this simulator."""
        cfg = self.config
        argv = [sys.executable, "-m", "wirecut", "provider", "--port", "0"]
        argv += ["--slots", str(cfg.slots), "--tokens-per-second", repr(cfg.tokens_per_second)]
        argv += ["--prompt-ms", repr(cfg.prompt_ms), "--reply-tokens", str(cfg.reply_tokens)]
        if cfg.prompt_tokens_per_second is not None:
            argv += ["--prompt-tokens-per-second", repr(cfg.prompt_tokens_per_second)]
            argv += ["--prompt-batch", str(cfg.prompt_batch)]
        if cfg.endless:
            argv.append("--endless")
        if cfg.multibyte_every:
            argv += ["--multibyte-every", str(cfg.multibyte_every)]
        return argv

    def start(self, timeout: float = START_TIMEOUT) -> SimProcess:
        """Run the simulator; return once it listens. RuntimeError (with its stderr) if not."""
        # "wirecut provider: http://127.0.0.1:PORT/v1 (slots=…)"
        self._url = self._child.start(
            self.argv(), lambda line: line.partition(": ")[2].split(" ")[0], timeout
        )
        self._http = poll_client()
        return self

    @property
    def address(self) -> tuple[str, int]:
        """Where it listens (``base_url``: ``http://127.0.0.1:PORT/v1``, what a client takes)."""
        if self._url is None:
            raise RuntimeError("the simulator process is not running (call start())")
        return http_address(self._url)

    def events(self, since: int = 0) -> list[SimEvent]:
        """The event log from ``seq`` ``since`` on, oldest first."""
        response = self._get("/sim/events", {"since": since})
        return [SimEvent.from_json(item) for item in response.json()]

    def slots(self) -> list[dict[str, object]]:
        """Each slot, as the simulator's ``GET /slots`` says (``SimulatorServer.slots()``)."""
        slots: list[dict[str, object]] = self._get("/slots").json()
        return slots

    def _get(self, path: str, params: dict[str, int] | None = None) -> httpx.Response:
        assert self._http is not None  # made with the URL
        return get_idempotent(self._http, f"{self.url}{path}", params)

    def next_seq(self) -> int:
        """The ``seq`` the next event will have."""
        events = self.events(0)
        return events[-1].seq + 1 if events else 0

    def wait_for(
        self, match: Callable[[SimEvent], bool], /, *, timeout: float, since: int = 0
    ) -> SimEvent:
        """The first event from ``since`` on that ``match``es; TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        cursor = since
        while True:
            for event in self.events(cursor):
                if match(event):
                    return event
                cursor = event.seq + 1
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no matching simulator event within {timeout} s")
            time.sleep(min(POLL, remaining))

    def stop(self) -> None:
        """SIGTERM, then SIGKILL (``_child.STOP_TIMEOUT`` apart); reaps the child. Idempotent."""
        http, self._http = self._http, None
        if http is not None:
            http.close()
        self._url = None
        self._child.stop()
