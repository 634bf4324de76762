"""``Exchange``: one proxied completion, from its arrival to its record.

Its life is the transition table of ``_lifecycle``: QUEUED (in the proxy's
FIFO) -> UPSTREAM (its relay task at the upstream) -> DONE (its record
written), through UNWINDING when it is cut. ``cancel(reason)`` is the one way
a request is cut, whoever asks (the client leaving, ``POST
/v1/requests/{id}/cancel``, the timeout, the proxy stopping): the first
reason wins, and a cancel of a finished request does nothing.

The cut, by phase:

- queued: it leaves the FIFO and never reaches the upstream;
- at the upstream (connecting, prompt, decoding, or waiting for the client
  to take what was relayed): the scope shuts the upstream socket down (the
  upstream sees the close at once) and the relay task is cancelled; the
  record is written when the task has ended, with the upstream connection
  closed, and only then is the upstream slot given back.

A streamed answer is relayed by the relay task itself, as fast as the client
reads it: the request stays live (and cancellable by id, and bound by its
timeout) until the upstream's answer has been handed to the client's
connection.

The record's status is decided when the relay ends (``FINISH``); its usage
may still need counting (the upstream never said it: ``_usage.bill``), which
a task of its own does after the cut and the relay's end, bounded, while
the client gets its answer; the record is written then. Nothing is counted
on a request's way.

Event loop only. What the exchange needs of the proxy comes in the
constructor (``ExchangeContext``), never by reaching into it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import Receive, Send

from wirecut.provider import ResponseLimits
from wirecut.proxy._admission import Admission
from wirecut.proxy._counting import TokenCounter
from wirecut.proxy._lifecycle import ExchangeEvent, ExchangeLifecycle, ExchangeState
from wirecut.proxy._record import ProxyRecord, RecordReason
from wirecut.proxy._relay import Outcome, RelayResult, relay
from wirecut.proxy._request import ClientRequest
from wirecut.proxy._tally import Tally
from wirecut.proxy._upstream import Upstream
from wirecut.proxy._usage import bill, by_chunks, reported
from wirecut.proxy._wire import FINAL, send_body, send_json, send_start
from wirecut.scope import InterruptScope

__all__ = ["Exchange", "ExchangeContext", "ExchangeState"]

_log = logging.getLogger("wirecut.proxy")

# What a client still connected gets when its request was cut: the HTTP
# status (499 is gRPC's and nginx's "cancelled by the client's side"), the
# error type and a message. A timeout and a cancel by id are final: an SDK
# must not send the request again (``FINAL``); a stopping proxy's 503 may be.
_CUT_ANSWERS = {
    RecordReason.CANCEL: (499, "cancelled", "the request was cancelled by id"),
    RecordReason.TIMEOUT: (504, "timeout", "the request took longer than --request-timeout"),
    RecordReason.SHUTDOWN: (503, "unavailable", "the proxy is stopping"),
}
_STREAM_HEADERS = {"cache-control": "no-cache"}


@dataclass(frozen=True)
class ExchangeContext:
    """What an exchange needs of the proxy that runs it (one per upstream)."""

    upstream: Upstream
    admission: Admission
    request_timeout: float
    connect_retries: int
    limits: ResponseLimits
    #: Called once with the exchange when its record is complete (it writes and counts it).
    finished: Callable[[Exchange], None]
    #: The upstream's tokenizer, asked when a record needs counting (None: it has none).
    counter: Callable[[], TokenCounter | None] = lambda: None
    #: Parses a request body again (for its prompt), off the loop when it is large.
    load: Callable[[bytes], Awaitable[dict[str, Any] | None]] | None = None


class _Downstream:
    """The client's side of a streamed answer: the ASGI ``send``, and whether it began."""

    __slots__ = ("_id", "send", "started")

    def __init__(self, send: Send, request_id: str) -> None:
        self.send = send
        self._id = request_id
        self.started = False

    async def start(self) -> None:
        await send_start(self.send, 200, "text/event-stream", self._id, _STREAM_HEADERS)
        self.started = True


class Exchange:
    """One proxied completion request. Event loop only (see the module docstring)."""

    def __init__(
        self,
        context: ExchangeContext,
        request_id: str,
        request: ClientRequest,
        *,
        key: str | None = None,
    ) -> None:
        self._context = context
        self.id = request_id
        self.request = request
        self.key = key
        self.dialect = request.upstream.dialect
        self.scope = InterruptScope(f"proxy-{request_id}")
        self.lifecycle = ExchangeLifecycle(request_id)
        self.reason: RecordReason | None = None
        #: The record once it is complete (its usage counted), when ``finished`` is set.
        self.record: ProxyRecord | None = None
        self.tally = Tally(self.dialect.texts)
        self.arrived_at = time.monotonic()
        self.arrived_wall = time.time()
        self.admitted_at: float | None = None
        self.worker_exited_at: float | None = None  # the relay task ended
        self.finished = asyncio.Event()
        # Set by cancel(): ends the wait in the FIFO.
        self._stopped = asyncio.Event()
        self._relay: asyncio.Task[RelayResult] | None = None
        self._decided: ProxyRecord | None = None  # the record, its usage not counted yet
        self._recording: asyncio.Task[None] | None = None

    @property
    def upstream(self) -> Upstream:
        return self._context.upstream

    @property
    def state(self) -> ExchangeState:
        return self.lifecycle.state

    def cancel(self, reason: RecordReason) -> bool:
        """Cut this request for ``reason``; False if it was cut already or is done.

        Never blocks: the FIFO wait wakes, the scope shuts the upstream
        socket down, and the relay task is cancelled.
        """
        old, new = self.lifecycle.fire(ExchangeEvent.CANCEL)
        if old is new:
            return False  # Cut already (the first reason stays), or done.
        self.reason = reason
        self._stopped.set()
        self.scope.cancel(str(reason))
        if self._relay is not None:
            self._relay.cancel()
        return True

    async def serve(self, receive: Receive, send: Send) -> None:
        """Run the request to its end and answer the client; the record is written on the way."""
        loop = asyncio.get_running_loop()
        watch = asyncio.create_task(self._watch_disconnect(receive))
        timer = loop.call_later(self._context.request_timeout, self.cancel, RecordReason.TIMEOUT)
        try:
            await self._serve(send)
        except asyncio.CancelledError:
            # The server is tearing this task down: cut, and record it now
            # (no counting: the loop is stopping).
            self.cancel(RecordReason.SHUTDOWN)
            if self._decide(None):
                assert self._decided is not None
                self._write(self._decided)
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
        context = self._context
        if not await context.admission.enter(self._stopped):
            self._finish(None)
            await self._answer_cut(send, started=False)
            return
        self.lifecycle.fire(ExchangeEvent.ADMIT)
        self.admitted_at = time.monotonic()
        downstream = _Downstream(send, self.id)
        task = asyncio.create_task(self._run_relay(downstream))
        self._relay = task
        result: RelayResult | None = None
        try:
            result = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                task.cancel()
                raise  # Our own task is being torn down (serve() records it).
            result = RelayResult(Outcome.CUT)
        except Exception:
            _log.exception("the proxy failed relaying %s", self.id)
        finally:
            if task.done():
                # The upstream connection is closed or back in the pool: only
                # now may the next request take the slot.
                context.admission.leave()
            else:
                task.add_done_callback(lambda _: context.admission.leave())
        self._finish(result)
        await self._answer(send, result, downstream.started)

    async def _run_relay(self, downstream: _Downstream) -> RelayResult:
        context = self._context
        try:
            return await relay(
                context.upstream,
                self.request.upstream,
                self.tally,
                self.scope,
                downstream,
                connect_retries=context.connect_retries,
                limits=context.limits,
            )
        finally:
            self.worker_exited_at = time.monotonic()

    def _finish(self, result: RelayResult | None) -> None:
        """Decide the record, and have its usage counted and it written (a task of its own)."""
        if self._decide(result):
            self._recording = asyncio.create_task(self._record(), name=f"wirecut-record-{self.id}")

    async def _record(self) -> None:
        """Count the usage if the upstream did not say it (bounded), then write the record."""
        assert self._decided is not None
        usage = reported(self.tally)
        if usage is None:
            context = self._context
            try:
                usage = await bill(
                    self.tally,
                    self.request.upstream,
                    context.counter(),
                    context.load or _no_body,
                )
            except Exception:  # A bug of ours must not lose the record.
                _log.exception("the proxy failed counting the usage of %s", self.id)
                usage = by_chunks(self.tally)
        self._write(self._decided.with_usage(usage))

    def _write(self, record: ProxyRecord) -> None:
        self.record = record
        self._context.finished(self)
        self.finished.set()

    def _decide(self, result: RelayResult | None) -> bool:
        """Decide the record, once, from the relay's result (None: it never ran or returned).

        False if it was decided already. The usage is the upstream's, or
        counted by chunks until ``_record`` counts it better.
        """
        old, _ = self.lifecycle.fire(ExchangeEvent.FINISH)
        if old is ExchangeState.DONE:
            return False
        now = time.monotonic()
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
        admitted = self.admitted_at or now
        first = self.tally.first_token_at
        self._decided = ProxyRecord.build(
            id=self.id,
            model=self.tally.model or self.request.model,
            stream=self.request.stream,
            complete=complete,
            reason=reason,
            usage=by_chunks(self.tally),
            queued_ms=(admitted - self.arrived_at) * 1000,
            scope=self.scope,
            worker_exited_at=self.worker_exited_at,
            route=self.request.endpoint.route,
            key=self.key,
            upstream=self._context.upstream.base_url,
            arrived_wall=self.arrived_wall,
            duration_ms=(now - self.arrived_at) * 1000,
            ttft_ms=None if first is None else (first - self.arrived_at) * 1000,
        )
        return True

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
        dialect = self.dialect
        if started:
            if not result.told_client:
                await send_body(send, dialect.error_event(message, "upstream_error"), more=True)
            await send_body(send, b"")
        elif result.body:
            await send_json(send, 502, result.body, self.id)
        else:
            await send_json(send, 502, dialect.error_body(message, "upstream_error"), self.id)

    async def _answer_cut(self, send: Send, started: bool) -> None:
        dialect = self.dialect
        if self.reason is None:
            # Nobody cut it and the relay gave nothing back: the proxy's own failure.
            message = "the proxy failed relaying this request; see its log"
            if started:
                await send_body(send, dialect.error_event(message, "server_error"), more=True)
                await send_body(send, b"")
            else:
                await send_json(send, 500, dialect.error_body(message, "server_error"), self.id)
            return
        answer = _CUT_ANSWERS.get(self.reason)
        if answer is None:
            # The client left: nobody to answer. uvicorn drops what we send.
            if started:
                await send_body(send, b"")
            return
        status, type_, message = answer
        if started:
            await send_body(send, dialect.error_event(message, type_, type_), more=True)
            await send_body(send, b"")
        else:
            extra = None if self.reason is RecordReason.SHUTDOWN else FINAL
            body = dialect.error_body(message, type_, code=type_)
            await send_json(send, status, body, self.id, extra=extra)


async def _no_body(raw: bytes) -> dict[str, Any] | None:
    return None
