"""Server-sent events of an upstream stream: where each ends, and what the proxy must look at.

The proxy relays a stream event by event, and needs of each only a little:
where it ends, whether it is ``[DONE]``, an error, the usage chunk, a
choice's ``finish_reason``, and whether it carried a delta (to count what
arrived when the upstream's own usage never came). A ``json.loads`` of every
token to learn that was most of what a relayed token cost. So
``EventSplitter`` hands over each event's data as bytes, and a search of
those bytes with ``PARSE`` says which must be parsed (a finish, a usage
object, an error), one with ``DELTA`` whether it carried a delta: inside a
JSON string every ``"`` is escaped, so ``"finish_reason":"`` can only be the
field itself. Everything else is passed on as it came.

Pure; used by one task at a time.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "DELTA",
    "DONE",
    "DONE_BLOCK",
    "PARSE",
    "EventSplitter",
    "EventTooLarge",
    "dumps",
    "encode",
    "parse_block",
    "typed_event",
]

#: The data of the event that ends an OpenAI stream, and that event as sent.
DONE = b"[DONE]"
DONE_BLOCK = b"data: [DONE]"

#: A finish_reason that is a string (not null), a usage that is an object
#: (not null), or an "error" field: the chunks that must be parsed.
PARSE = re.compile(rb'"(?:finish_reason"\s*:\s*"|usage"\s*:\s*\{|error")')
#: A delta that carries something: text, reasoning, a tool call's part.
DELTA = re.compile(
    rb'"(?:content|reasoning_content|text)"\s*:\s*"(?!")|"(?:tool_calls|function_call)"\s*:\s*[\[{]'
)


class EventTooLarge(Exception):
    """One event's data passed the bound; the message says by how much."""


def encode(name: bytes | None, data: bytes) -> bytes:
    """One event on the wire: ``event:`` if named, a ``data:`` line per line, a blank line."""
    head = b"" if name is None else b"event: " + name + b"\n"
    if b"\n" not in data:
        return head + b"data: " + data + b"\n\n"
    return head + b"".join(b"data: " + line + b"\n" for line in data.split(b"\n")) + b"\n"


def dumps(obj: Any) -> bytes:
    """JSON as the proxy writes it into an event or a body: compact, non-ASCII as it is."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def typed_event(kind: str, **fields: Any) -> bytes:
    """An event named ``kind`` whose data is ``{"type": kind, **fields}`` (the named-event APIs)."""
    return encode(kind.encode(), dumps({"type": kind, **fields}))


class EventSplitter:
    """Events from the bytes of a stream: ``(name or None, data, wire bytes)``.

    The WHATWG rules the OpenAI-compatible servers rely on: events end at a
    blank line, ``data:`` lines join with newlines, one space after the colon
    is dropped, comments (``:``) and ``id:``/``retry:`` are ignored; CRLF line
    ends are read as LF. The wire bytes are the event as it came when it was
    one plain ``data:`` line (the common case: passed on untouched), else the
    event written anew. An event whose data passes ``max_bytes`` raises
    ``EventTooLarge`` once that much is held, not later.
    """

    __slots__ = ("_buffer", "_max")

    def __init__(self, max_bytes: int) -> None:
        self._buffer = b""
        self._max = max_bytes

    def feed(self, data: bytes) -> list[tuple[bytes | None, bytes, bytes]]:
        buffer = self._buffer + data if self._buffer else data
        if b"\r" in buffer:
            # A CR kept at the end waits for its LF in the next piece.
            buffer = buffer.replace(b"\r\n", b"\n")
        blocks = buffer.split(b"\n\n")
        rest = blocks.pop()
        if len(rest) > self._max:
            raise EventTooLarge(f"an event of the upstream's stream exceeds {self._max} bytes")
        self._buffer = rest
        events: list[tuple[bytes | None, bytes, bytes]] = []
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:
                events.append((None, block[6:], block + b"\n\n"))  # The common case.
            elif (event := parse_block(block)) is not None:
                events.append((event[0], event[1], encode(*event)))
        return events

    def end(self) -> list[tuple[bytes | None, bytes, bytes]]:
        """The event a stream left open (no blank line after it), if any."""
        block, self._buffer = self._buffer.rstrip(b"\r\n"), b""
        event = parse_block(block) if block else None
        return [] if event is None else [(event[0], event[1], encode(*event))]


def parse_block(block: bytes) -> tuple[bytes | None, bytes] | None:
    """``(name, data)`` of one event (its lines, without the blank line); None if it has no data."""
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
