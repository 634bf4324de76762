"""How much a hostile provider grows the console: a huge body, an endless SSE line.

Run: ``python bench/bench_provider_bounds.py [--body-mib 300] [--seconds 15]
[--before OLD/src] [--out DIR]``. For each case it starts ``wirecut serve`` (a real
process) against a loopback provider written here, runs one ``chat`` over
the WebSocket, and reads the server's resident memory from
``/proc/PID/status``: ``VmRSS`` before the chat, and the peak ``VmHWM`` by
the time the chat completed (or ``--seconds`` passed). The cases:

- ``body``: a non-streamed answer of ``--body-mib`` MiB (chunked, so that no
  ``Content-Length`` announces it), one long JSON string as the content;
- ``line``: an SSE stream whose first ``data:`` line never ends.

Each case runs with this checkout's code and, with ``--before`` (another
checkout's ``src``, e.g. main's), with that code too, side by side. Prints a
Markdown table (``--out DIR`` writes it as ``DIR/bench_provider_bounds.json``
for docs/benchmarks.md); asserts nothing (target: growth bounded by
``ResponseLimits``, about the 32 MiB body bound, whatever the provider
sends).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _console import ConsoleClient
from _procs import status_kib
from _report import Report

HERE = Path(__file__).resolve().parent.parent / "src"
MiB = 1 << 20
PIECE = b"x" * MiB


class HostileProvider:
    """A loopback HTTP/1.1 server: every POST gets ``mode``'s answer; GETs get 404."""

    def __init__(self, mode: str, body_mib: int) -> None:
        self.mode = mode
        self.body_mib = body_mib
        self.closed_by_peer = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
            if not head.startswith(b"POST"):
                conn.sendall(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                return
            try:
                self._answer(conn)
            except OSError:
                self.closed_by_peer.set()  # EPIPE/ECONNRESET: the client cut it.

    def _answer(self, conn: socket.socket) -> None:
        def chunk(data: bytes) -> None:
            conn.sendall(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        kind = "application/json" if self.mode == "body" else "text/event-stream"
        head = f"HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nTransfer-Encoding: chunked\r\n\r\n"
        conn.sendall(head.encode())
        if self.mode == "body":
            chunk(b'{"choices": [{"finish_reason": "stop", "message": {"content": "')
            for _ in range(self.body_mib):
                chunk(PIECE)
            chunk(b'"}}]}')
            conn.sendall(b"0\r\n\r\n")
            conn.recv(1)  # Until the client closes.
        else:
            chunk(b'data: {"choices": [{"delta": {"content": "')
            while not self._stop.is_set():
                chunk(PIECE)

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()


def run_case(src: Path, mode: str, body_mib: int, seconds: float) -> dict[str, Any]:
    provider = HostileProvider(mode, body_mib)
    data_dir = tempfile.mkdtemp(prefix="wirecut-bench-")
    env = {**os.environ, "PYTHONPATH": str(src)}
    for name in ("WIRECUT_PROVIDER_URL", "OPENAI_BASE_URL"):
        env.pop(name, None)
    serve = subprocess.Popen(
        [
            *(sys.executable, "-m", "wirecut", "serve", "--port", "0", "--no-token"),
            *("--data-dir", data_dir, "--provider-url", provider.url, "--command-timeout", "600"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert serve.stdout is not None
        serve.stdout.readline()
        info = json.loads((Path(data_dir) / "serve.json").read_text())
        ws_url = info["url"].replace("http://", "ws://") + "api/console"
        # No frame limit here: the old code streams the whole body as one token.
        with ConsoleClient(ws_url, max_size=None) as client:
            before = status_kib(serve.pid, "VmRSS")
            started = time.monotonic()
            id = client.run("chat hello")
            try:
                complete = client.complete(id, seconds)
                result = complete["status"] + ": " + (complete.get("error") or "")[:200]
            except TimeoutError:
                result = f"still reading after {seconds:g} s"
            took = time.monotonic() - started
            peak = status_kib(serve.pid, "VmHWM")
            client.cancel(id)
        cut = provider.closed_by_peer.wait(5)
    finally:
        serve.kill()
        serve.wait()
        assert serve.stdout is not None
        serve.stdout.close()
        provider.stop()
    return {
        "growth_mib": (peak - before) / 1024,
        "seconds": took,
        "result": result,
        "provider_saw_close": cut,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--body-mib", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=15.0, help="how long an endless case runs")
    parser.add_argument(
        "--before", type=Path, default=None, help="an older source tree to compare with"
    )
    parser.add_argument(
        "--out", type=Path, help="write bench_provider_bounds.json into this folder"
    )
    args = parser.parse_args()
    made = Report(
        "bench_provider_bounds",
        "A hostile provider against the console's memory",
        "`wirecut serve` (a process) runs one `chat` against a loopback provider that "
        "sends a huge non-streamed body (chunked, no `Content-Length`) or an SSE line that "
        "never ends: the server's peak resident memory (`VmHWM`) over its `VmRSS` before "
        "the chat, how the command ended, and whether the provider saw the client close. "
        "With `--before`, an older tree's code beside this one.",
    )
    table = made.table(
        "One chat against a hostile provider",
        ["case", "code", "result", "server RSS growth (peak)", "time", "provider saw the close"],
    )
    cases = [("body", f"{args.body_mib} MiB body"), ("line", "endless SSE line")]
    rows = []
    for mode, label in cases:
        trees = [("before", args.before)] if args.before is not None else []
        for name, src in [*trees, ("this tree", HERE)]:
            wait = args.seconds if mode == "line" else 120.0
            row = run_case(src, mode, args.body_mib, wait)
            print(f"{label}, {name}: {row['result']}", file=sys.stderr, flush=True)
            table.add(
                label,
                name,
                row["result"],
                f"+{row['growth_mib']:.0f} MiB",
                f"{row['seconds']:.1f} s",
                row["provider_saw_close"],
            )
            rows.append({"case": mode, "code": name, **row})
    made.data = {"settings": {"body_mib": args.body_mib, "seconds": args.seconds}, "rows": rows}
    made.print()
    if args.out:
        made.write(args.out)


if __name__ == "__main__":
    main()
