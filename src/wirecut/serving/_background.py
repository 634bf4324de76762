"""``BackgroundServer``: what every server that runs beside its caller offers.

The console, the proxy and the simulator serve with uvicorn on a thread of
this process (``ServerThread``); the embedded llama.cpp and the proof tools'
helpers run as child processes. To their caller they are one thing: start
it, use it as a context manager, read where it listens, stop it. That face
is written once, here; each server says how it starts and stops and where it
listens (``address``).
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

from wirecut.serving._uvicorn import http_base

__all__ = ["BackgroundServer"]


class BackgroundServer:
    """A server run beside its caller: ``start``, ``stop``, a context manager, and its address.

    A subclass implements ``start`` (returning ``self`` once it serves),
    ``stop`` (idempotent) and ``address``; ``port``, ``url`` and ``base_url``
    follow from ``address``. Safe to call from any thread but the server's own.

    Cancellation: leaving the ``with`` block, also by an exception or a
    Ctrl+C, calls ``stop()``, which ends what the server runs and waits
    (bounded) for its thread or process.
    """

    def start(self) -> Self:
        """Serve, and return once it listens."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop serving and wait (bounded) for it; nothing if it is not running."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` it listens on; an error naming why when it does not."""
        raise RuntimeError(f"the {type(self).__name__} has no address")

    @property
    def port(self) -> int:
        return self.address[1]

    @property
    def url(self) -> str:
        """``http://HOST:PORT``: the server's root."""
        return http_base(*self.address)

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``: what an OpenAI client takes as its base URL."""
        return http_base(*self.address) + "/v1"
