"""One generation request, from queue to last token, as llama.cpp serves it.

``CompletionResponse`` is the ASGI response that the app returns for a valid
request of any generation route. It runs on the server's event loop, and it
owns the whole life of the request: wait for a slot (FIFO), process the
prompt (``prompt_ms``, or in batches at ``prompt_tokens_per_second``),
decode at ``tokens_per_second``, stream or answer at the end, free the
slot. What goes on the wire is the route's ``Wire``'s business; a token
that is part of a multi-byte character is decoded but sends nothing until
the character is whole (``TextJoiner``), as llama.cpp holds back incomplete
UTF-8.

Peer close: a watcher task reads ``receive()`` until ``http.disconnect``. The
decode loop looks at what it saw at each token and before each write, like
llama.cpp, which notices a dead client only when it tries to send; the
prompt phase looks at it between its batches only. A request
still in the queue stops waiting at once: a client that left never takes a
slot (llama.cpp #13262 lets it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from wirecut.simulator import _openai_format as fmt
from wirecut.simulator._config import SimConfig
from wirecut.simulator._events import EventKind, EventLog
from wirecut.simulator._pieces import Piece, TextJoiner, text_pieces
from wirecut.simulator._request import GenerationRequest
from wirecut.simulator._requests import RequestLedger, RequestState
from wirecut.simulator._script import ScriptedReply
from wirecut.simulator._slots import Slot, SlotPool
from wirecut.simulator._wire import ErrorBody, Finish, Usage, Wire
from wirecut.simulator._words import word_stream

__all__ = ["CompletionResponse", "Runtime", "WireFactory"]

#: Builds a response's ``Wire`` from its request id, model and creation time.
WireFactory = Callable[[str, str, int], Wire]

_log = logging.getLogger("wirecut.simulator")


@dataclass(slots=True)
class Runtime:
    """What every completion shares: the knobs, the slots, the records.

    Touched from the event loop, except ``events`` and ``ledger`` which are
    thread-safe for readers.
    """

    config: SimConfig
    pool: SlotPool
    ledger: RequestLedger
    events: EventLog
    # Set once, on the event loop, when the server starts shutting down.
    shutting_down: bool = False
    # One event per running completion, set on shutdown so that a completion
    # asleep between tokens stops at once instead of holding uvicorn's exit.
    active: set[asyncio.Event] = field(default_factory=set)


class _PeerClosed(Exception):
    """The client is gone; ``where`` says in which phase it was noticed."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


class _Aborted(Exception):
    """The simulator is shutting down under this request."""


class CompletionResponse(Response):
    """Serve one accepted generation request (stream or not). Event loop only.

    ``make_wire`` encodes the reply for the request's route; ``error_body``
    shapes the error a failure or a shutdown answers with.
    """

    def __init__(
        self,
        runtime: Runtime,
        request: GenerationRequest,
        scripted: ScriptedReply | None,
        client: str | None,
        make_wire: WireFactory,
        error_body: ErrorBody,
    ) -> None:
        # Deliberately not calling Response.__init__: there is no fixed body.
        self._rt = runtime
        self._request = request
        self._scripted = scripted
        self._client = client
        self._make_wire = make_wire
        self._error_body = error_body
        self.status_code = 200
        self.background = None
        self._peer_gone_at: float | None = None
        # The slot this request holds, once it has one; _serve frees it.
        self._slot: Slot | None = None
        # Set by _finish: the request_finished event is logged.
        self._finished = False
        # How far the response got: headers sent, last body part sent.
        self._response_started = False
        self._response_complete = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()
        stop = asyncio.Event()
        self._rt.active.add(stop)
        if self._rt.shutting_down:
            stop.set()
        watcher = asyncio.create_task(self._watch_disconnect(receive, gone))
        try:
            await self._serve(self._tracking(send), gone, stop)
        finally:
            self._rt.active.discard(stop)
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    def _tracking(self, send: Send) -> Send:
        """``send``, noting how far the response got (for the answer to a failure)."""

        async def tracked(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.start":
                self._response_started = True
            elif not message.get("more_body", False):
                self._response_complete = True

        return tracked

    async def _watch_disconnect(self, receive: Receive, gone: asyncio.Event) -> None:
        # The body was already read, so the next message is http.disconnect:
        # uvicorn delivers it when the connection is lost (FIN or RST).
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._peer_gone_at = time.monotonic()
                gone.set()
                return

    async def _serve(self, send: Send, gone: asyncio.Event, stop: asyncio.Event) -> None:
        rt, req = self._rt, self._request
        request_id = rt.ledger.open(req.stream, req.api.value)
        rt.events.append(
            EventKind.REQUEST_RECEIVED,
            request_id,
            route=req.api.value,
            stream=req.stream,
            client=self._client,
            scripted=self._scripted is not None,
            max_tokens=req.max_tokens,
        )
        try:
            await self._respond(request_id, send, gone, stop)
        except Exception:
            # A bug of the simulator's own. The request ends in the log, and
            # the client is told in the OpenAI error shape (or, with the
            # stream's headers out, by a stream cut short), never left hanging.
            _log.exception("the simulator failed serving %s", request_id)
            self._finish_failed(request_id)
            with contextlib.suppress(Exception):
                await self._answer_failure(send)
        finally:
            # Whatever ended it (a failure, a cancelled task), every request
            # ends with request_finished, and before its slot is freed.
            self._finish_failed(request_id)
            if self._slot is not None:
                rt.pool.release(self._slot)
                rt.events.append(EventKind.SLOT_FREED, request_id, slot=self._slot.id)

    async def _respond(
        self, request_id: str, send: Send, gone: asyncio.Event, stop: asyncio.Event
    ) -> None:
        rt, req = self._rt, self._request
        headers = {"x-request-id": request_id}
        if req.stream:
            # Headers go out at once, as llama.cpp's chunked provider does.
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": _raw_headers(
                        {
                            **headers,
                            "content-type": "text/event-stream",
                            "cache-control": "no-cache",
                        }
                    ),
                }
            )

        slot = rt.pool.try_acquire(request_id)
        if slot is None:
            rt.events.append(
                EventKind.REQUEST_QUEUED, request_id, position=rt.pool.queue_length + 1
            )
            # While queued, the client's leaving must not wait for a token: there is none.
            slot = await rt.pool.acquire(request_id, gone)
            if slot is None:
                if self._peer_gone_at is not None:
                    self._finish_peer_closed(request_id, "queue", 0)
                else:
                    self._finish(request_id, RequestState.ABORTED, "shutdown", 0)
                    await self._end_body(send, req.stream)
                return
        # From here on _serve frees it, whatever happens.
        self._slot = slot

        rt.ledger.move(request_id, RequestState.PROMPT, slot=slot.id)
        rt.events.append(EventKind.SLOT_ACQUIRED, request_id, slot=slot.id)
        try:
            await self._decode(request_id, slot, send, stop, headers)
        except _PeerClosed as closed:
            self._finish_peer_closed(request_id, closed.where, slot.n_decoded)
        except OSError:
            # ASGI 2.4 servers report a dead peer by raising from send() instead.
            self._finish_peer_closed(request_id, "decode", slot.n_decoded)
        except _Aborted:
            self._finish(request_id, RequestState.ABORTED, "shutdown", slot.n_decoded)
            await self._end_body(send, req.stream)

    async def _answer_failure(self, send: Send) -> None:
        if self._response_complete:
            return
        if self._response_started:
            # A stream whose headers are out ends without [DONE]: a cut reply.
            await send(_body(b"", more=False))
            return
        error = self._error_body("the simulator failed; see its log", "server_error", None)
        await _send_json(send, error, {}, status=500)

    async def _end_body(self, send: Send, started: bool) -> None:
        # A stream whose headers are out ends without its last events: a cut reply.
        if started:
            await send(_body(b"", more=False))
            return
        error = self._error_body("the simulator is shutting down", "server_error", None)
        await _send_json(send, error, {}, status=503)

    async def _decode(
        self,
        request_id: str,
        slot: Slot,
        send: Send,
        stop: asyncio.Event,
        headers: dict[str, str],
    ) -> None:
        rt, req, cfg = self._rt, self._request, self._rt.config
        pieces, limit, natural_end = self._plan()
        wire = self._make_wire(request_id, req.model or cfg.model, int(time.time()))
        joiner = TextJoiner()

        await self._process_prompt(request_id, slot, stop)
        t_first = time.monotonic()
        produced: list[Piece] = []
        n = 0
        for piece in itertools.islice(pieces, limit):
            self._check("prompt" if n == 0 else "decode")
            if n > 0:
                # Absolute deadlines: the rate does not drift with scheduling delays.
                await _sleep(t_first + n * cfg.token_interval - time.monotonic(), stop)
                self._check("decode")
            n += 1
            if n == 1:
                rt.ledger.move(request_id, RequestState.DECODING)
                rt.events.append(EventKind.FIRST_TOKEN, request_id, slot=slot.id)
            rt.pool.set_decoded(slot, n)
            rt.ledger.set_decoded(request_id, n)
            rt.events.append(EventKind.TOKEN, request_id, slot=slot.id, n=n)
            text = joiner.feed(piece)
            if text is None:
                continue  # a byte of a character still incomplete: nothing to send yet
            if req.stream:
                await send(_body(wire.token(text)))
            else:
                produced.append(text)

        # Only a look at the next token tells a reply that ends at the limit from one cut there.
        if limit is not None and n >= limit and not (natural_end and next(pieces, None) is None):
            finish = Finish.LENGTH
        elif self._scripted is not None and self._scripted.tool_calls:
            finish = Finish.TOOL_CALLS
        else:
            finish = Finish.STOP
        self._check("prompt" if n == 0 else "decode")
        usage = Usage(req.prompt_tokens, n)
        if req.stream:
            # The bytes of a character that the limit cut are never sent, as in llama.cpp.
            await send(_body(wire.end(finish, usage), more=False))
        else:
            tail = joiner.flush()
            if tail is not None:
                produced.append(tail)
            await _send_json(send, wire.whole(produced, finish, usage), headers)
        self._finish(request_id, RequestState.FINISHED, finish.value, n)

    async def _process_prompt(self, request_id: str, slot: Slot, stop: asyncio.Event) -> None:
        """The prompt phase: ``prompt_ms``, or the prompt's tokens in batches at a rate.

        In batches, a client that closed is noticed before each batch and
        never during one: llama.cpp looks at cancelled tasks only between
        batches of ``n_batch`` tokens, so a cut waits for the batch under way.
        """
        rt, cfg = self._rt, self._rt.config
        total = self._request.prompt_tokens
        rate = cfg.prompt_tokens_per_second
        if rate is None:
            await _sleep(cfg.prompt_ms / 1000.0, stop)
            rt.pool.set_prompt(slot, total, total)
            return
        rt.pool.set_prompt(slot, 0, total)
        started = time.monotonic()
        done = 0
        while done < total:
            self._check("prompt")
            done = min(total, done + cfg.prompt_batch)
            # Absolute deadlines: the rate does not drift with scheduling delays.
            await _sleep(started + done / rate - time.monotonic(), stop)
            if self._rt.shutting_down:
                raise _Aborted
            rt.pool.set_prompt(slot, done, total)
            rt.events.append(
                EventKind.PROMPT_BATCH, request_id, slot=slot.id, n_prompt=done, of=total
            )

    def _plan(self) -> tuple[Iterator[Piece], int | None, bool]:
        """The tokens to emit, how many at most, and whether running out of them is a stop.

        Reaching the limit is a "length" finish unless the third value is
        True and the tokens end there too: a generated reply whose length
        is the limit stopped by itself, a script cut at its last token did not.
        """
        cfg, max_tokens = self._rt.config, self._request.max_tokens
        if self._scripted is not None:
            # A script ends by itself; only max_tokens can cut it short.
            return self._scripted.pieces(), max_tokens, False
        words = word_stream(self._request.messages, cfg.multibyte_every)
        tokens = itertools.chain.from_iterable(_word_pieces(w) for w in words)
        if cfg.endless:
            return tokens, max_tokens, False
        return _whole_reply(tokens, cfg.reply_tokens), max_tokens, True

    def _check(self, where: str) -> None:
        if self._peer_gone_at is not None:
            raise _PeerClosed(where)
        if self._rt.shutting_down:
            raise _Aborted

    def _finish_peer_closed(self, request_id: str, where: str, n_decoded: int) -> None:
        self._rt.events.append(
            EventKind.PEER_CLOSED,
            request_id,
            where=where,
            n_decoded=n_decoded,
            t_disconnect=self._peer_gone_at,
        )
        self._finish(request_id, RequestState.PEER_CLOSED, "peer_closed", n_decoded)

    def _finish(self, request_id: str, state: RequestState, reason: str, n: int) -> None:
        # Set first: a request is finished once, even if the move below failed.
        self._finished = True
        self._rt.ledger.move(request_id, state, finish_reason=reason)
        self._rt.events.append(EventKind.REQUEST_FINISHED, request_id, reason=reason, n_decoded=n)

    def _finish_failed(self, request_id: str) -> None:
        if not self._finished:
            n = self._slot.n_decoded if self._slot is not None else 0
            self._finish(request_id, RequestState.FAILED, "error", n)


async def _sleep(seconds: float, stop: asyncio.Event) -> None:
    # Only shutdown cuts a sleep short. A peer close waits for the next token:
    # llama.cpp, too, notices a dead client only when it has a token to send.
    if seconds > 0 and not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)


def _whole_reply(tokens: Iterator[Piece], n: int) -> Iterator[Piece]:
    """The first ``n`` of ``tokens``, and the bytes that finish a character they cut.

    A model does not stop inside a character: a generated reply is
    ``reply_tokens`` tokens, or the few more that complete its last one.
    """
    yield from itertools.islice(tokens, n)
    for piece in tokens:
        if not piece.partial or not 0x80 <= piece.partial[0] < 0xC0:
            return  # not a continuation byte: the last character was whole
        yield piece


@functools.lru_cache(maxsize=1024)
def _word_pieces(word: str) -> tuple[Piece, ...]:
    # Generated replies repeat a few dozen words: split each one once.
    return tuple(text_pieces(word))


def _raw_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def _body(data: bytes, more: bool = True) -> dict[str, object]:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def _send_json(
    send: Send, payload: dict[str, object], headers: dict[str, str], status: int = 200
) -> None:
    data = fmt.json_bytes(payload)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": _raw_headers(
                {**headers, "content-type": "application/json", "content-length": str(len(data))}
            ),
        }
    )
    await send(_body(data, more=False))
