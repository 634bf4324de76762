"""``relay``: one request to the upstream, read to its end or to the cut.

Runs in a worker thread with the request's scope bound (``wirecut.aio.run_sync``),
so the scoped transport registers the upstream socket with that scope and a
cut (the client left, a cancel, the timeout) shuts it down: the read wakes at
once with ``Interrupted`` and the upstream sees the close at its next write.

The request always streams on the wire. A streaming client gets each event as
it arrives, through the ``Channel``; a non-streaming client gets the answer
that ``Assembler`` built from the same events, in the ``RelayResult``.

Retries: only before the upstream has the request. A connect that fails (the
request headers never went out) is tried again, ``connect_retries`` times at
most, after a short pause that a cut ends; an error status, a broken stream
or anything after the headers went out is never retried, and nothing is
retried under a cancelled scope (the transport refuses to connect).
"""

from __future__ import annotations

import contextlib
import enum
import json
from dataclasses import dataclass
from typing import Any

import httpx

import wirecut.scope as ws
from wirecut.proxy._assemble import Assembler, Endpoint, Tally
from wirecut.proxy._channel import HEAD, Channel
from wirecut.proxy._upstream import Upstream
from wirecut.scope import Interrupted

__all__ = [
    "ERROR_BODY_LIMIT",
    "EventSplitter",
    "Outcome",
    "RelayResult",
    "UpstreamRequest",
    "relay",
]

#: How much of an upstream's error body is passed to the client.
ERROR_BODY_LIMIT = 64 * 1024
#: Pause before connect retry n (0-based): RETRY_PAUSE * 2**n seconds.
RETRY_PAUSE = 0.1

_DONE = b"[DONE]"
_DONE_EVENT = b"data: [DONE]\n\n"


class Outcome(enum.Enum):
    """How a relay ended."""

    COMPLETE = "complete"  # the answer arrived whole
    CUT = "cut"  # the scope cut it; the exchange knows why
    REFUSED = "refused"  # the upstream answered an error status: passed on as it is
    FAILED = "failed"  # no connection after the retries, or the stream broke off or said error


@dataclass
class RelayResult:
    """What the worker hands back to the event loop.

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


class _Sent:
    """httpcore's trace hook: notes, and counts, the request once its headers go out.

    Counted there, not when the response begins: a cut during a long prompt
    (llama.cpp sends no headers before the first token) ends the send
    itself, and the upstream had the request all the same.
    """

    __slots__ = ("sent", "tally")

    def __init__(self, tally: Tally) -> None:
        self.sent = False
        self.tally = tally

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event.endswith(".send_request_headers.started") and not self.sent:
            self.sent = True
            self.tally.requests += 1


def relay(
    upstream: Upstream,
    request: UpstreamRequest,
    channel: Channel,
    tally: Tally,
    connect_retries: int,
) -> RelayResult:
    """Send ``request`` upstream and relay its answer; see the module docstring.

    Call in a worker thread with the request's scope bound. Returns a
    ``RelayResult`` in every case a cut, the upstream or the network can
    cause; raises only for a bug.
    """
    headers = {
        **upstream.headers,
        "Content-Type": "application/json",
        "Accept": "text/event-stream",
        "X-Request-Id": request.id,
    }
    url = upstream.url(request.endpoint)
    try:
        for attempt in range(connect_retries + 1):
            state = _Sent(tally)
            outgoing = upstream.http.build_request(
                "POST",
                url,
                content=request.body,
                headers=headers,
                extensions={"trace": state.trace},
            )
            try:
                response = upstream.http.send(outgoing, stream=True)
            except httpx.TransportError as exc:
                connect_failed = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                if state.sent or not connect_failed or attempt == connect_retries:
                    what = "cannot connect to" if connect_failed else "lost"
                    return RelayResult(
                        Outcome.FAILED, error=f"{what} the upstream {upstream.base_url}: {exc}"
                    )
                ws.sleep(RETRY_PAUSE * 2**attempt)  # A cut wakes it with Interrupted.
                continue
            try:
                return _read(response, request, channel, tally)
            except httpx.HTTPError as exc:
                return RelayResult(
                    Outcome.FAILED, error=f"the upstream connection broke: {type(exc).__name__}"
                )
            finally:
                response.close()
    except Interrupted:
        return RelayResult(Outcome.CUT)
    raise AssertionError("unreachable")  # pragma: no cover


def _read(
    response: httpx.Response, request: UpstreamRequest, channel: Channel, tally: Tally
) -> RelayResult:
    content_type = response.headers.get("content-type", "")
    if response.status_code >= 400:
        body = _bounded(response)
        return RelayResult(
            Outcome.REFUSED,
            status_code=response.status_code,
            content_type=content_type or "application/json",
            body=body,
            error=f"the upstream answered HTTP {response.status_code}",
        )
    if "text/event-stream" not in content_type:
        # An upstream that ignored "stream": true answered whole.
        return _whole(response.read(), request, channel, tally)
    assembler = None if request.stream else Assembler(request.endpoint)
    if request.stream:
        channel.put(HEAD)
    splitter = EventSplitter()
    done = False
    pieces = response.iter_bytes()
    for data in pieces:
        out: list[bytes] = []
        for name, payload in splitter.feed(data):
            failed = _event(name, payload, request, tally, assembler, out)
            if failed is not None:
                if out:
                    channel.put(b"".join(out))
                return failed
            if payload == _DONE:
                done = True
                break
        if out:
            channel.put(b"".join(out))
        if done:
            break
    else:
        for name, payload in splitter.end():
            out = []
            failed = _event(name, payload, request, tally, assembler, out)
            if out:
                channel.put(b"".join(out))
            if failed is not None:
                return failed
            done = done or payload == _DONE
    if done:
        # Read to the end of the body (its chunked terminator) so that the
        # connection can serve the next request of this scope; what comes
        # after [DONE] is not part of the answer.
        with contextlib.suppress(httpx.HTTPError):
            for _ in pieces:
                pass
    if not (done or tally.finished):
        return RelayResult(
            Outcome.FAILED,
            error="the upstream's stream ended before [DONE] or a finish_reason",
        )
    if assembler is not None:
        return RelayResult(Outcome.COMPLETE, body=_dumps(assembler.result()))
    if not done:
        channel.put(_DONE_EVENT)  # Finished without [DONE]: the client still gets its end.
    return RelayResult(Outcome.COMPLETE)


def _event(
    name: bytes | None,
    payload: bytes,
    request: UpstreamRequest,
    tally: Tally,
    assembler: Assembler | None,
    out: list[bytes],
) -> RelayResult | None:
    """Take one event; append what the client gets to ``out``; a RelayResult if it failed."""
    if payload == _DONE:
        if assembler is None:
            out.append(_DONE_EVENT)
        return None
    try:
        chunk = json.loads(payload)
    except ValueError:
        chunk = None
    if name == b"error" or (isinstance(chunk, dict) and "error" in chunk):
        if assembler is None:
            out.append(_encode(name, payload))
        return RelayResult(
            Outcome.FAILED,
            status_code=502,
            body=payload if isinstance(chunk, dict) else b"",
            error=f"the upstream sent an error event: {payload[:200]!r}",
            told_client=assembler is None,
        )
    if isinstance(chunk, dict):
        tally.add(chunk)
        if assembler is not None:
            assembler.add(chunk)
            return None
        if (
            not request.include_usage
            and chunk.get("choices") == []
            and chunk.get("usage") is not None
        ):
            return None  # The usage chunk the proxy asked for, not the client.
    if assembler is None:
        out.append(_encode(name, payload))
    return None


def _whole(raw: bytes, request: UpstreamRequest, channel: Channel, tally: Tally) -> RelayResult:
    """An answer the upstream sent unstreamed: count it, and stream it if the client asked."""
    try:
        answer = json.loads(raw)
    except ValueError:
        return RelayResult(Outcome.FAILED, error=f"the upstream answered no JSON: {raw[:200]!r}")
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
        return RelayResult(
            Outcome.FAILED, error=f"the upstream answered no completion: {raw[:200]!r}"
        )
    tally.add({"model": answer.get("model"), "usage": answer.get("usage")})
    tally.finished = True
    for choice in answer["choices"]:
        if isinstance(choice, dict):
            message = choice.get("message")
            text = message.get("content") if isinstance(message, dict) else choice.get("text")
            tally.deltas += bool(text)
    if not request.stream:
        return RelayResult(Outcome.COMPLETE, body=raw)
    channel.put(HEAD)
    chat = request.endpoint is Endpoint.CHAT
    common = {key: answer.get(key) for key in ("id", "created", "model")}
    common["object"] = "chat.completion.chunk" if chat else "text_completion"
    for choice in answer["choices"]:
        if not isinstance(choice, dict):
            continue
        part = {key: value for key, value in choice.items() if key != "message"}
        if chat:
            part["delta"] = choice.get("message") or {}
        channel.put(_encode(None, _dumps({**common, "choices": [part]})))
    if request.include_usage and answer.get("usage") is not None:
        channel.put(_encode(None, _dumps({**common, "choices": [], "usage": answer["usage"]})))
    channel.put(_DONE_EVENT)
    return RelayResult(Outcome.COMPLETE)


def _bounded(response: httpx.Response) -> bytes:
    body = b""
    for data in response.iter_bytes():
        body += data
        if len(body) >= ERROR_BODY_LIMIT:
            return body[:ERROR_BODY_LIMIT]
    return body


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _encode(name: bytes | None, payload: bytes) -> bytes:
    head = b"" if name is None else b"event: " + name + b"\n"
    if b"\n" not in payload:
        return head + b"data: " + payload + b"\n\n"
    return head + b"".join(b"data: " + line + b"\n" for line in payload.split(b"\n")) + b"\n"


class EventSplitter:
    """Server-sent events from the bytes of a stream: ``(event name or None, data)``.

    The WHATWG rules the OpenAI-compatible servers rely on: events end at a
    blank line, ``data:`` lines join with newlines, one space after the colon
    is dropped, comments (``:``) and ``id:``/``retry:`` are ignored. CRLF
    line ends are read as LF. One thread at a time.
    """

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[tuple[bytes | None, bytes]]:
        buffer = self._buffer + data
        if b"\r" in buffer:
            # A CR kept at the end waits for its LF in the next piece.
            buffer = buffer.replace(b"\r\n", b"\n")
        blocks = buffer.split(b"\n\n")
        self._buffer = blocks.pop()
        return [event for block in blocks if (event := _parse(block)) is not None]

    def end(self) -> list[tuple[bytes | None, bytes]]:
        """The event a stream left open (no blank line after it), if any."""
        block, self._buffer = self._buffer.rstrip(b"\r\n"), b""
        event = _parse(block) if block else None
        return [] if event is None else [event]


def _parse(block: bytes) -> tuple[bytes | None, bytes] | None:
    if block.startswith(b"data: ") and b"\n" not in block:
        return None, block[6:]  # The common case: one data line.
    name: bytes | None = None
    data: list[bytes] = []
    for line in block.split(b"\n"):
        field, colon, value = line.partition(b":")
        if not colon or not field:
            continue  # A comment (":..."), or a line without a field.
        if value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value
    return (name, b"\n".join(data)) if data else None
