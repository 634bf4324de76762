"""uvicorn the way wirecut's servers run it: told when it listens, stopped in order, on a thread.

The console (``wirecut serve``, ``ConsoleServer``) and the simulator
(``wirecut provider``, ``SimulatorServer``) both need the same four things of
uvicorn, and had drifted when each did them itself:

- ``Server``: says ``on_listening(host, port)`` once connections are
  accepted; runs ``before_shutdown`` before uvicorn's own shutdown (the
  console ends its commands, the simulator its endless streams, before
  uvicorn waits for in-flight responses); and exits 0 on SIGINT or SIGTERM,
  the normal way to stop (uvicorn re-raises the signal once it has shut down).
- ``listen``: binds the socket before uvicorn starts, so that a port that is
  taken is a ``RuntimeError`` naming the cause (uvicorn logs it and ends the
  thread with ``SystemExit``); ``listen_all`` binds both loopbacks for
  ``localhost`` (uvicorn would bind 127.0.0.1 alone).
- ``ServerThread``: the server on a background thread, for tests, ``repro``
  and ``bench``: ``start()`` returns once it listens, ``stop()`` asks it to
  exit, forces it past a bound, and raises if the thread is still alive.

``Server.capture_signals`` relies on uvicorn's private ``_captured_signals``;
it checks that it exists and fails loudly if not (pyproject.toml caps uvicorn).
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from urllib.parse import urlsplit

import uvicorn

__all__ = ["Server", "ServerThread", "http_address", "http_base", "listen", "listen_all"]


class Server(uvicorn.Server):
    """uvicorn, told when it listens and what to end before its own shutdown.

    ``on_listening(host, port)`` runs on the server's loop once it accepts
    connections; ``before_shutdown()`` is awaited there when it stops.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        on_listening: Callable[[str, int], None],
        before_shutdown: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(config)
        self._on_listening = on_listening
        self._before_shutdown = before_shutdown

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.should_exit:  # The bind failed: uvicorn said so and is leaving.
            return
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        self._on_listening(str(host), int(port))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._before_shutdown is not None:
            await self._before_shutdown()
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
            # down; a signal is the normal way to stop, so the process exits 0
            # instead of dying of the signal again.
            self._captured_signals.clear()


def listen(host: str, port: int, backlog: int, *, what: str) -> socket.socket:
    """A TCP socket listening on ``host:port``, as uvicorn would bind it.

    Raises ``RuntimeError`` naming ``what`` and the cause when it cannot.
    """
    problem = f"{what} could not listen on {host}:{port}"
    # uvicorn's choice: IPv6 for an address with a colon, else IPv4.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, family, socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (OSError, OverflowError, UnicodeError) as exc:
        raise RuntimeError(f"{problem}: {getattr(exc, 'strerror', None) or exc}") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except (OSError, OverflowError) as exc:
        sock.close()
        raise RuntimeError(f"{problem}: {getattr(exc, 'strerror', None) or exc}") from exc
    return sock


def listen_all(host: str, port: int, backlog: int, *, what: str) -> list[socket.socket]:
    """The listening sockets of ``host``: ``listen`` once, or for ``localhost`` both loopbacks.

    ``localhost`` is 127.0.0.1 and ::1 (a browser may try either first): both
    are bound, on the same port (the one the first got, for port 0). A
    machine without IPv6 gets 127.0.0.1 alone; a ::1 whose port is taken by
    another program is a ``RuntimeError``, as for the first.
    """
    if host != "localhost":
        return [listen(host, port, backlog, what=what)]
    first = listen("127.0.0.1", port, backlog, what=what)
    if not socket.has_ipv6:
        return [first]
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:
        return [first]  # IPv6 is compiled in but not available here
    probe.close()
    try:
        second = listen("::1", first.getsockname()[1], backlog, what=what)
    except RuntimeError as exc:
        if isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EADDRNOTAVAIL:
            return [first]  # no ::1 on this machine (IPv6 switched off)
        first.close()
        raise
    return [first, second]


def http_base(host: str, port: int) -> str:
    """``http://HOST:PORT`` (an IPv6 address in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def http_address(url: str) -> tuple[str, int]:
    """``(host, port)`` of an ``http_base`` URL, with or without a path (``/v1``): its inverse."""
    host, _, port = urlsplit(url).netloc.rpartition(":")
    return host.strip("[]"), int(port)


class ServerThread:
    """A ``Server`` on a background thread, serving a socket bound with ``listen``.

    Safe to call from any thread but its own. ``start()`` returns once
    connections are accepted; ``stop()`` is idempotent.

    Cancellation: ``stop()`` sets uvicorn's ``should_exit`` (its shutdown,
    ``before_shutdown`` first, runs on the thread), joins for ``timeout``,
    then sets ``force_exit`` and joins for ``timeout`` again; a thread still
    alive after that is a ``RuntimeError``, never ignored.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        what: str,
        before_shutdown: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.what = what
        self._requested = (config.host, config.port)
        self._server = Server(
            config, on_listening=self._on_listening, before_shutdown=before_shutdown
        )
        self._address: tuple[str, int] | None = None
        self._listening = threading.Event()
        self._error: BaseException | None = None
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._run, name=f"wirecut-{what}", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` it listens on; RuntimeError when it does not."""
        if self._address is None:
            raise RuntimeError(f"the {self.what} is not listening")
        return self._address

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def start(self, timeout: float = 10.0) -> None:
        """Listen, and return once connections are accepted.

        Raises ``RuntimeError`` if it cannot listen (the port is taken, the
        app's startup failed) and ``TimeoutError`` if it does not listen
        within ``timeout`` seconds (it is stopped then).
        """
        if self.started:
            raise RuntimeError(f"the {self.what} was started already: build a new one")
        self._sockets = listen_all(*self._requested, self._server.config.backlog, what=self.what)
        self._thread.start()
        if not self._listening.wait(timeout):
            self.stop()
            raise TimeoutError(f"the {self.what} did not start listening within {timeout} s")
        if self._address is None:
            self._thread.join(timeout)
            host, port = self._requested
            raise RuntimeError(
                f"the {self.what} could not serve on {host}:{port}: {self._error!r}"
            ) from self._error

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread; nothing if it is not running."""
        if not self._thread.is_alive():
            return
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the {self.what} thread was still running after force_exit")

    def _run(self) -> None:
        assert self._sockets
        try:
            with contextlib.ExitStack() as stack:
                for sock in self._sockets:
                    stack.enter_context(sock)
                self._server.run(sockets=self._sockets)
        except BaseException as exc:
            # uvicorn ends a failed startup with SystemExit; report it to start().
            self._error = exc
        finally:
            self._listening.set()

    def _on_listening(self, host: str, port: int) -> None:
        self._address = (host, port)
        self._listening.set()
