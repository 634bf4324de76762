"""``relay``: one request to the upstream, read to its end or to the cut, on the event loop.

Runs as a task of its own, under the request's scope: the upstream socket is
registered with that scope, so a cut (the client left, a cancel, the
timeout) shuts it down, the upstream sees the close at once, and the read
ends with ``Interrupted``; the exchange also cancels the task, which ends a
wait on the client (a client that does not read) or on a retry's pause.

The request always streams on the wire. A streaming client gets each event
as it arrives (``Downstream``), only as fast as it reads: the upstream's
socket is not read while a send to the client waits, so nothing piles up in
the proxy. A client that asked for no stream gets the answer that the API's
assembler builds from the same events, in the ``RelayResult``. What an
event means is the API's (``Dialect``): the stream's end is ``[DONE]`` for
chat and text completions, the API's own last event for the Responses and
Messages APIs; the request ends there, whatever the upstream does after it
(its connection is kept only if its body ended cleanly too). Every byte of
the answer is also kept (``Tally.transcript``), by reference, for counting
it in tokens should the upstream never say its usage.

Retries: only before the upstream has the request. A connect that fails (no
byte of the request went out) is tried again, ``connect_retries`` times at
most, after a short pause; an error status, a broken stream or anything
after the request went out is never retried, and nothing is retried once
cut (the task is cancelled, and the scope refuses to connect).
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from starlette.types import Send

from wirecut._json import JSONError, loads
from wirecut.provider import ResponseLimits
from wirecut.proxy._dialects import Dialect, Endpoint, Look, dialect_of
from wirecut.proxy._eager import EagerSender
from wirecut.proxy._events import (
    DONE,
    DONE_BLOCK,
    EventSplitter,
    EventTooLarge,
    dumps,
    encode,
    parse_block,
)
from wirecut.proxy._tally import Tally
from wirecut.proxy._upstream import BodyTooLarge, Upstream, read_bounded
from wirecut.scope import Interrupted, InterruptScope

__all__ = [
    "ERROR_BODY_LIMIT",
    "Downstream",
    "Outcome",
    "RelayResult",
    "UpstreamRequest",
    "relay",
]

#: How much of an upstream's error body is passed to the client.
ERROR_BODY_LIMIT = 64 * 1024
#: Pause before connect retry n (0-based): RETRY_PAUSE * 2**n seconds.
RETRY_PAUSE = 0.1

_DONE_EVENT = b"data: [DONE]\n\n"
_BODY = "http.response.body"


class Outcome(enum.Enum):
    """How a relay ended."""

    COMPLETE = "complete"  # the answer arrived whole
    CUT = "cut"  # the scope cut it; the exchange knows why
    REFUSED = "refused"  # the upstream answered an error status: passed on as it is
    FAILED = "failed"  # no connection, or the upstream broke off, said error, or sent too much


@dataclass
class RelayResult:
    """What the relay hands back to the exchange.

    ``body``: the non-stream answer (COMPLETE), the upstream's error body
    (REFUSED, at most ``ERROR_BODY_LIMIT`` bytes) or its error event
    (FAILED); ``error``: one line saying what failed; ``told_client``: a
    streaming client already got the upstream's own error event.
    """

    outcome: Outcome
    status_code: int = 200
    content_type: str = "application/json"
    body: bytes = b""
    error: str | None = None
    told_client: bool = False


@dataclass(frozen=True)
class UpstreamRequest:
    """One client request, ready for the upstream (``body`` already asks for a stream)."""

    id: str
    endpoint: Endpoint
    body: bytes
    stream: bool  # the client asked for a stream
    include_usage: bool  # the client asked for the usage chunk (stream_options)
    choices: int = 1  # how many choices the client asked for (n)
    #: Request headers passed on as they came (Anthropic's version and beta flags).
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def dialect(self) -> Dialect:
        return dialect_of(self.endpoint)


class Downstream(Protocol):
    """The client's side of a streamed answer: ``start()`` sends the head, then ``send``."""

    #: The client's ASGI ``send``, for ``http.response.body`` messages once started.
    send: Send

    async def start(self) -> None:
        """Send the response head (200, an event stream)."""


async def relay(
    upstream: Upstream,
    request: UpstreamRequest,
    tally: Tally,
    scope: InterruptScope,
    downstream: Downstream,
    *,
    connect_retries: int,
    limits: ResponseLimits,
) -> RelayResult:
    """Send ``request`` upstream and relay its answer; see the module docstring.

    Returns a ``RelayResult`` in every case a cut, the upstream or the
    network can cause; raises only for a bug.

    Cancellation: a cancel of the task passes through (``CancelledError``),
    with the upstream connection shut down and closed on the way out.
    """

    def sent() -> None:
        if not state.sent:
            state.sent = True
            tally.requests += 1
            if scope.cancelled:
                # Counted, never hidden: it should not happen (the scope refuses
                # to start a cut request, and shuts down one that is connecting).
                tally.sent_after_cut = True

    state = _Sent()
    headers = [
        *upstream.headers,
        ("Content-Type", "application/json"),
        ("Accept", "text/event-stream"),
        ("X-Request-Id", request.id),
        *request.headers,
    ]
    target = upstream.target(request.endpoint)
    try:
        for attempt in range(connect_retries + 1):
            try:
                response = await upstream.client.send(
                    "POST", target, headers, request.body, scope=scope, on_sent=sent
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if state.sent or attempt == connect_retries:
                    return RelayResult(
                        Outcome.FAILED,
                        error=f"cannot connect to the upstream {upstream.base_url}: {exc}",
                    )
                await asyncio.sleep(RETRY_PAUSE * 2**attempt)
                continue
            except httpx.HTTPError as exc:
                return RelayResult(
                    Outcome.FAILED, error=f"lost the upstream {upstream.base_url}: {exc}"
                )
            try:
                return await _read(response, request, tally, downstream, limits)
            except httpx.HTTPError as exc:
                return RelayResult(
                    Outcome.FAILED, error=f"the upstream connection broke: {type(exc).__name__}"
                )
            except (BodyTooLarge, EventTooLarge) as exc:
                return RelayResult(Outcome.FAILED, error=str(exc))
            finally:
                response.close()
    except Interrupted:
        return RelayResult(Outcome.CUT)
    raise AssertionError("unreachable")  # pragma: no cover


class _Sent:
    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False


async def _read(
    response: Any,
    request: UpstreamRequest,
    tally: Tally,
    downstream: Downstream,
    limits: ResponseLimits,
) -> RelayResult:
    content_type = (response.header(b"content-type") or b"").decode("latin-1")
    if response.status_code >= 400:
        try:
            body = await read_bounded(response, ERROR_BODY_LIMIT, "the error body")
        except BodyTooLarge:
            body = b""
        return RelayResult(
            Outcome.REFUSED,
            status_code=response.status_code,
            content_type=content_type or "application/json",
            body=body,
            error=f"the upstream answered HTTP {response.status_code}",
        )
    if "text/event-stream" not in content_type:
        # An upstream that ignored "stream": true answered whole.
        raw = await read_bounded(response, limits.body_bytes, "the upstream's answer")
        return await _whole(raw, request, tally, downstream)
    if request.stream:
        return await _stream(response, request, tally, downstream, limits)
    return await _assemble(response, request, tally, limits)


async def _stream(
    response: Any,
    request: UpstreamRequest,
    tally: Tally,
    downstream: Downstream,
    limits: ResponseLimits,
) -> RelayResult:
    """Relay the events to a streaming client, looking at each only as much as needed.

    The events are taken in the upstream connection's read callback
    (``AsyncH1Response.deliver``) and sent on at once (``EagerSender``): a
    relayed token wakes no task. While the client does not take what was
    sent, the upstream is not read.
    """
    await downstream.start()
    relay = _StreamRelay(response, request, tally, downstream.send, limits.line_bytes)
    body_ended = response.deliver(relay.on_body)
    try:
        await asyncio.wait((body_ended, relay.ended), return_when=asyncio.FIRST_COMPLETED)
        if not relay.ended.done():
            body_ended.result()  # The upstream's error, or the cut (Interrupted).
            relay.end_of_body()
        result = relay.ended.result()
        await relay.sender.drain()
        return result
    finally:
        relay.sender.close()


class _StreamRelay:
    """The events of one stream, taken as they arrive and pushed to the client."""

    def __init__(
        self,
        response: Any,
        request: UpstreamRequest,
        tally: Tally,
        send: Send,
        most: int,
    ) -> None:
        self.request = request
        self.dialect = request.dialect
        self.tally = tally
        self.most = most
        self.sender = EagerSender(send, response.pause_reading, response.resume_reading)
        self.ended: asyncio.Future[RelayResult] = asyncio.get_running_loop().create_future()
        self._rest = b""  # an event begun in one read and not ended yet
        self._first = True  # The first event is parsed whole: it names the model.

    def _push(self, body: bytes) -> None:
        self.sender.push({"type": _BODY, "body": body, "more_body": True})

    def _end(self, result: RelayResult) -> None:
        if not self.ended.done():
            self.ended.set_result(result)

    def on_body(self, data: bytes) -> None:
        """Take what one read brought (the upstream connection's read callback).

        It runs once per read of the upstream socket (a token, or a burst of
        them): it is what a relayed token costs, so it stays flat. A read
        made only of events that need no parse (the usual token) goes to the
        client as the very bytes that came.
        """
        if self.ended.done():
            return
        tally = self.tally
        tally.transcript.feed(data)
        rest = self._rest
        buffer = rest + data if rest else data
        if b"\r" in buffer:
            # A CR kept at the end waits for its LF in the next piece.
            buffer = buffer.replace(b"\r\n", b"\n")
        blocks = buffer.split(b"\n\n")
        self._rest = rest = blocks.pop()
        if len(rest) > self.most:
            self._end(
                RelayResult(
                    Outcome.FAILED,
                    error=f"an event of the upstream's stream exceeds {self.most} bytes",
                )
            )
            return
        if not blocks:
            return
        whole = not rest and buffer is data  # Sent as it came, if nothing below objects.
        out: list[bytes] = []
        fast, deltas = self.dialect.fast, tally.deltas
        try:
            for block in blocks:
                if block == DONE_BLOCK:
                    out.append(DONE_BLOCK)
                    self._push(_joined(out))
                    self._end(self._done())
                    return
                if not self._first and fast(block, tally):
                    out.append(block)
                    continue
                self._first = False
                ended = _look_closer(block, self.request, tally, out)
                if ended is not None:
                    if out:
                        self._push(_joined(out))
                    self._end(ended)
                    return
                whole = False
            if out:
                self._push(data if whole and len(out) == len(blocks) else _joined(out))
        finally:
            if tally.deltas != deltas:
                tally.first_token()

    def _done(self) -> RelayResult:
        if self.dialect.done_is_whole(self.tally, self.request.choices):
            return RelayResult(Outcome.COMPLETE)
        return RelayResult(Outcome.FAILED, error=_ENDED_EARLY)

    def end_of_body(self) -> None:
        """The upstream's body ended without its last event: take the event it left open, if any."""
        rest = self._rest.strip(b"\r\n")
        out: list[bytes] = []
        if rest:
            ended = _look_closer(rest, self.request, self.tally, out)
            if out:
                self._push(_joined(out))
            if ended is not None:
                self._end(ended)
                return
        if not self.dialect.whole(self.tally, self.request.choices):
            self._end(RelayResult(Outcome.FAILED, error=_ENDED_EARLY))
            return
        if self.request.endpoint in (Endpoint.CHAT, Endpoint.TEXT):
            # Finished without [DONE]: the client still gets its end.
            self._push(_DONE_EVENT)
        self._end(RelayResult(Outcome.COMPLETE))


def _joined(blocks: list[bytes]) -> bytes:
    """Events on the wire, from their blocks (each without its blank line)."""
    return b"\n\n".join(blocks) + b"\n\n"


def _look_closer(
    block: bytes, request: UpstreamRequest, tally: Tally, out: list[bytes]
) -> RelayResult | None:
    """Parse one event; append the block the client gets to ``out``; a result if it ends."""
    event = parse_block(block)
    if event is None:
        return None  # A comment, or an event without data: nothing to pass on.
    name, payload = event
    if payload == DONE:
        out.append(DONE_BLOCK)
        if request.dialect.done_is_whole(tally, request.choices):
            return RelayResult(Outcome.COMPLETE)
        return RelayResult(Outcome.FAILED, error=_ENDED_EARLY)
    wire = encode(name, payload)[:-2]
    chunk = _chunk(payload)
    if chunk is _TOO_DEEP:
        return RelayResult(Outcome.FAILED, error="the upstream sent an event nested too deeply")
    if not isinstance(chunk, dict):
        out.append(wire)
        return None
    before = tally.deltas
    look = request.dialect.look(
        None if name is None else name.decode("latin-1"), chunk, not request.include_usage, tally
    )
    if tally.deltas != before:
        tally.first_token()
    if look is Look.HIDE:
        return None
    out.append(wire)
    if look is Look.FAILED:
        return _error_event(payload, chunk, told_client=True)
    if look is Look.COMPLETE:
        return RelayResult(Outcome.COMPLETE)
    return None


async def _assemble(
    response: Any, request: UpstreamRequest, tally: Tally, limits: ResponseLimits
) -> RelayResult:
    """Build the whole answer for a client that asked for no stream."""
    dialect = request.dialect
    assembler = dialect.assembler()
    splitter = EventSplitter(limits.line_bytes)
    size = 0
    while True:
        data = await response.receive()
        if data:
            tally.transcript.feed(data)
        for name, payload, _ in splitter.feed(data) if data else splitter.end():
            if payload == DONE:
                if not dialect.done_is_whole(tally, request.choices):
                    return RelayResult(Outcome.FAILED, error=_ENDED_EARLY)
                return RelayResult(Outcome.COMPLETE, body=dumps(assembler.result()))
            size += len(payload)
            if size > limits.body_bytes:
                return RelayResult(
                    Outcome.FAILED,
                    error=f"the upstream's answer exceeds the {limits.body_bytes} bytes allowed",
                )
            chunk = _chunk(payload)
            if chunk is _TOO_DEEP:
                return RelayResult(
                    Outcome.FAILED, error="the upstream sent an event nested too deeply"
                )
            if not isinstance(chunk, dict):
                continue
            kind = None if name is None else name.decode("latin-1")
            before = tally.deltas
            look = dialect.look(kind, chunk, True, tally)
            if tally.deltas != before:
                tally.first_token()
            if look is Look.FAILED:
                return _error_event(payload, chunk, told_client=False)
            assembler.add(kind or str(chunk.get("type") or ""), chunk)
            if look is Look.COMPLETE:
                return RelayResult(Outcome.COMPLETE, body=dumps(assembler.result()))
        if not data:
            break
    if not dialect.whole(tally, request.choices):
        return RelayResult(Outcome.FAILED, error=_ENDED_EARLY)
    return RelayResult(Outcome.COMPLETE, body=dumps(assembler.result()))


_ENDED_EARLY = "the upstream's stream ended before its last event or a finish for every choice"
_TOO_DEEP = object()


def _chunk(payload: bytes) -> Any:
    """The parsed event (None if it is no JSON; ``_TOO_DEEP`` if it nests past the bound)."""
    try:
        return loads(payload)
    except JSONError as exc:
        return _TOO_DEEP if "nested" in str(exc) else None


def _error_event(payload: bytes, chunk: Any, *, told_client: bool) -> RelayResult:
    return RelayResult(
        Outcome.FAILED,
        status_code=502,
        body=payload if isinstance(chunk, dict) else b"",
        error=f"the upstream sent an error event: {payload[:200]!r}",
        told_client=told_client,
    )


async def _whole(
    raw: bytes, request: UpstreamRequest, tally: Tally, downstream: Downstream
) -> RelayResult:
    """An answer the upstream sent unstreamed: count it, and stream it if the client asked."""
    try:
        answer = loads(raw)
    except JSONError:
        return RelayResult(Outcome.FAILED, error=f"the upstream answered no JSON: {raw[:200]!r}")
    dialect = request.dialect
    if not dialect.look_whole(answer, tally):
        return RelayResult(
            Outcome.FAILED, error=f"the upstream answered no {request.endpoint}: {raw[:200]!r}"
        )
    if tally.deltas:
        tally.first_token()
    if dialect.whole_failed(answer):
        return RelayResult(
            Outcome.FAILED,
            status_code=502,
            body=raw,
            error=f"the upstream's answer says it failed: {raw[:200]!r}",
        )
    if not request.stream:
        return RelayResult(Outcome.COMPLETE, body=raw)
    await downstream.start()
    events = dialect.whole_events(answer, request.include_usage)
    await downstream.send({"type": _BODY, "body": events, "more_body": True})
    return RelayResult(Outcome.COMPLETE)
