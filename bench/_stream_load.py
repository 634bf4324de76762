"""Many concurrent streamed chat completions from one process: the load of bench_proxy's scale.

Run: ``python bench/_stream_load.py BASE_URL STREAMS WINDOW_S START_BOUND_S``.

Opens ``STREAMS`` connections at once, each sending one streamed chat
completion without end (``max_tokens`` large), and reads them on one event
loop with raw asyncio protocols (a client this cheap leaves the machine to
the systems measured). Prints one JSON line when every stream had its first
token or ``START_BOUND_S`` passed (``{"started": n, "ttft_ms": [...]}``),
then counts the content tokens that arrive over ``WINDOW_S`` seconds and
prints a second line (``{"tokens": n, "seconds": s}``), then closes every
connection and exits. A token is a ``"content"`` field with text, counted in
what each read brought (a field split across two reads is counted once).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from urllib.parse import urlsplit

_CONTENT = re.compile(rb'"content"\s*:\s*"[^"]')


class _Stream(asyncio.Protocol):
    def __init__(self, request: bytes, load: _Load) -> None:
        self.request = request
        self.load = load
        self.sent_at = 0.0
        self.first: float | None = None
        self.tail = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.sent_at = time.perf_counter()
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        seen = self.tail + data
        count = len(_CONTENT.findall(seen)) - len(_CONTENT.findall(self.tail))
        self.tail = data[-48:]
        if count <= 0:
            return
        if self.first is None:
            self.first = time.perf_counter()
            self.load.started(self)
        self.load.tokens += count


class _Load:
    def __init__(self, streams: int) -> None:
        self.streams = streams
        self.tokens = 0
        self.ttft_ms: list[float] = []
        self.all_started = asyncio.Event()

    def started(self, stream: _Stream) -> None:
        assert stream.first is not None
        self.ttft_ms.append((stream.first - stream.sent_at) * 1000)
        if len(self.ttft_ms) == self.streams:
            self.all_started.set()


async def main(base_url: str, streams: int, window: float, start_bound: float) -> None:
    parts = urlsplit(base_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    body = json.dumps(
        {
            "model": "m",
            "stream": True,
            "max_tokens": 1_000_000,
            "messages": [{"role": "user", "content": "tell me everything"}],
        }
    ).encode()
    request = (
        f"POST {parts.path.rstrip('/')}/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    load = _Load(streams)
    loop = asyncio.get_running_loop()
    opened = await asyncio.gather(
        *(
            loop.create_connection(lambda: _Stream(request, load), host, port)
            for _ in range(streams)
        ),
        return_exceptions=True,
    )
    transports = [t for t, _ in (o for o in opened if not isinstance(o, BaseException))]
    try:
        async with asyncio.timeout(start_bound):
            await load.all_started.wait()
    except TimeoutError:
        pass
    print(json.dumps({"started": len(load.ttft_ms), "ttft_ms": load.ttft_ms}), flush=True)
    before, started = load.tokens, time.perf_counter()
    await asyncio.sleep(window)  # The measurement window itself.
    print(
        json.dumps({"tokens": load.tokens - before, "seconds": time.perf_counter() - started}),
        flush=True,
    )
    for transport in transports:
        transport.close()


if __name__ == "__main__":
    url, count, seconds, bound = (
        sys.argv[1],
        int(sys.argv[2]),
        float(sys.argv[3]),
        float(sys.argv[4]),
    )
    asyncio.run(main(url, count, seconds, bound))
