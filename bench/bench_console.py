"""Benchmark the console's cancel: through a real server, a real WebSocket and the simulator.

Run: ``python bench/bench_console.py [--samples 192]``. For each concurrency
(1, 16, 64 commands at once) it starts ``chat`` commands on one connection,
waits until every one of them is streaming tokens, sends a ``cancel`` for each
in one burst, and measures:

- cancel -> ``complete``: from sending the cancel frame to receiving that
  command's ``complete`` (the worker has returned by then: ``worker_exited``);
- cancel -> provider close: from sending the cancel to the moment the
  simulator saw the connection close (``t_disconnect`` in ``/sim/events``:
  ``time.monotonic()`` is CLOCK_MONOTONIC, one clock for every process of
  the machine). The k-th cancel of a burst is paired with the k-th close the
  simulator saw;
- workers leaked (``/api/health`` after each burst);
- the CPU the console ran from the first cancel to the last ``complete``
  (``/proc/PID/task/*/schedstat``), on all its threads and on the event loop
  alone, beside that burst's wall time: a burst whose CPU is its wall time
  is bound by the one GIL, not by a wait.

A row "64, one cancel-all" sends a single ``cancel`` frame without an id for
the 64 commands (the console cuts them all in one pass) and measures the same
from that one frame.

A last row, "64, library alone", is the floor on this machine: no console,
no agent, no WebSocket. In this process, 64 ``ChatClient`` streams from the
same simulator, each on a thread of its own ``InterruptScope``, are cancelled
by one loop of ``scope.cancel()``; "complete" there is the worker thread
having returned, and its CPU is this whole process's from the first cut to
the last return.

``--before SRC`` (a source tree of wirecut, e.g. a ``git worktree`` of an
older commit, its ``src`` folder) runs a second console from that tree beside
this one, and the bursts take turns between the two (``--rounds`` times
over), so that both sides meet the same machine; each row is then printed
for both, labelled by side.

Three processes, as in a deployment: the simulator (``wirecut provider``),
the console (``wirecut serve``) and this client. The simulator is itself a
single-threaded Python server: it reads 64 closes one after another, so its
``t_disconnect`` of the last one includes its own queue. Prints Markdown
tables (``--out DIR`` writes them as ``DIR/bench_console.json`` for
docs/benchmarks.md); asserts nothing (targets at 64: cancel -> complete p99
<= 25 ms, cancel -> provider close p99 <= 10 ms, 0 leaked).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _console import ConsoleClient
from _procs import Process, cpu_ms, percentile
from _report import Report
from wirecut.provider import ChatClient
from wirecut.scope import InterruptScope

CONCURRENCY = (1, 16, 64)


def sim_closes(sim_root: str, since: int, count: int) -> list[float]:
    """``t_disconnect`` of the next ``count`` peer_closed events (polled: another process)."""
    deadline = time.monotonic() + 10
    while True:
        events = httpx.get(f"{sim_root}/sim/events", params={"since": since}).json()
        closes = [e["detail"]["t_disconnect"] for e in events if e["kind"] == "peer_closed"]
        if len(closes) >= count or time.monotonic() > deadline:
            return sorted(closes)[:count]
        time.sleep(0.05)


def next_seq(sim_root: str) -> int:
    events = httpx.get(f"{sim_root}/sim/events", params={"since": 0}).json()
    return int(events[-1]["seq"]) + 1 if events else 0


def burst(
    console: Process, sim_root: str, client: ConsoleClient, n: int, rnd: int, at_once: bool
) -> dict[str, Any]:
    since = next_seq(sim_root)
    ids = [client.run("chat tell me everything", id=f"b{rnd}-{k}") for k in range(n)]
    for id in ids:
        client.wait_for(lambda f: f["type"] == "output", 30, id=id)
    cancelled_at = {}
    # This process only times the console: none of its own collections (it
    # keeps every frame, tens of thousands of objects) between a cancel sent
    # and the complete it reads.
    gc.collect()
    gc.disable()
    cpu_before = cpu_ms(console.proc.pid)
    try:
        if at_once:
            sent = time.monotonic()
            client.cancel()  # no id: every command of the connection
            cancelled_at = dict.fromkeys(ids, sent)
        else:
            for id in ids:
                cancelled_at[id] = time.monotonic()
                client.cancel(id)
        completes = client.completes(ids, 60)
        cpu_after = cpu_ms(console.proc.pid)
    finally:
        gc.enable()
    first_cancel = min(cancelled_at.values())
    last_complete = max(complete["_received"] for complete in completes.values())
    closes = sim_closes(sim_root, since, n)
    token = console.url.split("token=")[1]
    health = httpx.get(console.url.split("?")[0] + "api/health", params={"token": token}).json()
    return {
        "wall": (last_complete - first_cancel) * 1000,
        "cpu": cpu_after[0] - cpu_before[0],
        "loop_cpu": cpu_after[1] - cpu_before[1],
        "to_complete": [(completes[id]["_received"] - cancelled_at[id]) * 1000 for id in ids],
        "to_close": [
            (close - cancelled_at[id]) * 1000 for close, id in zip(closes, ids, strict=False)
        ],
        "never": n - len(closes),
        "exited": sum(1 for c in completes.values() if c["lifecycle"]["worker_exited"]),
        "leaked": health["workers"]["leaked"],
    }


def library_burst(sim_url: str, sim_root: str, n: int) -> dict[str, Any]:
    """The same burst without the console: ``ChatClient`` on scope threads, cut by ``cancel()``."""
    since = next_seq(sim_root)
    streaming = [threading.Event() for _ in range(n)]
    returned = [0.0] * n
    clients = [ChatClient(sim_url, model="sim", max_retries=0) for _ in range(n)]
    scopes = [InterruptScope(f"library-{k}") for k in range(n)]
    # The process's CPU when the last worker returned (its threads end, so
    # not schedstat: getrusage counts the threads that ended too).
    lock = threading.Lock()
    running = [n]
    cpu_at_end: list[float] = []

    def work(k: int) -> None:
        try:
            messages = [{"role": "user", "content": "tell me everything"}]
            clients[k].chat(messages, on_token=lambda _: streaming[k].set())
        finally:
            returned[k] = time.monotonic()
            with lock:
                running[0] -= 1
                if running[0] == 0:
                    cpu_at_end.append(_process_cpu_ms())

    futures = [scope.spawn(work, k) for k, scope in enumerate(scopes)]
    for event in streaming:
        event.wait(30)
    cpu_before = _process_cpu_ms()
    sent = time.monotonic()
    for scope in scopes:
        scope.cancel("bench")
    exited = 0
    for future, scope in zip(futures, scopes, strict=True):
        future.exception(60)
        exited += scope.wait_quiescent(10)
    for client in clients:
        client.close()
    closes = sim_closes(sim_root, since, n)
    return {
        "wall": (max(returned) - sent) * 1000,
        "cpu": cpu_at_end[0] - cpu_before,
        "loop_cpu": None,
        "to_complete": [(at - sent) * 1000 for at in returned],
        "to_close": [(close - sent) * 1000 for close in closes],
        "never": n - len(closes),
        "exited": exited,
        "leaked": n - exited,
    }


def _process_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1000


def _sim(n: int) -> Process:
    return Process(
        "provider",
        "--port",
        "0",
        "--slots",
        str(n),
        "--endless",
        "--tokens-per-second",
        "50",
        "--prompt-ms",
        "5",
    )


def _row(label: str, trials: int, results: list[dict[str, Any]], side: str) -> dict[str, Any]:
    to_complete = [ms for result in results for ms in result["to_complete"]]
    to_close = [ms for result in results for ms in result["to_close"]]
    return {
        "concurrency": label,
        "side": side,
        "trials": trials,
        "complete_p50": statistics.median(to_complete),
        "complete_p99": percentile(to_complete, 99),
        "close_p50": statistics.median(to_close),
        "close_p99": percentile(to_close, 99),
        # A burst's samples move together: over 15 bursts of 64, the ten
        # slowest samples (its p99) can all be one burst's; each burst's last too.
        "burst_last_complete": sorted(max(result["to_complete"]) for result in results),
        "burst_last_close": sorted(max(result["to_close"], default=0.0) for result in results),
        "burst_wall": statistics.median(result["wall"] for result in results),
        "burst_cpu": statistics.median(result["cpu"] for result in results),
        "burst_loop_cpu": (
            None
            if results[0]["loop_cpu"] is None
            else statistics.median(result["loop_cpu"] for result in results)
        ),
        # Whether the slowest burst was work (its CPU as long as its wall
        # time) or a wait (the process off a core, or waiting on a peer).
        "slowest_burst": max(
            ({k: result[k] for k in ("wall", "cpu", "loop_cpu")} for result in results),
            key=lambda burst: burst["wall"],
        ),
        "never": sum(result["never"] for result in results),
        "worker_exited": sum(result["exited"] for result in results),
        "leaked": max(result["leaked"] for result in results),
    }


def _console(sim_url: str, tmp: str, n: int, source: str | None) -> Process:
    """``wirecut serve`` over ``sim_url``, from ``source`` (a ``src`` folder) or this tree."""
    env = None
    if source is not None:
        env = dict(os.environ, PYTHONPATH=source)
    return Process(
        *("serve", "--port", "0", "--workers", str(n), "--data-dir", tmp),
        *("--provider-url", sim_url),
        env=env,
    )


def run(samples: int, sides: dict[str, str | None], rounds: int = 1) -> list[dict[str, Any]]:
    """The rows of each side (label -> source tree, None for this one), bursts interleaved."""
    rows = []
    for n, at_once in [*((n, False) for n in CONCURRENCY), (CONCURRENCY[-1], True)]:
        bursts = max(3, samples // n)
        results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for _ in range(rounds):
            sim = _sim(n)
            sim_root = sim.url.removesuffix("/v1")
            with contextlib.ExitStack() as stack:
                stack.callback(sim.stop)
                clients = {}
                for side, source in sides.items():
                    tmp = stack.enter_context(tempfile.TemporaryDirectory())
                    console = _console(sim.url, tmp, n, source)
                    stack.callback(console.stop)
                    ws_url = console.url.replace("http://", "ws://").replace(
                        "/?token=", "/api/console?token="
                    )
                    clients[side] = (console, stack.enter_context(ConsoleClient(ws_url)))
                for rnd in range(bursts):
                    for side, (console, client) in clients.items():
                        results[side].append(burst(console, sim_root, client, n, rnd, at_once))
        label = f"{n}, one cancel-all" if at_once else str(n)
        for side in sides:
            rows.append(_row(label, n * len(results[side]), results[side], side))
    n = CONCURRENCY[-1]
    sim = _sim(n)
    try:
        results_alone = [
            library_burst(sim.url, sim.url.removesuffix("/v1"), n)
            for _ in range(max(3, samples // n) * rounds)
        ]
    finally:
        sim.stop()
    rows.append(_row(f"{n}, library alone", n * len(results_alone), results_alone, "this tree"))
    return rows


def report(rows: list[dict[str, Any]]) -> Report:
    """The tables of ``rows``: latency, each burst's last, and the CPU a burst took."""
    made = Report(
        "bench_console",
        "The console's cancel, as deployed",
        "`wirecut provider`, `wirecut serve` and a WebSocket client, three processes: `chat` "
        "commands streaming at 50 tokens/s each are cancelled in bursts (a `cancel` frame "
        "each, or one cancel-all); cancel -> `complete` at the client, cancel -> the "
        'simulator seeing the close. "library alone": the same streams on `InterruptScope` '
        "threads of one process, no console.",
    )
    made.data["rows"] = rows
    latency = made.table(
        "Cancel latency",
        [
            "commands at once",
            "side",
            "trials",
            "cancel -> complete p50 / p99",
            "cancel -> provider close p50 / p99",
            "close never seen",
            "worker exited",
            "leaked",
        ],
    )
    for row in rows:
        latency.add(
            row["concurrency"],
            row["side"],
            row["trials"],
            f"{row['complete_p50']:.2f} / {row['complete_p99']:.2f} ms",
            f"{row['close_p50']:.2f} / {row['close_p99']:.2f} ms",
            row["never"],
            f"{row['worker_exited']}/{row['trials']}",
            row["leaked"],
        )
    cpu = made.table(
        "What a burst cost the console",
        [
            "commands at once",
            "side",
            "first cancel -> last complete, median burst",
            "console CPU a burst, median (library: its process)",
            "of it, the event loop",
            "slowest burst: wall / CPU",
        ],
        note="A burst whose CPU is its wall time is bound by the one GIL, not by a wait.",
    )
    for row in rows:
        slowest = row["slowest_burst"]
        loop = row["burst_loop_cpu"]
        cpu.add(
            row["concurrency"],
            row["side"],
            f"{row['burst_wall']:.2f} ms",
            f"{row['burst_cpu']:.2f} ms",
            "-" if loop is None else f"{loop:.2f} ms",
            f"{slowest['wall']:.2f} / {slowest['cpu']:.2f} ms",
        )
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=192, help="cancels per concurrency")
    parser.add_argument("--before", metavar="SRC", help="a wirecut source tree to run beside")
    parser.add_argument("--rounds", type=int, default=1, help="fresh processes, this many times")
    parser.add_argument("--out", type=Path, help="write bench_console.json into this folder")
    args = parser.parse_args()
    sides: dict[str, str | None] = {"this tree": None}
    if args.before:
        sides = {"before": args.before, "this tree": None}
    made = report(run(args.samples, sides, args.rounds))
    made.print()
    if args.out:
        made.write(args.out)


if __name__ == "__main__":
    main()
