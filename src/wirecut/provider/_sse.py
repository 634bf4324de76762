"""Server-sent events: ``iter_sse`` turns the lines of a response into events.

Follows the WHATWG event-stream rules that OpenAI-compatible servers rely on:
``:`` starts a comment, ``data:`` lines accumulate (joined by newlines), an
empty line dispatches the event, ``event:`` and ``id:`` set its type and id,
unknown fields are ignored, and one space after the colon is dropped.
A pure function of its input; call it from any thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["ServerSentEvent", "iter_sse"]


@dataclass(frozen=True)
class ServerSentEvent:
    """One dispatched event: ``event`` is "message" unless the server named it."""

    data: str
    event: str = "message"
    id: str | None = None


def iter_sse(lines: Iterable[str]) -> Iterator[ServerSentEvent]:
    """Yield the events in ``lines`` (without their line endings).

    An event still open when the lines end is dispatched too: some servers
    close the stream without the final blank line.
    """
    data: list[str] = []
    event = ""
    last_id: str | None = None
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield ServerSentEvent("\n".join(data), event or "message", last_id)
            data, event = [], ""
            continue
        if line.startswith(":"):
            continue  # A comment (servers send them as keep-alives).
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            last_id = value
    if data:
        yield ServerSentEvent("\n".join(data), event or "message", last_id)
