"""Benchmark the scope layer: the per-turn cost, and cancel -> blocked recv returned.

Run: ``python bench/bench_scope.py [--trials 1000] [--turns 200000] [--out DIR]``.

The per-turn cost is ``bind_scope`` + ``register`` + unregister of one agent
turn, in a loop of ``--turns`` (the best of three), on the wall clock and on
this thread's CPU time, beside the same loop doing nothing. The cut is
``scope.cancel()`` -> a ``recv()`` blocked on a registered socketpair in
another thread returned, ``--trials`` times. Prints a Markdown table
(``--out DIR`` writes it as ``DIR/bench_scope.json`` for docs/benchmarks.md);
asserts nothing (the targets are in the table: under 5 us per turn, p99 under
2 ms for the cut).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

from _procs import percentile
from _report import Report
from wirecut.scope import InterruptScope, bind_scope


class _Turn:
    def interrupt(self, reason: str) -> None:
        pass


def per_turn_cost(n: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds for bind + register + unregister of one agent turn, on ``clock``."""
    turn = _Turn()
    scope = InterruptScope("bench")
    started = clock()
    for _ in range(n):
        with bind_scope(scope), scope.register(turn):
            pass
    return (clock() - started) / n


def baseline_cost(n: int) -> float:
    """The same loop doing nothing, to show the loop's own cost."""
    started = time.perf_counter()
    for _ in range(n):
        pass
    return (time.perf_counter() - started) / n


def one_cut() -> float:
    """Seconds from cancel() to a blocked recv() returning, once."""
    scope = InterruptScope()
    a, b = socket.socketpair()
    registered = threading.Event()
    returned_at: list[float] = []

    def reader() -> None:
        with scope.register_socket(a):
            registered.set()
            a.recv(1)
            returned_at.append(time.perf_counter())

    thread = threading.Thread(target=reader)
    thread.start()
    registered.wait(5)
    # Let the reader enter recv(): the bench measures waking a blocked read.
    time.sleep(0.001)
    cancelled_at = time.perf_counter()
    scope.cancel()
    thread.join(5)
    a.close()
    b.close()
    return returned_at[0] - cancelled_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=200_000)
    parser.add_argument("--out", type=Path, help="write bench_scope.json into this folder")
    args = parser.parse_args()

    turn = min(per_turn_cost(args.turns) for _ in range(3))
    # The CPU time of this thread alone: the same cost, less what other
    # processes on a busy machine take from the wall clock.
    turn_cpu = min(per_turn_cost(args.turns, time.thread_time) for _ in range(3))
    empty = baseline_cost(args.turns)
    cuts_ms = [one_cut() * 1e3 for _ in range(args.trials)]
    made = Report(
        "bench_scope",
        "The scope layer",
        "What a scope costs an agent turn (bind + register + unregister, in a loop, "
        "beside an empty loop) and how fast `scope.cancel()` wakes a `recv()` blocked "
        "on a registered socket in another thread.",
    )
    table = made.table("The scope's cost and its cut", ["measure", "value", "target"])
    table.add("bind + register + unregister, one turn", f"{turn * 1e6:.2f} us", "< 5 us")
    table.add("(the same, this thread's CPU time)", f"{turn_cpu * 1e6:.2f} us", "")
    table.add("(empty loop iteration, for scale)", f"{empty * 1e6:.3f} us", "")
    for label, value, target in [
        (f"p50 ({args.trials} trials)", percentile(cuts_ms, 50), ""),
        ("p99", percentile(cuts_ms, 99), "< 2 ms"),
        ("max", max(cuts_ms), ""),
        ("mean", statistics.fmean(cuts_ms), ""),
    ]:
        table.add(f"cancel -> blocked recv() returned, {label}", f"{value:.3f} ms", target)
    made.data = {
        "settings": {"trials": args.trials, "turns": args.turns},
        "turn_us": turn * 1e6,
        "turn_cpu_us": turn_cpu * 1e6,
        "empty_loop_us": empty * 1e6,
        "cancel_to_recv_returned_ms": [round(ms, 4) for ms in cuts_ms],
    }
    made.print()
    if args.out:
        made.write(args.out)


if __name__ == "__main__":
    main()
