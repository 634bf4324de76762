"""``ChatClient``: one OpenAI-compatible ``/chat/completions`` endpoint, cuttable.

Works with llama.cpp server, vLLM, Ollama and hosted APIs. Requests go through
``wirecut.http``, so a cancel of the bound scope shuts the socket down: the
worker wakes at once and the provider sees the close and frees its slot.
"""

from __future__ import annotations

import contextlib
import email.utils
import enum
import itertools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

import wirecut.http
import wirecut.scope as ws
from wirecut import _json
from wirecut.http._core import check_http_url, check_seconds
from wirecut.provider._accumulator import ChatAccumulator
from wirecut.provider._admission import SlotGate
from wirecut.provider._errors import (
    ProviderConnectionError,
    ProviderError,
    ProviderResponseError,
    ProviderStatusError,
    map_http_errors,
)
from wirecut.provider._limits import ResponseLimits
from wirecut.provider._result import ChatResult, Usage
from wirecut.provider._sse import ServerSentEvent, SseDecoder
from wirecut.scope import Interrupted

__all__ = ["ChatClient", "ClientState"]

#: The longest ``Retry-After`` we honour, in seconds.
MAX_RETRY_AFTER = 30.0
#: Backoff before retry n (0-based) when the provider gave no Retry-After.
BACKOFF_BASE = 0.5
BACKOFF_MAX = 8.0
#: How many reads after ``[DONE]`` are made (and dropped) to reuse the connection.
AFTER_DONE_READS = 4
#: A closed response's body: httpx's own empty stream (see ``ChatClient._send``).
_READ_OUT = httpx.ByteStream(b"")


class ClientState(enum.Enum):
    OPEN = "open"  # chat() may be called
    CLOSED = "closed"  # close() was called; chat() raises


class _Attempt:
    """What one HTTP attempt got to; set by the trace hook and the reader."""

    __slots__ = ("response_started", "sent")

    def __init__(self) -> None:
        self.sent = False  # the request headers went out: the provider may have it
        self.response_started = False  # response headers arrived

    def trace(self, event: str, info: dict[str, Any]) -> None:
        # httpcore's trace extension; any HTTP version.
        if event.endswith(".send_request_headers.started"):
            self.sent = True


class ChatClient:
    """A chat-completions client for one provider, safe to share between threads.

    ``chat()`` runs in the calling thread and obeys the scope bound there
    (``wirecut.scope.bind_scope``); with none bound it is a plain client.
    ``http_client``, if given, is used as is and not closed by ``close()``;
    it should be a ``wirecut.http.client()`` for the requests to be cuttable.
    ``wire_stream=False`` makes every request a real non-streaming one (the
    default streams on the wire, see ``chat``). ``read_interval`` (seconds, at
    most 1; 0 by default) reads a flowing stream at most that often, each read
    taking every token that came meanwhile: ``on_token`` then gets them a few
    at a time, and a stream costs a fraction of the CPU (for a person
    watching, 0.04 is 25 updates a second; see ``wirecut.http.H1Transport``),
    each call with the text of one read (without it, a call per delta).
    ``limits`` bounds what one
    response may make it hold (``ResponseLimits``; its defaults fit any real
    reply): past a bound the request is cut and ``chat()`` raises
    ``ProviderResponseError``. ``admission``, if given, is the line every
    request takes its turn in (``SlotGate``: no more requests in flight
    than the provider has slots); share one gate between every client of
    one provider.

    Bad settings are a ``ValueError`` naming the argument: ``base_url`` must
    be an http:// or https:// URL with a host; ``timeout`` and
    ``connect_timeout`` finite seconds above 0 and at most
    ``threading.TIMEOUT_MAX``; ``max_retries`` a whole number >= 0.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        timeout: float = 120.0,
        connect_timeout: float = 5.0,
        max_retries: int = 2,
        http_client: httpx.Client | None = None,
        wire_stream: bool = True,
        limits: ResponseLimits | None = None,
        read_interval: float = 0.0,
        admission: SlotGate | None = None,
    ) -> None:
        check_http_url("base_url", base_url)
        check_seconds("timeout", timeout)
        check_seconds("connect_timeout", connect_timeout)
        if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
            raise ValueError(f"max_retries must be a whole number >= 0, not {max_retries!r}")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self.max_retries = max_retries
        self.wire_stream = wire_stream
        self.limits = limits or ResponseLimits()
        self.admission = admission
        # Paced reads bring tokens a few at a time: on_token gets each read's together.
        self._join_tokens = read_interval > 0
        self._headers = {"Accept": "application/json, text/event-stream"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._owns_http = http_client is None
        # httptools, not h11, under every streamed token (wirecut.http.H1Transport).
        self._http = http_client or httpx.Client(
            transport=wirecut.http.H1Transport(
                connect_timeout=connect_timeout, read_interval=read_interval
            ),
            timeout=self._timeout,
        )
        # Guards the state only; chat() runs without it.
        self._lock = threading.Lock()
        self._state = ClientState.OPEN

    @property
    def state(self) -> ClientState:
        return self._state

    def close(self) -> None:
        """Close the HTTP client if this client made it. Safe to call more than once."""
        with self._lock:
            if self._state is ClientState.CLOSED:
                return
            self._state = ClientState.CLOSED
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        stream: bool = True,
        on_token: Callable[[str], None] | None = None,
        **params: Any,
    ) -> ChatResult:
        """Send one chat request and return the whole answer.

        ``stream=True`` passes each content delta to ``on_token`` as it
        arrives; ``stream=False`` does not. Either way the request streams on
        the wire (``stream: true`` with ``include_usage``): a provider notices
        a closed peer at its next write, so a cut frees its slot at the next
        token. ``wire_stream=False`` in ``params`` (or the constructor) sends a
        real non-streaming request instead. Other ``params`` (``temperature``,
        ``max_tokens``, ``model`` ...) go into the request body.

        Connection errors, 429 and 5xx are retried up to ``max_retries``
        times, after ``Retry-After`` (capped at 30 s) or a backoff, but never
        once a response body started, never after a cut, and never when the
        error says a retry cannot help (``ProviderConnectionError.retryable``).

        Usage is never lost: the result's ``usage``, or the ``usage`` of the
        ``ProviderError`` raised, counts every request sent (retries, and a
        request that failed or was cut, included) and the tokens that
        arrived, whatever ended the request; a count nobody told us is None.

        With an ``admission`` gate, each request (each retry too) first takes
        its turn there, and holds its place until its response is closed.

        Cancellation: if the bound scope is cancelled before any request was
        sent (at entry, while waiting for admission, while connecting)
        ``chat()`` raises ``Interrupted``; a request cut while it waited for
        admission is never sent.
        Once one was sent, a cut (of the request in flight, or of a retry's
        backoff, after which no retry is sent) ends it at once and ``chat()``
        returns a ``ChatResult`` with ``interrupted=True``, the scope's
        reason, and the text, tool-call fragments and usage received so far.

        Raises ``ProviderError`` subclasses (see ``_errors``) and ``Interrupted``.
        """
        if self._state is ClientState.CLOSED:
            raise RuntimeError("Cannot send a request, as the ChatClient has been closed.")
        wire_stream = bool(params.pop("wire_stream", self.wire_stream))
        body: dict[str, Any] = {"messages": messages, **params}
        if body.get("model") is None:
            body.pop("model", None)
            if self.model is not None:
                body["model"] = self.model
        if tools:
            body["tools"] = tools
        if wire_stream:
            body["stream"] = True
            body["stream_options"] = {**(params.get("stream_options") or {}), "include_usage": True}
        else:
            body["stream"] = False
            body.pop("stream_options", None)
        sink = on_token if stream else None

        usage = Usage()  # Of every request sent so far.
        delay = 0.0
        for attempt in range(self.max_retries + 1):
            state = _Attempt()
            accumulator = ChatAccumulator(
                sink, max_reply_chars=self.limits.reply_chars, join_tokens=self._join_tokens
            )
            try:
                if attempt:
                    ws.sleep(delay)  # A cut wakes it with Interrupted: no retry after a cut.
                # wirecut's transport refuses a cancelled scope by itself; a plain
                # http_client= does not, and this is then the only thing that does.
                ws.check()
                if self.admission is None:
                    self._send(body, wire_stream, state, accumulator)
                else:
                    with self.admission.admitted():
                        self._send(body, wire_stream, state, accumulator)
            except Interrupted as exc:
                if state.sent:
                    usage.add(accumulator.usage())
                elif usage.requests == 0:
                    raise  # Nothing was asked of the provider: nothing to keep.
                return accumulator.result(usage, interrupted=True, reason=exc.reason)
            except ProviderError as exc:
                if state.sent:
                    usage.add(accumulator.usage())
                exc.usage = usage
                if attempt == self.max_retries or not _retryable(exc, state):
                    raise
                delay = _delay(exc, attempt)
            else:
                usage.add(accumulator.usage())
                return accumulator.result(usage)
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(
        self, body: dict[str, Any], wire_stream: bool, state: _Attempt, acc: ChatAccumulator
    ) -> None:
        request = self._http.build_request(
            "POST",
            self.url,
            json=body,
            headers=self._headers,
            timeout=self._timeout,
            extensions={"trace": state.trace},
        )
        with map_http_errors(self.url):
            response = self._http.send(request, stream=True)
            try:
                state.response_started = True
                if response.status_code >= 400:
                    raise _status_error(response, self.url)
                content_type = response.headers.get("content-type", "")
                if wire_stream and "text/event-stream" in content_type:
                    _read_stream(response, acc, self.limits)
                else:
                    # Also a server that ignored ``stream: true``.
                    acc.expect_whole()
                    acc.add_response(_parse(_read_body(response, self.limits.body_bytes)))
                    acc.send_tokens()
            finally:
                try:
                    # Before the body's end (an error, a bound passed) this
                    # closes the connection rather than return it to the pool:
                    # the provider sees the close and stops sending.
                    response.close()
                finally:
                    # httpx's response and the stream it wrapped its body in
                    # name each other; the collector alone would free the pair,
                    # and with it the request and its attempt. Closed, it
                    # reads no more.
                    response.stream = _READ_OUT


def _retryable(exc: ProviderError, state: _Attempt) -> bool:
    if isinstance(exc, ProviderStatusError):
        return exc.retryable
    if isinstance(exc, ProviderConnectionError):
        return exc.retryable and not state.response_started
    return False


def _delay(exc: ProviderError, attempt: int) -> float:
    if isinstance(exc, ProviderStatusError) and exc.retry_after is not None:
        return exc.retry_after
    return _backoff(attempt)


def _read_body(response: httpx.Response, limit: int) -> str:
    """The whole body as text, refused (with the read stopped) once past ``limit`` bytes."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared[:20]) > limit:
        raise ProviderResponseError(
            f"the response body is {declared[:20]} bytes, more than {limit}"
            " (ResponseLimits.body_bytes)"
        )
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > limit:
            raise ProviderResponseError(
                f"the response body is longer than {limit} bytes (ResponseLimits.body_bytes)"
            )
    return body.decode("utf-8", "replace")


def _read_stream(response: httpx.Response, acc: ChatAccumulator, limits: ResponseLimits) -> None:
    """Merge the stream's events into ``acc``; its tokens go out once per read, together."""
    decoder = SseDecoder(max_line_bytes=limits.line_bytes, max_data_chars=limits.line_bytes)
    chunks = response.iter_bytes()
    for chunk in chunks:
        try:
            if _merge(decoder.feed(chunk), acc):
                break
        finally:
            acc.send_tokens()
    else:
        _merge(decoder.end(), acc)
        acc.send_tokens()
        if acc.finish_reason is None:
            raise ProviderResponseError("the event stream ended before [DONE] or a finish_reason")
        return
    # Read to the end of the body (the chunked terminator) so that the
    # connection can be reused; whatever a server sends after [DONE] is not
    # part of the answer, and an error there (or more than a few reads)
    # costs a connection, not the answer.
    with contextlib.suppress(httpx.HTTPError):
        for _ in itertools.islice(chunks, AFTER_DONE_READS):
            pass


def _merge(events: list[ServerSentEvent], acc: ChatAccumulator) -> bool:
    """Merge ``events`` into ``acc``; True once ``[DONE]`` came."""
    for event in events:
        if event.data.strip() == "[DONE]":
            return True
        if event.event == "error":
            raise ProviderResponseError(f"the provider sent an error event: {event.data:.200}")
        acc.add_chunk(_parse(event.data))
    return False


def _parse(text: str) -> Any:
    try:
        return _json.loads(text)
    except _json.JSONError as exc:
        raise ProviderResponseError(f"{exc}: {text[:200]!r}") from None


def _status_error(response: httpx.Response, url: str) -> ProviderStatusError:
    # Read a bounded excerpt: an error page can be large, and we keep 200 chars.
    raw = b""
    for chunk in response.iter_bytes():
        raw += chunk
        if len(raw) >= 4096:
            break
    return ProviderStatusError(
        response.status_code,
        raw.decode("utf-8", "replace"),
        url=url,
        retry_after=_retry_after(response.headers.get("retry-after")),
    )


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (seconds or an HTTP date), capped."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def _backoff(attempt: int) -> float:
    return float(min(BACKOFF_BASE * 2**attempt, BACKOFF_MAX))
