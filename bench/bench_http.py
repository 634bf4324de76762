"""Cancel -> server-observed close, for wirecut's clients and for what a host can do today.

Run: ``python bench/bench_http.py [--trials 200] [--baseline-trials 20] [--window 1.0]
[--unsent-trials 20] [--out DIR]``. Prints Markdown tables (``--out DIR``
writes them as ``DIR/bench_http.json`` for docs/benchmarks.md) and asserts
nothing.

Every mode talks to a loopback server that holds the response at a known
blocking point: non-stream modes never get their response headers; stream
modes get a first chunk and then nothing. The clock starts when the host
cancels (after the worker reached that point) and stops when the server's
``recv()`` sees the peer close.

wirecut modes run their trials one after the other. Baseline modes (the host
abandons the worker thread, or closes the client from the host thread) run
their trials side by side and watch ``--window`` seconds for the close;
"never" means no close came in that window.

Two more tables: cancel -> the worker returned, where the worker is blocked
before any request is sent (a TLS handshake the server never answers, a
connect to a full listen backlog, the openai SDK's retry backoff); and what
a new scope's connection pool costs to build (its SSL context).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import httpx
import openai
import requests

import wirecut.http
from _loopback import Exchange, FullBacklog, LoopbackServer, StallServer, connect_started
from _report import Report
from wirecut.adapters import ScopedHTTPAdapter, openai_client, openai_http_client
from wirecut.http import ScopedTransport
from wirecut.provider import ChatClient
from wirecut.scope import InterruptScope

MESSAGES: Any = [{"role": "user", "content": "hi"}]
BOUND = 5.0
CHUNK = {
    "id": "x",
    "object": "chat.completion.chunk",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}],
}


def hold(ex: Exchange) -> None:
    ex.hold(60)


def first_chunk_then_stall(ex: Exchange) -> None:
    ex.sse([CHUNK], stall=True)


class Row:
    def __init__(self, mode: str, cut: str, trials: int, latencies: list[float]) -> None:
        self.mode, self.cut, self.trials, self.latencies = mode, cut, trials, latencies

    def cells(self) -> list[str]:
        seen = len(self.latencies)
        if not seen:
            seen_cell = f"0 ({self.trials} never)"
            return [self.mode, self.cut, str(self.trials), seen_cell, "never", "never", "never"]
        ms = sorted(x * 1000 for x in self.latencies)
        p50 = statistics.median(ms)
        p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
        fmt = "{:.2f} ms".format
        cells = [self.mode, self.cut, str(self.trials), str(seen), fmt(p50), fmt(p99), fmt(ms[-1])]
        if seen < self.trials:
            cells[3] += f" ({self.trials - seen} never)"
        return cells


# -- wirecut: cut through the scope ---------------------------------------------


def scoped_mode(
    mode: str,
    handler: Callable[[Exchange], None],
    make: Callable[[str], Any],
    work: Callable[[Any, threading.Event], Any],
    ready_by_server: bool,
    trials: int,
) -> Row:
    latencies: list[float] = []
    with LoopbackServer(handler) as server:
        client = make(server.url)
        try:
            for i in range(trials):
                scope = InterruptScope(mode)
                ready = threading.Event()
                future = scope.spawn(work, client, ready)
                if ready_by_server:
                    server.wait_requests(i + 1, BOUND)
                else:
                    ready.wait(BOUND)
                start = time.monotonic()
                scope.cancel("bench")
                try:
                    future.result(BOUND)
                except BaseException:
                    pass
                cid = server.requests[-1].connection
                if server.wait_closed(cid, BOUND):
                    latencies.append(server.close_times[cid] - start)
        finally:
            client.close()
    return Row(mode, "scope.cancel()", trials, latencies)


def wirecut_rows(trials: int) -> list[Row]:
    def chat_stream(client: ChatClient, ready: threading.Event) -> Any:
        return client.chat(MESSAGES, on_token=lambda _: ready.set())

    def chat_whole(client: ChatClient, ready: threading.Event) -> Any:
        return client.chat(MESSAGES, wire_stream=False)

    def sdk_stream(client: openai.OpenAI, ready: threading.Event) -> None:
        with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as s:
            for _ in s:
                ready.set()

    def sdk_whole(client: openai.OpenAI, ready: threading.Event) -> Any:
        return client.chat.completions.create(model="m", messages=MESSAGES)

    def sdk(url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=url, api_key="k", http_client=openai_http_client())

    def scoped_session(url: str) -> requests.Session:
        session = requests.Session()
        session.mount("http://", ScopedHTTPAdapter())
        return session

    def requests_get(session: requests.Session, ready: threading.Event) -> Any:
        return session.post(f"{session_url[0]}/chat/completions", json={})

    session_url: list[str] = []

    def make_session(url: str) -> requests.Session:
        session_url[:] = [url]
        return scoped_session(url)

    return [
        scoped_mode(
            "wirecut ChatClient, stream",
            first_chunk_then_stall,
            ChatClient,
            chat_stream,
            False,
            trials,
        ),
        scoped_mode(
            "wirecut ChatClient, wire non-stream", hold, ChatClient, chat_whole, True, trials
        ),
        scoped_mode(
            "openai SDK + adapter, stream", first_chunk_then_stall, sdk, sdk_stream, False, trials
        ),
        scoped_mode("openai SDK + adapter, non-stream", hold, sdk, sdk_whole, True, trials),
        scoped_mode("requests + ScopedHTTPAdapter", hold, make_session, requests_get, True, trials),
    ]


# -- baselines: what a host can do today ------------------------------------------


def baseline_mode(
    mode: str,
    cut: str,
    handler: Callable[[Exchange], None],
    make: Callable[[str], Any],
    work: Callable[[Any, str, int, threading.Event], Any],
    action: Callable[[Any], None],
    ready_by_server: bool,
    trials: int,
    window: float,
) -> Row:
    latencies: list[float] = []
    with LoopbackServer(handler) as server:
        clients = [make(server.url) for _ in range(trials)]
        readies = [threading.Event() for _ in range(trials)]
        threads = [
            threading.Thread(
                target=_quietly, args=(work, clients[i], server.url, i, readies[i]), daemon=True
            )
            for i in range(trials)
        ]
        for thread in threads:
            thread.start()
        if ready_by_server:
            server.wait_requests(trials, BOUND)
        else:
            for ready in readies:
                ready.wait(BOUND)
        starts = {}
        for i, client in enumerate(clients):
            starts[i] = time.monotonic()
            action(client)
        server.wait_closes(trials, window)
        trial_of = {r.connection: int(r.headers.get("x-trial", "-1")) for r in server.requests}
        for cid in list(server.closes):
            trial = trial_of.get(cid, -1)
            if trial in starts and server.close_times[cid] - starts[trial] <= window:
                latencies.append(server.close_times[cid] - starts[trial])
    # The server is gone: the abandoned workers woke up with errors.
    for thread in threads:
        thread.join(BOUND)
    for client in clients:
        _quietly(client.close)
    return Row(mode, cut, trials, latencies)


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        pass


def baseline_rows(trials: int, window: float) -> list[Row]:
    def httpx_stream(client: httpx.Client, url: str, i: int, ready: threading.Event) -> None:
        body = {"messages": MESSAGES, "stream": True}
        headers = {"x-trial": str(i)}
        with client.stream("POST", f"{url}/chat/completions", json=body, headers=headers) as r:
            for _ in r.iter_lines():
                ready.set()

    def sdk_stream(client: openai.OpenAI, url: str, i: int, ready: threading.Event) -> None:
        stream = client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, extra_headers={"x-trial": str(i)}
        )
        for _ in stream:
            ready.set()

    def httpx_whole(client: httpx.Client, url: str, i: int, ready: threading.Event) -> None:
        client.post(f"{url}/chat/completions", json={}, headers={"x-trial": str(i)})

    def sdk_whole(client: openai.OpenAI, url: str, i: int, ready: threading.Event) -> None:
        client.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers={"x-trial": str(i)}
        )

    def requests_post(session: requests.Session, url: str, i: int, ready: threading.Event) -> None:
        session.post(f"{url}/chat/completions", json={}, headers={"x-trial": str(i)})

    def plain_sdk(url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=url, api_key="k")

    def abandon(client: Any) -> None:
        pass

    def close(client: Any) -> None:
        client.close()

    rows = []
    plain_httpx = lambda url: httpx.Client(timeout=60)  # noqa: E731
    variants = [
        ("plain httpx, stream", first_chunk_then_stall, plain_httpx, httpx_stream, False),
        ("plain httpx, non-stream", hold, plain_httpx, httpx_whole, True),
        ("plain openai SDK, stream", first_chunk_then_stall, plain_sdk, sdk_stream, False),
        ("plain openai SDK, non-stream", hold, plain_sdk, sdk_whole, True),
    ]
    for mode, handler, make, work, ready_by_server in variants:
        for cut, action in (("abandon the thread", abandon), ("client.close() from host", close)):
            rows.append(
                baseline_mode(
                    mode, cut, handler, make, work, action, ready_by_server, trials, window
                )
            )
    for cut, action in (("abandon the thread", abandon), ("session.close() from host", close)):
        rows.append(
            baseline_mode(
                "plain requests, non-stream",
                cut,
                hold,
                lambda url: requests.Session(),
                requests_post,
                action,
                True,
                trials,
                window,
            )
        )
    return rows


# -- cancel -> the worker returned, before anything was sent ----------------------

#: A timeout none of these waits may reach: only the cut can end them early.
LONG = 60.0


def _pct(values: list[float], unit: float = 1000) -> tuple[str, str, str]:
    """p50, p99 and max of ``values`` (seconds) in ms (``unit`` 1e6: in µs)."""
    if not values:
        return "never", "never", "never"
    scaled = sorted(x * unit for x in values)
    p99 = scaled[min(len(scaled) - 1, round(0.99 * (len(scaled) - 1)))]
    return f"{statistics.median(scaled):.2f}", f"{p99:.2f}", f"{scaled[-1]:.2f}"


CLIENTS = [
    "wirecut ChatClient",
    "openai SDK + adapter",
    "requests + ScopedHTTPAdapter",
    "wirecut.http.client(Timeout(None))",
]


def _clients(url: str) -> dict[str, tuple[Callable[[], Any], Callable[[], None]]]:
    """One call per client, each with LONG timeouts, and how to close that client."""
    chat = ChatClient(url, timeout=LONG, connect_timeout=LONG)
    sdk = openai.OpenAI(
        base_url=url, api_key="k", http_client=openai_http_client(), timeout=LONG, max_retries=0
    )
    session = requests.Session()
    session.mount("http://", ScopedHTTPAdapter())
    session.mount("https://", ScopedHTTPAdapter())
    plain = wirecut.http.client(timeout=httpx.Timeout(None))
    calls: list[tuple[Callable[[], Any], Callable[[], None]]] = [
        (partial(chat.chat, MESSAGES), chat.close),
        (partial(sdk.chat.completions.create, model="m", messages=MESSAGES), sdk.close),
        (partial(session.get, url, timeout=LONG), session.close),
        (partial(plain.get, url), plain.close),
    ]
    return dict(zip(CLIENTS, calls, strict=True))


def _worker_return(call: Callable[[], Any], ready: Callable[[], bool]) -> float | None:
    scope = InterruptScope("bench")
    future = scope.spawn(call)
    if not ready():
        scope.cancel("bench")
        return None
    start = time.monotonic()
    scope.cancel("bench")
    try:
        future.result(LONG)
    except BaseException:
        pass
    return time.monotonic() - start


#: A row of the tables below: (client, blocked in, trials, seconds each).
Unsent = tuple[str, str, int, list[float]]


def unsent_rows(trials: int) -> list[Unsent]:
    rows: list[Unsent] = []
    for label in ("stalled TLS handshake", "full listen backlog"):
        for name in CLIENTS:
            latencies: list[float] = []
            for _ in range(trials):
                if label == "stalled TLS handshake":
                    with StallServer() as server:
                        clients = _clients(server.url)
                        took = _worker_return(
                            clients[name][0], lambda s=server: s.hello.wait(BOUND)
                        )
                        for _, close in clients.values():
                            close()
                else:
                    with FullBacklog() as backlog:
                        if not backlog.blocked:
                            break
                        started = connect_started(backlog.port)
                        clients = _clients(backlog.url)
                        took = _worker_return(clients[name][0], lambda e=started: e.wait(BOUND))
                        for _, close in clients.values():
                            close()
                if took is not None:
                    latencies.append(took)
            rows.append((name, label, trials, latencies))
    rows.extend(backoff_rows(max(3, trials // 4), trials))
    return rows


def backoff_rows(plain_trials: int, trials: int) -> list[Unsent]:
    """A cancel during the openai SDK's retry backoff (503, ``Retry-After: 2``)."""

    def busy(ex: Exchange) -> None:
        # Connection: close: the server sees the SDK finish with the answer,
        # which it does right before its backoff.
        ex.json({"error": "busy"}, 503, headers={"Retry-After": "2", "Connection": "close"})

    rows: list[Unsent] = []
    makers: list[tuple[str, Callable[[str], openai.OpenAI], int]] = [
        (
            "openai.OpenAI(http_client=openai_http_client())",
            lambda url: openai.OpenAI(base_url=url, api_key="k", http_client=openai_http_client()),
            plain_trials,
        ),
        ("openai_client()", lambda url: openai_client(base_url=url, api_key="k"), trials),
    ]
    for name, make, n in makers:
        latencies: list[float] = []
        for _ in range(n):
            with LoopbackServer(busy) as server:
                client = make(server.url)
                call = partial(client.chat.completions.create, model="m", messages=MESSAGES)
                took = _worker_return(call, lambda s=server: s.wait_closes(1, BOUND))
                client.close()
            if took is not None:
                latencies.append(took)
        rows.append((name, "SDK retry backoff (Retry-After: 2)", n, latencies))
    return rows


def pool_rows(trials: int) -> list[tuple[str, int, list[float]]]:
    """What the pool of a new scope costs to build: an SSL context each time, or shared."""
    transport = ScopedTransport()
    modes: list[tuple[str, Callable[[], Any]]] = [
        ("httpx.HTTPTransport() per scope (before)", httpx.HTTPTransport),
        ("ScopedTransport pool per scope (now)", transport._new_transport),
    ]
    rows = []
    for name, make in modes:
        times = []
        for _ in range(trials):
            start = time.perf_counter()
            made = make()
            times.append(time.perf_counter() - start)
            made.close()
        rows.append((name, trials, times))
    transport.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200, help="trials per wirecut mode")
    parser.add_argument("--baseline-trials", type=int, default=20, help="trials per baseline")
    parser.add_argument("--window", type=float, default=1.0, help="seconds to watch a baseline")
    parser.add_argument(
        "--unsent-trials", type=int, default=20, help="trials per client and blocking point"
    )
    parser.add_argument("--out", type=Path, help="write bench_http.json into this folder")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # Abandoned baseline clients warn as they are collected.
    rows = wirecut_rows(args.trials) + baseline_rows(args.baseline_trials, args.window)
    unsent = unsent_rows(args.unsent_trials)
    pools = pool_rows(50)
    made = Report(
        "bench_http",
        "Cancel -> the provider saw the close, per HTTP client",
        "A loopback server holds each request at a known point (non-stream: no response "
        "headers; stream: a first chunk, then nothing); the host cancels and the clock "
        "stops when the server's `recv()` sees the peer close: wirecut's `ChatClient`, the "
        "`openai` SDK and `requests` with wirecut's adapters, cut by `scope.cancel()`, "
        "against plain `httpx`, `openai` and `requests` whose host abandons the thread or "
        "closes the client from its own thread. Then cancel -> the worker returned while "
        "nothing was sent yet (a stalled TLS handshake, a full listen backlog, the SDK's "
        "retry backoff), and what a new scope's connection pool costs to build.",
    )
    closes = made.table(
        "Cancel -> the server saw the close",
        ["mode", "cut by", "trials", "closes seen", "p50", "p99", "max"],
        note=f"A baseline is watched {args.window:g} s for the close; never: none came in it.",
    )
    for row in rows:
        closes.add(*row.cells())
    before = made.table(
        "scope.cancel() -> the worker returned, nothing sent yet",
        ["client", "blocked in", "trials", "p50", "p99", "max"],
    )
    for name, label, trials, latencies in unsent:
        before.add(
            name, label, trials, *(f"{v} ms" if v != "never" else v for v in _pct(latencies))
        )
    pool = made.table(
        "Building the connection pool of a new scope", ["pool", "trials", "p50", "p99", "max"]
    )
    for name, trials, times in pools:
        pool.add(name, trials, *(f"{v} µs" for v in _pct(times, unit=1e6)))
    made.data = {
        "settings": {
            "trials": args.trials,
            "baseline_trials": args.baseline_trials,
            "window_s": args.window,
            "unsent_trials": args.unsent_trials,
        },
        "closes_s": [
            {"mode": r.mode, "cut": r.cut, "trials": r.trials, "latencies": r.latencies}
            for r in rows
        ],
        "unsent_s": [
            {"client": c, "blocked_in": b, "trials": n, "latencies": x} for c, b, n, x in unsent
        ],
        "pool_build_s": [{"pool": p, "trials": n, "times": x} for p, n, x in pools],
    }
    made.print()
    if args.out:
        made.write(args.out)


if __name__ == "__main__":
    main()
