"""Server-sent events: ``iter_lines`` splits a body into lines, ``iter_sse`` makes events.

Follows the WHATWG event-stream rules that OpenAI-compatible servers rely on:
a line ends with CRLF, LF or CR; ``:`` starts a comment, ``data:`` lines
accumulate (joined by newlines), an empty line dispatches the event,
``event:`` and ``id:`` set its type and id, unknown fields are ignored, and
one space after the colon is dropped.

Both hold at most one line (one event's data) in memory, and take a bound
for it: a server that sends a line without end fails with
``ProviderResponseError`` once the line passes the bound, instead of
growing the reader until the machine runs out of memory. Pure functions of
their input; call them from any thread.

``SseDecoder`` is the same rules fed a read at a time, for the hot path: a
streamed reply is a token an event, and the decoder splits a whole read with
``bytes.split`` where the generators step through it a line at a time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from wirecut.provider._errors import ProviderResponseError

__all__ = ["ServerSentEvent", "SseDecoder", "iter_lines", "iter_sse"]

_LINE_END = re.compile(rb"[\r\n]")
_CR = 0x0D
_LF = 0x0A


@dataclass(frozen=True)
class ServerSentEvent:
    """One dispatched event: ``event`` is "message" unless the server named it."""

    data: str
    event: str = "message"
    id: str | None = None


def iter_lines(chunks: Iterable[bytes], *, max_line_bytes: int | None = None) -> Iterator[str]:
    """Yield the lines of a UTF-8 byte stream given in ``chunks``, without their endings.

    A line longer than ``max_line_bytes`` raises ``ProviderResponseError``
    before more than that (plus one chunk) is held. A last line without an
    ending is yielded too. Invalid UTF-8 is replaced, not raised.
    """
    line = bytearray()
    skip_lf = False  # the previous chunk ended with CR: an LF first is its CRLF
    for chunk in chunks:
        if not chunk:
            continue
        start = 1 if skip_lf and chunk[0] == _LF else 0
        skip_lf = False
        while True:
            found = _LINE_END.search(chunk, start)
            end = len(chunk) if found is None else found.start()
            if max_line_bytes is not None and len(line) + end - start > max_line_bytes:
                raise ProviderResponseError(
                    f"an event-stream line is longer than {max_line_bytes} bytes"
                    " (ResponseLimits.line_bytes)"
                )
            line += chunk[start:end]
            if found is None:
                break
            text = line.decode("utf-8", "replace")
            line.clear()
            yield text
            if chunk[end] == _CR:
                if end + 1 == len(chunk):
                    skip_lf = True
                elif chunk[end + 1] == _LF:
                    end += 1
            start = end + 1
    if line:
        yield line.decode("utf-8", "replace")


def iter_sse(
    lines: Iterable[str], *, max_data_chars: int | None = None
) -> Iterator[ServerSentEvent]:
    """Yield the events in ``lines`` (without their line endings).

    An event still open when the lines end is dispatched too: some servers
    close the stream without the final blank line. An event whose data
    passes ``max_data_chars`` raises ``ProviderResponseError``.
    """
    data: list[str] = []
    size = 0
    event = ""
    last_id: str | None = None
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield ServerSentEvent("\n".join(data), event or "message", last_id)
            data, size, event = [], 0, ""
            continue
        if line.startswith(":"):
            continue  # A comment (servers send them as keep-alives).
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            size += len(value) + 1
            if max_data_chars is not None and size > max_data_chars:
                raise ProviderResponseError(
                    f"an event's data is longer than {max_data_chars} characters"
                    " (ResponseLimits.line_bytes)"
                )
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            last_id = value
    if data:
        yield ServerSentEvent("\n".join(data), event or "message", last_id)


class SseDecoder:
    """Server-sent events from a byte stream given a read at a time (``feed``, then ``end``).

    The rules and the bounds of ``iter_sse(iter_lines(...))``, which it
    equals for any split of the bytes. Used by one thread at a time.
    """

    __slots__ = (
        "_data",
        "_event",
        "_id",
        "_max_data_chars",
        "_max_line_bytes",
        "_pending",
        "_size",
        "_skip_lf",
    )

    def __init__(
        self, *, max_line_bytes: int | None = None, max_data_chars: int | None = None
    ) -> None:
        self._max_line_bytes = max_line_bytes
        self._max_data_chars = max_data_chars
        self._pending = b""  # the start of a line whose end has not come
        self._skip_lf = False  # the last read ended with CR: an LF first is its CRLF
        self._data: list[str] = []
        self._size = 0
        self._event = ""
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """The events that ``chunk`` completed (a list: usually empty or one)."""
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == _LF:
                chunk = chunk[1:]
        data = self._pending + chunk if self._pending else chunk
        if b"\r" in data:
            self._skip_lf = data[-1] == _CR
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        self._pending = lines.pop()
        limit = self._max_line_bytes
        if limit is not None:
            if len(self._pending) > limit or any(len(line) > limit for line in lines):
                raise ProviderResponseError(
                    f"an event-stream line is longer than {limit} bytes (ResponseLimits.line_bytes)"
                )
        events: list[ServerSentEvent] = []
        for raw in lines:
            self._line(raw.decode("utf-8", "replace"), events)
        return events

    def end(self) -> list[ServerSentEvent]:
        """The events left when the stream ended (a last line without its end, an open event)."""
        events: list[ServerSentEvent] = []
        if self._pending:
            pending, self._pending = self._pending, b""
            self._line(pending.decode("utf-8", "replace"), events)
        if self._data:
            events.append(self._dispatch())
        return events

    def _line(self, line: str, events: list[ServerSentEvent]) -> None:
        if not line:
            if self._data:
                events.append(self._dispatch())
            else:
                self._event = ""
            return
        if line[0] == ":":
            return  # A comment (servers send them as keep-alives).
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._size += len(value) + 1
            if self._max_data_chars is not None and self._size > self._max_data_chars:
                raise ProviderResponseError(
                    f"an event's data is longer than {self._max_data_chars} characters"
                    " (ResponseLimits.line_bytes)"
                )
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value

    def _dispatch(self) -> ServerSentEvent:
        data = self._data[0] if len(self._data) == 1 else "\n".join(self._data)
        event = ServerSentEvent(data, self._event or "message", self._id)
        self._data, self._size, self._event = [], 0, ""
        return event
