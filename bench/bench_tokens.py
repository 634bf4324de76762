"""Benchmark the CPU a relayed token costs: in the console and in the proxy.

Run: ``python bench/bench_tokens.py [--streams 16] [--rate 100] [--window 5]
[--rounds 3] [--before SRC] [--out FILE]``.

The simulator (a process of its own) streams ``--streams`` endless replies
at ``--rate`` tokens/s each. Through the console: one WebSocket client runs
that many ``chat`` commands on ``wirecut serve`` (provider stream -> agent
-> runner output -> WebSocket frame); through the proxy: that many
streaming chat completions through ``wirecut proxy`` (upstream stream ->
relay -> client), read by this process. Once every stream is flowing, the
server's CPU (all its threads, ``/proc/PID/task/*/schedstat``) is read over
``--window`` seconds, and so are the tokens the simulator decoded for its
slots; the figure is microseconds of the server's CPU per token. The
simulator and this client's own CPU are not counted.

``--before SRC`` (a wirecut ``src`` folder, e.g. of a ``git worktree`` at an
older commit) runs the same servers from that tree, the two sides taking
turns within each round, so that both meet the same machine. Prints Markdown
tables (``--out DIR`` writes them as ``DIR/bench_tokens.json`` for
docs/benchmarks.md); asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _console import ConsoleClient
from _procs import Process, cpu_ms
from _report import Report


def decoded(sim_root: str) -> int:
    """Tokens the simulator's slots decoded so far (each stream keeps its slot)."""
    slots = httpx.get(f"{sim_root}/slots").json()
    return sum(int(slot["n_decoded"]) for slot in slots)


def window_cost(pid: int, sim_root: str, seconds: float) -> tuple[float, int]:
    """(server CPU ms, tokens decoded) over ``seconds`` of steady streaming."""
    cpu_before, tokens_before = cpu_ms(pid)[0], decoded(sim_root)
    time.sleep(seconds)  # the measurement window itself, not a wait for a state
    cpu_after, tokens_after = cpu_ms(pid)[0], decoded(sim_root)
    return cpu_after - cpu_before, tokens_after - tokens_before


def _env(source: str | None) -> dict[str, str] | None:
    return None if source is None else dict(os.environ, PYTHONPATH=source)


def through_console(sim_url: str, streams: int, seconds: float, source: str | None) -> float:
    """Microseconds of ``wirecut serve``'s CPU per token, ``streams`` chats at once."""
    sim_root = sim_url.removesuffix("/v1")
    with tempfile.TemporaryDirectory() as tmp:
        console = Process(
            *("serve", "--port", "0", "--workers", str(streams), "--data-dir", tmp),
            *("--provider-url", sim_url),
            env=_env(source),
        )
        try:
            ws_url = console.url.replace("http://", "ws://").replace(
                "/?token=", "/api/console?token="
            )
            with ConsoleClient(ws_url) as client:
                ids = [client.run("chat tell me everything") for _ in range(streams)]
                for id in ids:
                    client.wait_for(lambda f: f["type"] == "output", 30, id=id)
                cpu, tokens = window_cost(console.proc.pid, sim_root, seconds)
                client.cancel()
                client.completes(ids, 60)
        finally:
            console.stop()
    return cpu * 1000 / max(tokens, 1)


def through_proxy(sim_url: str, streams: int, seconds: float, source: str | None) -> float:
    """Microseconds of ``wirecut proxy``'s CPU per token, ``streams`` streams at once."""
    sim_root = sim_url.removesuffix("/v1")
    with tempfile.TemporaryDirectory() as tmp:
        proxy = Process(
            *("proxy", "--port", "0", "--upstream", sim_url, "--data-dir", tmp),
            env=_env(source),
        )
        try:
            with _streams(proxy.url, streams) as started:
                assert started.wait(60), "the proxy's streams did not all start"
                cpu, tokens = window_cost(proxy.proc.pid, sim_root, seconds)
        finally:
            proxy.stop()
    return cpu * 1000 / max(tokens, 1)


@contextlib.contextmanager
def _streams(base_url: str, count: int) -> Iterator[threading.Event]:
    """``count`` streaming chat completions read in a thread's event loop, until the block ends."""
    started = threading.Event()
    stop = threading.Event()

    async def one(client: httpx.AsyncClient, flowing: list[int]) -> None:
        body = {
            "model": "sim",
            "stream": True,
            "max_tokens": 1_000_000,
            "messages": [{"role": "user", "content": "tell me everything"}],
        }
        async with client.stream("POST", f"{base_url}/chat/completions", json=body) as response:
            first = True
            async for _ in response.aiter_raw():
                if first:
                    first = False
                    flowing.append(1)
                    if len(flowing) == count:
                        started.set()
                if stop.is_set():
                    return

    async def main() -> None:
        limits = httpx.Limits(max_connections=count + 8)
        async with httpx.AsyncClient(timeout=None, limits=limits) as client:
            flowing: list[int] = []
            tasks = [asyncio.create_task(one(client, flowing)) for _ in range(count)]
            await asyncio.to_thread(stop.wait)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    try:
        yield started
    finally:
        stop.set()
        thread.join(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--rate", type=float, default=100.0, help="tokens/s of each stream")
    parser.add_argument("--window", type=float, default=5.0, help="seconds measured a run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", metavar="SRC", help="a wirecut source tree to run beside")
    parser.add_argument("--only", choices=["console", "proxy"], default=None)
    parser.add_argument("--out", type=Path, help="write bench_tokens.json into this folder")
    args = parser.parse_args()
    sides: dict[str, str | None] = {"this tree": None}
    if args.before:
        sides = {"before": args.before, "this tree": None}
    servers = {"console": through_console, "proxy": through_proxy}
    if args.only:
        servers = {args.only: servers[args.only]}
    found: dict[tuple[str, str], list[float]] = {}
    sim = Process(
        *("provider", "--port", "0", "--slots", str(args.streams), "--endless"),
        *("--tokens-per-second", str(args.rate), "--prompt-ms", "5"),
    )
    try:
        for _ in range(args.rounds):
            for server, measure in servers.items():
                for side, source in sides.items():
                    us = measure(sim.url, args.streams, args.window, source)
                    found.setdefault((server, side), []).append(us)
                    print(f"{server}, {side}: {us:.1f} us/token", file=sys.stderr)
    finally:
        sim.stop()
    made = Report(
        "bench_tokens",
        "The CPU a relayed token costs",
        f"{args.streams} endless streams from the simulator at {args.rate:g} tokens/s each, "
        "through `wirecut serve` (provider stream -> agent -> runner output -> WebSocket "
        "frame) and through `wirecut proxy` (upstream stream -> relay -> client); the "
        "server's CPU over a window of steady streaming, per token the simulator decoded.",
    )
    table = made.table(
        "Server CPU per relayed token",
        ["server", "side", f"median of {args.rounds}", "runs"],
    )
    for (server, side), values in found.items():
        table.add(
            server,
            side,
            f"{statistics.median(values):.1f} us",
            ", ".join(f"{v:.0f}" for v in values),
        )
    if args.before:
        ratios = made.table("Against the older tree", ["server", "less CPU per token"])
        for server in servers:
            before = statistics.median(found[(server, "before")])
            now = statistics.median(found[(server, "this tree")])
            ratios.add(server, f"{before / now:.2f}x")
    made.data = {
        "settings": {"streams": args.streams, "rate": args.rate, "window_s": args.window},
        "runs": {f"{server}, {side}": values for (server, side), values in found.items()},
    }
    made.print()
    if args.out:
        made.write(args.out)


if __name__ == "__main__":
    main()
