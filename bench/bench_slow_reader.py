"""Benchmark the console's memory against clients that send and never read.

Run: ``python bench/bench_slow_reader.py [--seconds 45] [--before OLD/src] [--out DIR]``.

Two scenarios, each against a fresh ``wirecut serve`` (a process; its RSS is
read from ``/proc/PID/status``), once on the code at ``--before`` when given (a source
tree, put first on ``PYTHONPATH``) and once on this tree's code, side by side:

- **ping flood**: three clients send protocol pings (``{"type": "ping"}``) as
  fast as they can and never read; a client whose connection is cut connects
  again and goes on, as a hostile one would. For ``--seconds``.
- **memory list**: one client that never reads runs ``memory list`` on a
  5,000-note store in waves of 250 (the per-connection limit of live
  commands), until 3,000 were sent or ``--seconds`` passed; cut, it connects
  again for the next wave.

A non-reading client is a raw socket with a small receive buffer driving
websockets' sans-I/O protocol (``tests/_rawws.py``): nothing reads it, so
the kernel's buffers fill and the server's writes stall for real. Prints a
Markdown table: RSS at start, peak and final growth, how often the clients
were cut. Target (after): three non-reading clients for 45 s grow the
server by < 64 MiB. A run whose server grows past ``--cap-mib`` is stopped
early (the figure is then a lower bound, marked ``≥``): the machine is shared.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _procs import Process, status_kib
from _rawws import RawClient
from _report import Report

HERE = Path(__file__).resolve().parent
MIB = 1024 * 1024
PING = {"type": "ping"}
NOTES = 5000
LISTS = 3000
WAVE = 250


def rss(pid: int) -> int:
    return status_kib(pid, "VmRSS") * 1024


class Server:
    """``wirecut serve`` on ``src``'s code, in ``data``."""

    def __init__(self, src: Path, data: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(src)}
        env.pop("WIRECUT_TOKEN", None)
        self.process = Process(
            *("serve", "--port", "0", "--data-dir", str(data)),
            *("--provider-url", "http://127.0.0.1:9/v1"),
            env=env,
        )
        self.proc = self.process.proc
        self.url, self.token = self.process.url.split("?token=")
        self.ws_url = self.url.replace("http://", "ws://") + f"api/console?token={self.token}"

    def health(self) -> dict[str, Any]:
        params = {"token": self.token}
        result: dict[str, Any] = httpx.get(self.url + "api/health", params=params).json()
        return result

    def slow_readers(self) -> int | None:
        """Connections closed 4429 so far (None: this code has no such metric)."""
        text = httpx.get(self.url + "metrics", params={"token": self.token}).text
        for line in text.splitlines():
            if line.startswith('wirecut_connections_dropped_total{why="slow_reader"}'):
                return int(float(line.split()[-1]))
        return None

    def stop(self) -> None:
        self.process.stop()


class Sampler:
    """The server's RSS every 0.2 s; ``over_cap`` once it grew past ``cap``."""

    def __init__(self, pid: int, cap: int) -> None:
        self.pid = pid
        self.start = rss(pid)
        self.peak = self.start
        self.last = self.start
        self.cap = cap
        self.over_cap = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.last = rss(self.pid)
            except (OSError, RuntimeError):
                return
            self.peak = max(self.peak, self.last)
            if self.last - self.start > self.cap:
                self.over_cap.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def ping_flood(server: Server, seconds: float, stop: threading.Event) -> int:
    """Three clients ping without reading for ``seconds``; returns how often they were cut."""
    deadline = time.monotonic() + seconds
    cuts = [0, 0, 0]

    def client(k: int) -> None:
        while time.monotonic() < deadline and not stop.is_set():
            try:
                ws = RawClient(server.ws_url)
            except OSError:
                continue
            batch = ws.encode_many(PING, 5000)
            try:
                while time.monotonic() < deadline and not stop.is_set():
                    ws.sock.sendall(batch)
            except OSError:
                cuts[k] += 1
            finally:
                ws.abort()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(cuts)


def memory_lists(server: Server, seconds: float, stop: threading.Event) -> tuple[int, int]:
    """``memory list`` in waves, never reading; returns (lists sent, times cut)."""
    deadline = time.monotonic() + seconds
    sent = cuts = 0
    ws: RawClient | None = None
    while sent < LISTS and time.monotonic() < deadline and not stop.is_set():
        try:
            if ws is None:
                ws = RawClient(server.ws_url)
            for _ in range(min(WAVE, LISTS - sent)):
                ws.send({"type": "run", "id": f"l{sent}", "line": "memory list"})
                sent += 1
        except OSError:
            cuts += 1
            if ws is not None:
                ws.abort()
            ws = None
            continue
        # The next wave once this one is done (or the connection was cut and
        # its commands cancelled): the server's own state, polled.
        while time.monotonic() < deadline and not stop.is_set():
            workers = server.health()["workers"]
            if workers["busy"] == 0 and workers["queued"] == 0:
                break
            time.sleep(0.1)
    if ws is not None:
        ws.abort()
    return sent, cuts


def seed(src: Path, data: Path) -> None:
    notes = data / "notes.jsonl"
    line = {"title": "a note about something to remember " + "x" * 40, "body": "body " * 10}
    notes.write_text("".join(json.dumps(line) + "\n" for _ in range(NOTES)))
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run(
        [sys.executable, "-m", "wirecut", "memory", "import", str(notes), "--data-dir", str(data)],
        check=True,
        capture_output=True,
        env=env,
    )


def measure(label: str, src: Path, scenario: str, seconds: float, cap: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        if scenario == "memory list":
            seed(src, data)
        server = Server(src, data)
        try:
            server.health()  # warmed up: the app and its first request loaded
            sampler = Sampler(server.proc.pid, cap)
            started = time.monotonic()
            if scenario == "ping flood":
                cuts = ping_flood(server, seconds, sampler.over_cap)
                detail = ""
            else:
                sent, cuts = memory_lists(server, seconds, sampler.over_cap)
                detail = f"{sent} lists sent"
            elapsed = time.monotonic() - started
            sampler.stop()
            capped = sampler.over_cap.is_set()
            closed_4429 = server.slow_readers()
        finally:
            server.stop()
    return {
        "code": label,
        "scenario": scenario,
        "seconds": elapsed,
        "rss_start_mib": sampler.start / MIB,
        "peak_growth_mib": (sampler.peak - sampler.start) / MIB,
        "end_growth_mib": (sampler.last - sampler.start) / MIB,
        "capped": capped,
        "cuts": cuts,
        "closed_4429": closed_4429,
        "detail": detail,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument(
        "--before", type=Path, default=None, help="an older source tree to compare with"
    )
    parser.add_argument("--after", type=Path, default=HERE.parent / "src")
    parser.add_argument("--cap-mib", type=float, default=1536.0)
    parser.add_argument("--out", type=Path, help="write bench_slow_reader.json into this folder")
    args = parser.parse_args()
    rows = []
    for scenario in ("ping flood", "memory list"):
        trees = [("before", args.before)] if args.before is not None else []
        for label, src in [*trees, ("after", args.after)]:
            row = measure(label, src, scenario, args.seconds, int(args.cap_mib * MIB))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    made = Report(
        "bench_slow_reader",
        "The console's memory against clients that never read",
        "Three WebSocket clients send for `--seconds` and never read what comes back "
        "(a ping flood; `memory list` of a seeded store): the server's RSS at start, its "
        "peak and final growth, how many clients the server cut and how many of them by "
        f"close 4429 (outbox full). A growth marked >= hit the {args.cap_mib:.0f} MiB "
        "safety cap and was stopped early. With `--before`, an older tree beside this one.",
    )
    table = made.table(
        "Server memory under clients that do not read",
        [
            "scenario",
            "code",
            "seconds",
            "RSS at start",
            "peak growth",
            "growth at end",
            "clients cut",
            "of them closed 4429",
            "",
        ],
    )
    for row in rows:
        mark = ">= " if row["capped"] else ""
        table.add(
            row["scenario"],
            row["code"],
            f"{row['seconds']:.0f} s",
            f"{row['rss_start_mib']:.0f} MiB",
            f"{mark}{row['peak_growth_mib']:.0f} MiB",
            f"{mark}{row['end_growth_mib']:.0f} MiB",
            row["cuts"],
            "-" if row["closed_4429"] is None else row["closed_4429"],
            row["detail"],
        )
    made.data = {"settings": {"seconds": args.seconds, "cap_mib": args.cap_mib}, "rows": rows}
    made.print()
    if args.out:
        made.write(args.out)


if __name__ == "__main__":
    main()
