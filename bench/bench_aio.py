"""Cancel an asyncio task blocked in a model request: ``wirecut.aio.run_sync`` and the usual APIs.

Run: ``python bench/bench_aio.py [--trials 32] [--window 1.0] [--out DIR]``.
Prints a Markdown table (``--out DIR`` writes it as ``DIR/bench_aio.json``
for docs/benchmarks.md) and asserts nothing.

The simulator (``wirecut provider``, its own process, 64 slots) streams at
400 tokens/s up to ``max_tokens`` 400. Each trial starts N tasks at once,
each awaiting a streaming ``ChatClient.chat`` on a thread through one API;
once every request has its first token, the host cancels every task. The
clock runs from the cancel to the ``await`` raising; then the simulator's
event log says whether it saw each client close (within ``--window``
seconds), and the thread's own flag whether it was still running when the
``await`` returned. ``asyncio.to_thread``, ``run_in_executor`` and anyio's
``abandon_on_cancel`` abandon the thread: the request decodes on to its end.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio.to_thread
import httpx

from _procs import Process, percentile
from _report import Report
from wirecut.aio import run_sync
from wirecut.provider import ChatClient

MESSAGES: Any = [{"role": "user", "content": "tell me a long story"}]
MAX_TOKENS = 400
BOUND = 10.0

Runner = Callable[[Callable[[], Any]], Awaitable[Any]]


def _systems(pool: ThreadPoolExecutor) -> dict[str, Runner]:
    async def in_executor(fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn)

    async def anyio_abandon(fn: Callable[[], Any]) -> Any:
        return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)

    return {
        "wirecut.aio.run_sync": run_sync,
        "asyncio.to_thread": asyncio.to_thread,
        "loop.run_in_executor": in_executor,
        "anyio abandon_on_cancel": anyio_abandon,
    }


SYSTEMS = [
    "wirecut.aio.run_sync",
    "asyncio.to_thread",
    "loop.run_in_executor",
    "anyio abandon_on_cancel",
]


class Sim:
    """The simulator as a process, read through ``/sim/events``."""

    def __init__(self) -> None:
        self.process = Process(
            "provider",
            "--port",
            "0",
            "--slots",
            "64",
            "--tokens-per-second",
            "400",
            "--prompt-ms",
            "5",
            "--endless",
        )
        self.base_url = self.process.url
        self.root = self.base_url.removesuffix("/v1")
        self.http = httpx.Client(timeout=BOUND)

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        return self.http.get(f"{self.root}/sim/events", params={"since": since}).json()  # type: ignore[no-any-return]

    def next_seq(self) -> int:
        events = self.events()
        return int(events[-1]["seq"]) + 1 if events else 0

    def wait_idle(self) -> None:
        deadline = time.monotonic() + 30
        while any(slot["is_processing"] for slot in self.http.get(f"{self.root}/slots").json()):
            if time.monotonic() > deadline:
                raise RuntimeError("the simulator never went idle")
            time.sleep(0.05)

    def stop(self) -> None:
        self.http.close()
        self.process.stop()


async def _trial(
    name: str, client: ChatClient, at_once: int, sim: Sim, window: float
) -> tuple[list[float], int, float]:
    """One burst: (cancel -> returned, s, each), threads still running at return, cancel time.

    The loop stays up until the abandoned requests ended by themselves: a
    closed loop would make their ``on_token`` raise and end them early.
    """
    loop = asyncio.get_running_loop()
    # One pool for the executor APIs, asyncio.to_thread's too (asyncio.run
    # shuts it down at the end): as large as a burst, like anyio's.
    pool = ThreadPoolExecutor(64)
    loop.set_default_executor(pool)
    runner = _systems(pool)[name]
    started = [asyncio.Event() for _ in range(at_once)]
    finished = [threading.Event() for _ in range(at_once)]

    def work(i: int) -> Any:
        try:
            return client.chat(
                MESSAGES,
                on_token=lambda _: _notify(loop, started[i]),
                max_tokens=MAX_TOKENS,
            )
        finally:
            finished[i].set()

    tasks = [asyncio.create_task(runner(lambda i=i: work(i))) for i in range(at_once)]  # type: ignore[misc]
    async with asyncio.timeout(BOUND):
        await asyncio.gather(*(event.wait() for event in started))
    cancelled_at = time.monotonic()
    for task in tasks:
        task.cancel()
    latencies: list[float] = []
    still_running = 0

    async def watch(i: int, task: asyncio.Task[Any]) -> None:
        nonlocal still_running
        try:
            await task
        except asyncio.CancelledError:
            pass
        latencies.append(time.monotonic() - cancelled_at)
        still_running += not finished[i].is_set()

    await asyncio.gather(*(watch(i, task) for i, task in enumerate(tasks)))
    await asyncio.sleep(window)  # The observation window itself.
    await asyncio.to_thread(sim.wait_idle)  # The abandoned requests decode to their end.
    return latencies, still_running, cancelled_at


def _notify(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    if not event.is_set():
        loop.call_soon_threadsafe(event.set)


def _row(sim: Sim, name: str, at_once: int, trials: int, window: float) -> dict[str, Any]:
    latencies: list[float] = []
    still_running = 0
    closes = 0
    with ChatClient(sim.base_url, timeout=60) as client:
        for _ in range(max(1, trials // at_once)):
            since = sim.next_seq()
            got, running, cancelled_at = asyncio.run(_trial(name, client, at_once, sim, window))
            latencies += got
            still_running += running
            for event in sim.events(since):
                if event["kind"] == "peer_closed":
                    t = event["detail"].get("t_disconnect") or event["t"]
                    closes += t - cancelled_at <= window
    return {
        "api": name,
        "at_once": at_once,
        "trials": len(latencies),
        "cancel_to_returned_ms": [round(x * 1000, 4) for x in latencies],
        "provider_saw_close": closes,
        "still_running": still_running,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--window", type=float, default=1.0)
    parser.add_argument("--out", type=Path, help="write bench_aio.json into this folder")
    args = parser.parse_args()
    sim = Sim()
    rows = []
    try:
        for at_once in (1, 16):
            for name in SYSTEMS:
                rows.append(_row(sim, name, at_once, args.trials, args.window))
    finally:
        sim.stop()
    made = Report(
        "bench_aio",
        "Cancelling an asyncio task blocked in a model request",
        "Tasks each awaiting a streaming `ChatClient.chat` on a thread, through "
        "`wirecut.aio.run_sync`, `asyncio.to_thread`, `loop.run_in_executor` or anyio's "
        "`abandon_on_cancel`, cancelled once every request has its first token (the "
        "simulator, its own process, streaming at 400 tokens/s): cancel -> the `await` "
        "raised, whether the simulator saw the client close within the window, and "
        "whether the thread was still running when the `await` returned.",
    )
    table = made.table(
        "Cancel -> the await returned",
        [
            "API",
            "tasks at once",
            "trials",
            "cancel -> await returned p50 / p99",
            f"provider saw the close (<= {args.window:g} s)",
            "thread still running at return",
        ],
    )
    for row in rows:
        ms, n = row["cancel_to_returned_ms"], row["trials"]
        p50, p99 = percentile(ms, 50), percentile(ms, 99)
        table.add(
            row["api"],
            row["at_once"],
            n,
            f"{p50:.2f} / {p99:.2f} ms" if p50 is not None and p99 is not None else "-",
            f"{row['provider_saw_close']}/{n}",
            f"{row['still_running']}/{n}",
        )
    made.data = {
        "settings": {"trials": args.trials, "window_s": args.window, "max_tokens": MAX_TOKENS},
        "rows": rows,
    }
    made.print()
    if args.out:
        made.write(args.out)


if __name__ == "__main__":
    main()
