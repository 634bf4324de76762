"""``BodyParser``: a request body checked on the loop when it is small, in another process when not.

``json.loads`` runs in C holding the GIL: a large body of nested empty lists
took the whole proxy for seconds, and a thread would not have helped (the
loop cannot run while the parse holds the GIL). A body up to
``ON_LOOP_BYTES`` (a few milliseconds of parse at worst) is parsed where it
arrived; a larger one in a worker process (``concurrent.futures``, started
with ``spawn`` at the first large body), which hands back the request
ready for the upstream, so the loop only copies bytes. One large body at a
time is parsed; the others wait their turn, each bounded by
``--max-body-bytes``.

Event loop only; ``close()`` from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import threading
from typing import Any

from wirecut._json import JSONError, loads
from wirecut.proxy._dialects import Endpoint
from wirecut.proxy._request import BadRequest, ClientRequest, parse_request

__all__ = ["ON_LOOP_BYTES", "BodyParser", "load_object"]

#: The largest body parsed on the event loop, in bytes.
ON_LOOP_BYTES = 64 * 1024


class BodyParser:
    """Parses request bodies (``parse_request``) without stalling the loop; see the module."""

    def __init__(self) -> None:
        # Guards the executor's creation and shutdown (close() may come from any thread).
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self._closed = False
        self._turn = asyncio.Semaphore(1)

    async def parse(
        self,
        raw: bytes,
        endpoint: Endpoint,
        request_id: str,
        default_model: str | None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> ClientRequest:
        """The checked request, or ``BadRequest`` saying what is wrong with it.

        Cancellation: a cancel while a large body is parsed abandons the
        result; the worker finishes that parse and takes the next.
        """
        if len(raw) <= ON_LOOP_BYTES:
            return parse_request(raw, endpoint, request_id, default_model, headers)
        async with self._turn:
            executor = self._pool()
            future = asyncio.get_running_loop().run_in_executor(
                executor, parse_request, raw, endpoint, request_id, default_model, headers
            )
            try:
                return await future
            except concurrent.futures.process.BrokenProcessPool:
                self._reset()
                raise BadRequest(
                    "the request body could not be parsed: the parser process ended"
                ) from None

    async def load(self, raw: bytes) -> dict[str, Any] | None:
        """A JSON object parsed in the worker process (None: it is not one, or it failed).

        For a body checked before, read again (a prompt to count after a cut).
        """
        try:
            async with self._turn:
                future = asyncio.get_running_loop().run_in_executor(self._pool(), load_object, raw)
                return await future
        except (concurrent.futures.process.BrokenProcessPool, BadRequest):
            return None

    def close(self) -> None:
        """Stop the worker process, if one was started. Idempotent."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def _pool(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            if self._closed:
                raise BadRequest("the proxy is stopping")
            if self._executor is None:
                self._executor = concurrent.futures.ProcessPoolExecutor(
                    max_workers=1, mp_context=multiprocessing.get_context("spawn")
                )
            return self._executor

    def _reset(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


def load_object(raw: bytes) -> dict[str, Any] | None:
    """``raw`` as a JSON object; None if it is not one (run in the worker process)."""
    try:
        value = loads(raw)
    except JSONError:
        return None
    return value if isinstance(value, dict) else None
