"""Cancel -> server-observed close, for wirecut's clients and for what a host can do today.

Run: ``python bench/bench_http.py [--trials 200] [--baseline-trials 20] [--window 1.0]``.
Prints a Markdown table and asserts nothing.

Every mode talks to a loopback server that holds the response at a known
blocking point: non-stream modes never get their response headers; stream
modes get a first chunk and then nothing. The clock starts when the host
cancels (after the worker reached that point) and stops when the server's
``recv()`` sees the peer close.

wirecut modes run their trials one after the other. Baseline modes (the host
abandons the worker thread, or closes the client from the host thread) run
their trials side by side and watch ``--window`` seconds for the close;
"never" means no close came in that window.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import httpx
import openai
import requests

from _loopback import Exchange, LoopbackServer
from wirecut.adapters import ScopedHTTPAdapter, openai_http_client
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
        fmt = "{:.2f}".format
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200, help="trials per wirecut mode")
    parser.add_argument("--baseline-trials", type=int, default=20, help="trials per baseline")
    parser.add_argument("--window", type=float, default=1.0, help="seconds to watch a baseline")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # Abandoned baseline clients warn as they are collected.
    began = time.monotonic()
    rows = wirecut_rows(args.trials) + baseline_rows(args.baseline_trials, args.window)
    header = ["mode", "cut by", "trials", "closes seen", "p50 ms", "p99 ms", "max ms"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row.cells()) + " |")
    print(f"\n{time.monotonic() - began:.1f} s in all; baseline window {args.window:.1f} s.")


if __name__ == "__main__":
    main()
