"""``EagerSender``: a send that does not wait runs at once; one that waits keeps the order.

On a real event loop with a ``send`` shaped like uvicorn's: it writes at
once unless the connection is paused, and then awaits until it is resumed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from wirecut.proxy._eager import EagerSender


class Connection:
    """uvicorn's send, reduced to its flow control: paused, it waits to be resumed."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.writable = asyncio.Event()
        self.writable.set()

    async def send(self, message: dict[str, Any]) -> None:
        if not self.writable.is_set():
            await self.writable.wait()
        self.written.append(message["body"])


def body(data: bytes) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": True}


def run(main: Any) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(10):
            await main()

    asyncio.run(bounded())


def test_a_send_that_does_not_wait_is_done_when_push_returns() -> None:
    async def main() -> None:
        connection = Connection()
        events: list[str] = []
        sender = EagerSender(
            connection.send, lambda: events.append("blocked"), lambda: events.append("free")
        )
        sender.push(body(b"a"))
        assert connection.written == [b"a"]  # No task, no turn of the loop.
        assert events == []

    run(main)


def test_a_send_that_waits_is_finished_in_order_and_the_reader_is_told() -> None:
    async def main() -> None:
        connection = Connection()
        events: list[str] = []
        sender = EagerSender(
            connection.send, lambda: events.append("blocked"), lambda: events.append("free")
        )
        connection.writable.clear()  # The client stopped reading.
        sender.push(body(b"a"))
        sender.push(body(b"b"))
        assert connection.written == []
        assert events == ["blocked"]
        connection.writable.set()
        await sender.drain()
        assert connection.written == [b"a", b"b"]
        assert events == ["blocked", "free"]
        sender.push(body(b"c"))
        assert connection.written == [b"a", b"b", b"c"]

    run(main)


def test_close_stops_a_send_that_waits() -> None:
    async def main() -> None:
        connection = Connection()
        sender = EagerSender(connection.send, lambda: None, lambda: None)
        connection.writable.clear()
        sender.push(body(b"a"))
        sender.push(body(b"b"))
        sender.close()
        await sender.drain()
        connection.writable.set()
        await asyncio.sleep(0)
        assert connection.written == []

    run(main)
