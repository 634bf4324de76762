"""Chats cancelled while they wait for a slot: does llama.cpp still start them?

Run: ``python bench/bench_console_queue.py [--trials 3] [--out DIR]``.
Needs the extra ``local``. Prints a Markdown table and asserts nothing.

The console as ``wirecut serve`` runs it by default: four workers in front of
the embedded llama.cpp (``wirecut.local.LocalServer``, two slots). Per trial:
two chats run (each streams a long story), two more are sent and, one second
after they started, cancelled, then the first two are cancelled. llama.cpp
starts a queued request whose client already left (docs/architecture.md,
fact 11): each such start is a prompt pass for nobody. Measured from
llama.cpp's own ``/metrics``:

- queued in llama.cpp: ``requests_deferred`` while the two wait (requests
  the console had handed to the engine beyond its slots);
- dead starts: prompt tokens llama.cpp took up (``prompt_tokens_total`` plus
  ``prompt_tokens_cached_total``) from the cancel of the waiting chats until
  it is idle again, in chats' worth (a waiting chat's prompt is as long as a
  running one's).

Point ``PYTHONPATH`` at another tree's ``src`` to measure that tree (the
script uses only what both sides of the change have).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import httpx

from _report import Report
from wirecut.client import ConsoleClient
from wirecut.console.server import ConsoleConfig, ConsoleServer
from wirecut.launch import Provider
from wirecut.local import LocalServer, is_available

#: Seconds the waiting chats are left waiting before their cancel.
WAIT = 1.0
#: Seconds llama.cpp gets to become idle after the last cut.
SETTLE = 30.0


def _metrics(root: str) -> dict[str, float]:
    text = httpx.get(root + "/metrics", timeout=10).text
    found = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            name, _, value = line.partition(" ")
            found[name.removeprefix("llamacpp:")] = float(value)
    return found


def _prompt_tokens(root: str) -> float:
    m = _metrics(root)
    return m["prompt_tokens_total"] + m["prompt_tokens_cached_total"]


def _idle(root: str, bound: float) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        m = _metrics(root)
        if m["requests_processing"] == 0 and m["requests_deferred"] == 0:
            return True
        time.sleep(0.2)
    return False


def _line(i: int) -> str:
    return f"chat Tell me a long story about the lighthouse number {i}."


def _trial(client: ConsoleClient, root: str, trial: int) -> tuple[int, float, float]:
    before = _prompt_tokens(root)
    running = [client.run(_line(100 * trial + i)) for i in range(2)]
    for id in running:
        client.wait_for(lambda f: f["type"] == "output" and f["stream"] == "token", 120, id=id)
    per_chat = (_prompt_tokens(root) - before) / 2
    waiting = [client.run(_line(100 * trial + i)) for i in range(2, 4)]
    for id in waiting:
        client.wait_for(lambda f: f["type"] == "started", 30, id=id)
    time.sleep(WAIT)  # a benchmark: time for the requests to reach the engine, if they go
    deferred = int(_metrics(root)["requests_deferred"])
    at_cancel = _prompt_tokens(root)
    for id in waiting:
        client.cancel(id)
    client.completes(set(waiting), 30)
    for id in running:
        client.cancel(id)
    client.completes(set(running), 30)
    if not _idle(root, SETTLE):
        print(
            f"trial {trial}: llama.cpp was not idle {SETTLE:.0f} s after the cuts", file=sys.stderr
        )
    dead = _prompt_tokens(root) - at_cancel
    return deferred, dead, per_chat


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--label", default="this tree")
    args = parser.parse_args()
    if not is_available():
        print("needs the extra `local`: pip install 'wirecut[local]'", file=sys.stderr)
        return 2
    report = Report(
        "bench_console_queue",
        "Chats cancelled while they wait for a slot (embedded llama.cpp, 2 slots, 4 workers)",
        " ".join(__doc__.split("\n\n")[2].split()),
    )
    table = report.table(
        f"Per trial ({args.label})",
        ["trial", "queued in llama.cpp", "dead prompt tokens", "dead starts (chats' worth)"],
    )
    with LocalServer("smollm2") as server, tempfile.TemporaryDirectory() as tmp:
        root = server.url
        fields = {f.name for f in dataclasses.fields(Provider)}
        extra = {"slots": server.n_parallel} if "slots" in fields else {}
        provider = Provider(server.base_url, server.model, "embedded llama.cpp", **extra)
        config = ConsoleConfig(port=0, data_dir=Path(tmp), workers=4)
        with ConsoleServer(config, provider) as console, ConsoleClient(console.ws_url) as client:
            for trial in range(1, args.trials + 1):
                deferred, dead, per_chat = _trial(client, root, trial)
                table.add(trial, deferred, int(dead), round(dead / per_chat, 1))
    report.print()
    if args.out is not None:
        report.write(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
