"""Benchmark the console's memory over many commands: does a finished command leave anything?

Run: ``python bench/bench_serve_memory.py [--bursts 40] [--before OLD/src] [--out DIR]``.

One ``wirecut serve`` (a process; its RSS read from ``/proc/PID/status``)
over the simulator runs ``--bursts`` bursts of 64 ``chat`` commands, each
cancelled by its own ``cancel`` frame once streaming (``bench_console.py``'s
burst), and its RSS is read every five bursts. With ``--before`` (a source
tree, put first on ``PYTHONPATH``) the same runs first on that code, side by
side. Prints a Markdown table and the growth per command over the second
half of the run (the first half includes the allocator warming up);
``--out DIR`` writes them as ``DIR/bench_serve_memory.json`` for
docs/benchmarks.md. Target: no growth per finished command, beyond noise.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _procs import Process, status_kib
from _report import Report
from bench_console import ConsoleClient, _sim, burst

N = 64
EVERY = 5


def rss_mib(pid: int) -> float:
    return status_kib(pid, "VmRSS") / 1024


def run(bursts: int, source: str | None) -> list[tuple[int, float]]:
    """(commands run, serve RSS in MiB) every ``EVERY`` bursts, on ``source`` (None: this tree)."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = source
    sim = _sim(N)
    readings = []
    with tempfile.TemporaryDirectory() as tmp:
        console = Process(
            *("serve", "--port", "0", "--workers", str(N), "--data-dir", tmp),
            *("--provider-url", sim.url),
            env=env,
        )
        ws_url = console.url.replace("http://", "ws://").replace("/?token=", "/api/console?token=")
        try:
            readings.append((0, rss_mib(console.proc.pid)))
            with ConsoleClient(ws_url) as client:
                for rnd in range(bursts):
                    burst(console, sim.url.removesuffix("/v1"), client, N, rnd, False)
                    if (rnd + 1) % EVERY == 0:
                        readings.append(((rnd + 1) * N, rss_mib(console.proc.pid)))
        finally:
            console.stop()
            sim.stop()
    return readings


def per_command_kib(readings: list[tuple[int, float]]) -> float:
    (n0, m0), (n1, m1) = readings[len(readings) // 2], readings[-1]
    return (m1 - m0) * 1024 / (n1 - n0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bursts", type=int, default=40, help="bursts of 64 commands")
    parser.add_argument("--before", help="a source tree (its src/) to run first, side by side")
    parser.add_argument("--out", type=Path, help="write bench_serve_memory.json into this folder")
    args = parser.parse_args()
    if args.bursts < 2 * EVERY:
        parser.error(f"--bursts must be at least {2 * EVERY}: RSS is read every {EVERY} bursts")
    runs = {}
    if args.before:
        runs["before"] = run(args.bursts, args.before)
    runs["this tree"] = run(args.bursts, None)
    names = list(runs)
    made = Report(
        "bench_serve_memory",
        "The console's memory over many commands",
        f"One `wirecut serve` over the simulator runs bursts of {N} `chat` commands, each "
        "cancelled by its own `cancel` frame once streaming; its resident memory "
        f"(`VmRSS`) every {EVERY} bursts, and the growth per command over the second half "
        "of the run (the first half warms the allocator up). With `--before`, an older "
        "tree's code the same way, first.",
    )
    table = made.table(
        "serve's resident memory", ["commands run", *(f"serve RSS, {name}" for name in names)]
    )
    for k, (count, _) in enumerate(runs[names[0]]):
        table.add(count, *(f"{runs[name][k][1]:.0f} MiB" for name in names))
    growth = made.table("Growth per command over the second half", ["code", "per command"])
    for name in names:
        growth.add(name, f"{per_command_kib(runs[name]):.1f} KiB")
    made.data = {
        "settings": {"bursts": args.bursts, "commands_per_burst": N, "every": EVERY},
        "rss_mib": {name: runs[name] for name in names},
    }
    made.print()
    if args.out:
        made.write(args.out)


if __name__ == "__main__":
    main()
