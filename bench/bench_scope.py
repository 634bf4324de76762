"""Benchmark the scope layer: the per-turn cost, and cancel -> blocked recv returned.

Run: ``python bench/bench_scope.py [--trials 1000]``. Prints a Markdown table;
asserts nothing (targets are checked by reading it: under 5 us per turn, p99
under 2 ms for the cut).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time
from collections.abc import Callable

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


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=200_000)
    args = parser.parse_args()

    turn = min(per_turn_cost(args.turns) for _ in range(3))
    # The CPU time of this thread alone: the same cost, less what other
    # processes on a busy machine take from the wall clock.
    turn_cpu = min(per_turn_cost(args.turns, time.thread_time) for _ in range(3))
    empty = baseline_cost(args.turns)
    cuts = [one_cut() for _ in range(args.trials)]
    print("| measure | value | target |")
    print("|---|---|---|")
    print(f"| bind + register + unregister, one turn | {turn * 1e6:.2f} us | < 5 us |")
    print(f"| (the same, this thread's CPU time) | {turn_cpu * 1e6:.2f} us | |")
    print(f"| (empty loop iteration, for scale) | {empty * 1e6:.3f} us | |")
    print(
        f"| cancel -> blocked recv() returned, p50 ({args.trials} trials) "
        f"| {percentile(cuts, 0.5) * 1e3:.3f} ms | |"
    )
    print(
        f"| cancel -> blocked recv() returned, p99 | {percentile(cuts, 0.99) * 1e3:.3f} ms "
        "| < 2 ms |"
    )
    print(f"| cancel -> blocked recv() returned, max | {max(cuts) * 1e3:.3f} ms | |")
    print(f"| (mean) | {statistics.fmean(cuts) * 1e3:.3f} ms | |")


if __name__ == "__main__":
    main()
