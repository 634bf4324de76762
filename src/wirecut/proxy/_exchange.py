"""``Exchange``: one proxied completion, from its arrival to its record.

Its life is QUEUED (in the proxy's FIFO) -> UPSTREAM (its worker thread at
the upstream) -> DONE (its record written); a cut may come in either of the
first two and ends it in DONE. ``cancel(reason)`` is the one way a request is
cut, whoever asks (the client leaving, ``POST /v1/requests/{id}/cancel``,
the timeout, the proxy stopping): first reason wins, a cancel of a finished
request does nothing.

The cut, by phase:

- queued: it leaves the FIFO and never reaches the upstream;
- at the upstream (connecting, prompt, decoding): the scope shuts the
  upstream socket down (the upstream sees the close at its next write) and
  ``run_sync`` waits, bounded by ``unwind_timeout``, for the worker to return.

Everything here runs on the event loop except ``relay``, which runs in the
worker thread under the request's scope.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from typing import TYPE_CHECKING

from starlette.types import Receive, Send

from wirecut.aio import Unwind, run_sync, unwind_of
from wirecut.proxy._assemble import Tally
from wirecut.proxy._channel import HEAD, Channel
from wirecut.proxy._record import ProxyRecord, RecordReason
from wirecut.proxy._relay import Outcome, RelayResult, relay
from wirecut.proxy._request import ClientRequest
from wirecut.proxy._wire import error_body, error_event, send_body, send_json, send_start
from wirecut.scope import Interrupted, InterruptScope

if TYPE_CHECKING:
    from wirecut.proxy._proxy import Proxy

__all__ = ["Exchange", "ExchangeState"]

_log = logging.getLogger("wirecut.proxy")

# What a client still connected gets when its request was cut: the HTTP
# status (499 is gRPC's and nginx's "cancelled by the client's side"), the
# error type and a message.
_CUT_ANSWERS = {
    RecordReason.CANCEL: (499, "cancelled", "the request was cancelled by id"),
    RecordReason.TIMEOUT: (504, "timeout", "the request took longer than --request-timeout"),
    RecordReason.SHUTDOWN: (503, "unavailable", "the proxy is stopping"),
}


class ExchangeState(enum.Enum):
    """Where a proxied request is; it only moves down this list."""

    QUEUED = "queued"  # waiting in the proxy's FIFO for an upstream slot
    UPSTREAM = "upstream"  # admitted: its worker is at the upstream
    DONE = "done"  # finished or cut; its record is written


class Exchange:
    """One proxied completion request. Event loop only (see the module docstring)."""

    def __init__(self, proxy: Proxy, request_id: str, request: ClientRequest) -> None:
        self.proxy = proxy
        self.id = request_id
        self.request = request
        # Its own scope while it waits; at admission, a lane's (see _lanes).
        self.scope = InterruptScope(f"proxy-{request_id}")
        self.state = ExchangeState.QUEUED
        self.reason: RecordReason | None = None
        self.record: ProxyRecord | None = None
        self.tally = Tally()
        self.arrived_at = time.monotonic()
        self.admitted_at: float | None = None
        self.worker_exited_at: float | None = None
        # Set by cancel(): wakes the FIFO wait.
        self.stopped = asyncio.Event()
        # Set once the record is written (cancel by id answers with it).
        self.finished = asyncio.Event()
        self._worker: asyncio.Future[RelayResult] | None = None
        self._relay_entered = False  # set in the worker thread as the relay starts
        self._released = False  # the admission slot was given back

    def cancel(self, reason: RecordReason) -> bool:
        """Cut this request for ``reason``; False if it was already cut or is done.

        Never blocks: the FIFO wait wakes, the scope cuts the upstream socket,
        and the worker task's cancel makes ``run_sync`` bound the unwind.
        """
        if self.state is ExchangeState.DONE or self.reason is not None:
            return False
        self.reason = reason
        self.stopped.set()
        self.scope.cancel(str(reason))
        if self._worker is not None:
            self._worker.cancel()
        return True

    async def serve(self, receive: Receive, send: Send) -> None:
        """Run the request to its end and answer the client; write the record."""
        loop = asyncio.get_running_loop()
        watch = asyncio.create_task(self._watch_disconnect(receive))
        timer = loop.call_later(
            self.proxy.config.request_timeout, self.cancel, RecordReason.TIMEOUT
        )
        try:
            await self._serve(send)
        except asyncio.CancelledError:
            # The server is tearing this task down: cut, and record it.
            self.cancel(RecordReason.SHUTDOWN)
            self._finish(None)
            raise
        finally:
            timer.cancel()
            watch.cancel()

    async def _watch_disconnect(self, receive: Receive) -> None:
        # The body was read: the next message is http.disconnect, delivered
        # when the connection is lost (or once the response is complete).
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.cancel(RecordReason.DISCONNECT)
                return

    async def _serve(self, send: Send) -> None:
        admission = self.proxy.admission
        if not await admission.enter(self.stopped):
            self._finish(None)
            await self._answer_cut(send, started=False)
            return
        self.admitted_at = time.monotonic()
        self.state = ExchangeState.UPSTREAM
        self.scope = self.proxy.lanes.take()
        channel = Channel(asyncio.get_running_loop())
        worker = asyncio.ensure_future(
            run_sync(
                self._relay,
                channel,
                scope=self.scope,
                unwind_timeout=self.proxy.config.unwind_timeout,
                executor=self.proxy.workers,
            )
        )
        self._worker = worker
        # A worker still running at the unwind bound never closes the
        # channel itself: the task's end does.
        worker.add_done_callback(lambda _: channel.close())
        if self.reason is not None:
            worker.cancel()  # Cut between the admission and the start.
        pump = asyncio.create_task(self._pump(channel, send))
        result: RelayResult | None = None
        unwind = None
        try:
            result = await worker
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                pump.cancel()
                raise  # Our own task is being torn down (serve() records it).
            unwind = unwind_of(exc)
            result = _result_of(unwind)
        except Interrupted:
            pass  # Cut before the worker took the request: nothing was sent.
        except Exception:
            _log.exception("the proxy failed relaying %s", self.id)
        if not self._relay_entered and (unwind is None or unwind.worker_exited):
            # The relay never ran and never will: its slot is ours to give back.
            self._release()
        self._finish(result)
        started = await pump
        await self._answer(send, result, started)

    def _relay(self, channel: Channel) -> RelayResult:
        """In the worker thread, with the scope bound."""
        self._relay_entered = True
        try:
            return relay(
                self.proxy.upstream,
                self.request.upstream,
                channel,
                self.tally,
                self.proxy.config.connect_retries,
            )
        finally:
            self.worker_exited_at = time.monotonic()
            channel.close()
            # The upstream socket is closed by now (the response's close, in
            # this thread): only now may the next request take the slot.
            self.proxy.call_soon(self._release)

    def _release(self) -> None:
        """Give the upstream slot back, once (event loop)."""
        if not self._released:
            self._released = True
            self.proxy.admission.leave()

    async def _pump(self, channel: Channel, send: Send) -> bool:
        """Forward the streamed pieces; True if the response headers went out."""
        started = False
        while (pieces := await channel.get()) is not None:
            for piece in pieces:
                if piece == HEAD:
                    await send_start(send, 200, "text/event-stream", self.id, _STREAM_HEADERS)
                    started = True
                elif started:
                    await send_body(send, piece, more=True)
        return started

    def _finish(self, result: RelayResult | None) -> None:
        """Write the record, once, from the relay's result (None: it never ran or returned)."""
        if self.state is ExchangeState.DONE:
            return
        self.state = ExchangeState.DONE
        complete = result is not None and result.outcome is Outcome.COMPLETE
        reason = self.reason
        if (
            not complete
            and result is not None
            and result.outcome
            in (
                Outcome.REFUSED,
                Outcome.FAILED,
            )
        ):
            reason = RecordReason.UPSTREAM if reason is None else reason
        admitted = self.admitted_at or time.monotonic()
        self.record = ProxyRecord.build(
            id=self.id,
            model=self.tally.model or self.request.model,
            stream=self.request.stream,
            complete=complete,
            reason=reason,
            usage=self.tally.usage(),
            queued_ms=(admitted - self.arrived_at) * 1000,
            scope=self.scope,
            worker_exited_at=self.worker_exited_at,
        )
        if self.worker_exited_at is not None:
            # Done with it (cancel() no longer touches a DONE request's scope).
            self.proxy.lanes.give_back(self.scope)
        self.proxy.finished(self)
        self.finished.set()

    async def _answer(self, send: Send, result: RelayResult | None, started: bool) -> None:
        """The end of the client's response, by outcome."""
        if result is not None and result.outcome is Outcome.COMPLETE:
            if started:
                await send_body(send, b"")
            else:
                await send_json(send, 200, result.body, self.id)
            return
        if result is None or result.outcome is Outcome.CUT:
            await self._answer_cut(send, started)
            return
        if result.outcome is Outcome.REFUSED and not started:
            await send_json(send, result.status_code, result.body, self.id, result.content_type)
            return
        message = result.error or "the upstream failed"
        if started:
            if not result.told_client:
                await send_body(send, error_event(message, "upstream_error"), more=True)
            await send_body(send, b"")
        elif result.body:
            await send_json(send, 502, result.body, self.id)
        else:
            await send_json(send, 502, error_body(message, "upstream_error"), self.id)

    async def _answer_cut(self, send: Send, started: bool) -> None:
        if self.reason is None:
            # Nobody cut it and the relay gave nothing back: the proxy's own failure.
            message = "the proxy failed relaying this request; see its log"
            if started:
                await send_body(send, error_event(message, "server_error"), more=True)
                await send_body(send, b"")
            else:
                await send_json(send, 500, error_body(message, "server_error"), self.id)
            return
        answer = _CUT_ANSWERS.get(self.reason)
        if answer is None:
            # The client left: nobody to answer. uvicorn drops what we send.
            if started:
                await send_body(send, b"")
            return
        status, type_, message = answer
        if started:
            await send_body(send, error_event(message, type_, type_), more=True)
            await send_body(send, b"")
        else:
            await send_json(send, status, error_body(message, type_, code=type_), self.id)


_STREAM_HEADERS = {"cache-control": "no-cache"}


def _result_of(unwind: Unwind | None) -> RelayResult | None:
    """The relay's result if its thread returned one by the unwind bound."""
    if unwind is None:
        return None
    future = unwind.future
    if not future.done() or future.cancelled() or future.exception() is not None:
        return None
    result = future.result()
    return result if isinstance(result, RelayResult) else None
