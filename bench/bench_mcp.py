"""Cancel MCP tool calls: wirecut's ``MCPServer``, the SDK's own, and an ``async def`` tool.

Run: ``python bench/bench_mcp.py [--trials 100] [--window 0.3] [--out FILE.json]``.
Prints a Markdown table (and writes JSON with ``--out``); asserts nothing.

Three servers serve the same three tools (examples/mcp_server.py): wirecut's
``MCPServer`` and the SDK's ``MCPServer`` run the example's sync tools; the
third is the SDK running ``async def`` versions of them, written with care
(httpx's async client, ``anyio.open_process`` in a session of its own whose
group is killed on the way out, ``anyio.sleep``): the SDK's best case. The
client is the SDK's, in this process over the SDK's in-memory transport
(the handshake-era JSON-RPC dispatch, so a cancel is a real
``notifications/cancelled``).

Each trial calls one tool, waits until it runs (its upstream request
arrived, its process tree wrote its pids, its sleep began), then cancels the
call. The clock runs from the cancel to: the tool's function returning (its
thread, or coroutine, leaving it), the loopback upstream seeing the client's
close (``fetch``), every process of the tree exiting (``run``, a pidfd each).
What has not happened ``--window`` seconds after the cancel never happened
for that trial: it counts in "ran on", and the bench then ends the work
itself (answers the upstream, kills the tree, lets the sleep end). "server
confirmed" counts the calls whose stop the server reported (the ``wirecut``
log notification).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import inspect
import json
import os
import platform
import select
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
import anyio.to_thread
import httpx
from mcp import Client
from mcp.server.mcpserver import MCPServer as PlainMCPServer
from mcp_types import LoggingMessageNotificationParams

from _procs import percentile
from wirecut import __version__
from wirecut.loopback import LoopbackExchange, LoopbackServer
from wirecut.mcp import LOGGER, StopFacts

ROOT = Path(__file__).resolve().parent.parent
BOUND = 10.0


def _load_example() -> Any:
    path = ROOT / "examples" / "mcp_server.py"
    spec = importlib.util.spec_from_file_location("mcp_server_example", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = _load_example()


# -- the trial's probe: what the tool did, and when --------------------------------------


@dataclass
class Probe:
    """One call as its tool saw it; written from the tool's thread or task."""

    entered: threading.Event = field(default_factory=threading.Event)
    exited: threading.Event = field(default_factory=threading.Event)
    exited_at: float | None = None

    def leave(self) -> None:
        self.exited_at = time.monotonic()
        self.exited.set()


_probe = Probe()  # The running trial's; trials run one at a time.


def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` that tells the running trial's probe when it entered and left."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def coroutine(*args: Any, **kwargs: Any) -> Any:
            probe = _probe
            probe.entered.set()
            try:
                return await fn(*args, **kwargs)
            finally:
                probe.leave()

        return coroutine

    @functools.wraps(fn)
    def function(*args: Any, **kwargs: Any) -> Any:
        probe = _probe
        probe.entered.set()
        try:
            return fn(*args, **kwargs)
        finally:
            probe.leave()

    return function


# -- the async tools: the SDK's best case --------------------------------------------


async def fetch(url: str) -> str:
    """HTTP GET ``url``; the status line and (at most 64 KiB of) the body."""
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.get(url)
    return f"{response.status_code} {response.reason_phrase}\n{response.text[: 64 * 1024]}"


async def run(argv: list[str]) -> str:
    """Run ``argv`` (and whatever it starts); its exit code."""
    # Shielded: a cancel inside open_process kills the leader alone, and
    # what it started already would stay.
    with anyio.CancelScope(shield=True):
        process = await anyio.open_process(argv, start_new_session=True)
    try:
        await process.wait()
        return f"exit {process.returncode}"
    finally:
        # The whole group, also once its leader is gone (anyio kills only
        # the leader when a wait is cancelled): nothing it started stays.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with anyio.CancelScope(shield=True):
            await process.aclose()


async def wait(seconds: float) -> str:
    """Wait ``seconds``."""
    await anyio.sleep(seconds)
    return f"waited {seconds} s"


def _servers() -> dict[str, Any]:
    asynchronous: PlainMCPServer[Any] = PlainMCPServer("async-tools", log_level="WARNING")
    for tool in (fetch, run, wait):
        asynchronous.add_tool(timed(tool))
    return {
        "wirecut MCPServer, def tools": example.build(wrap=timed),
        "SDK MCPServer, def tools": example.build(plain=True, wrap=timed),
        "SDK MCPServer, async def tools": asynchronous,
    }


# -- one trial ------------------------------------------------------------------------


@dataclass
class Outcome:
    exit_ms: float | None = None
    close_ms: float | None = None
    gone_ms: float | None = None
    confirmed: bool = False


class Upstream:
    """A loopback server whose answers wait until the bench releases them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._release: threading.Event = threading.Event()
        self.server = LoopbackServer(self._handle, name="bench-upstream")

    def _handle(self, exchange: LoopbackExchange) -> None:
        with self._lock:
            release = self._release
        # Read until the client closes (a cut: the close is recorded as it
        # comes), or answer once the bench releases the request.
        deadline = time.monotonic() + BOUND * 3
        while not release.is_set() and time.monotonic() < deadline:
            if exchange.await_close(0.02):
                return
        exchange.respond(200, b"the whole body", content_type="text/plain")

    def next_trial(self) -> threading.Event:
        with self._lock:
            self._release.set()
            self._release = threading.Event()
            return self._release


def _wait_gone(pids: list[int], until: float) -> float | None:
    """When the last of ``pids`` exited (monotonic), or None if one lives on past ``until``."""
    last = 0.0
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            last = max(last, time.monotonic())
            continue
        try:
            if not select.select([fd], [], [], max(0.0, until - time.monotonic()))[0]:
                return None
            last = max(last, time.monotonic())
        finally:
            os.close(fd)
    return last


@dataclass
class Setup:
    """What the trials of one row share."""

    client: Client
    tool: str
    seconds: float  # what `wait` is asked to sleep
    upstream: Upstream
    tmp: Path
    window: float
    facts: list[StopFacts] | None  # the server's reports, for a server that sends them


async def _trial(setup: Setup) -> Outcome:
    global _probe
    probe = _probe = Probe()
    tool, upstream, window = setup.tool, setup.upstream, setup.window
    release = upstream.next_trial()
    requests_before = len(upstream.server.requests)
    pids_file = setup.tmp / f"pids-{time.monotonic_ns()}"
    tree = f"sleep 300 & echo $! > {pids_file}; echo $$ >> {pids_file}; wait"
    arguments: dict[str, Any] = {
        "fetch": {"url": upstream.server.url},
        "run": {"argv": ["sh", "-c", tree]},
        "wait": {"seconds": setup.seconds},
    }[tool]
    facts_before = len(setup.facts or ())
    outcome = Outcome()
    pids: list[int] = []
    async with anyio.create_task_group() as tasks:

        async def call() -> None:
            with contextlib.suppress(Exception):
                await setup.client.call_tool(tool, arguments)

        tasks.start_soon(call)
        await anyio.to_thread.run_sync(probe.entered.wait, BOUND)
        if tool == "fetch":
            await anyio.to_thread.run_sync(
                upstream.server.wait_requests, requests_before + 1, BOUND
            )
        if tool == "run":
            deadline = time.monotonic() + BOUND
            while not (pids_file.exists() and len(pids_file.read_text().split()) == 2):
                assert time.monotonic() < deadline, "the tree never started"
                await anyio.sleep(0.001)
            pids = [int(pid) for pid in pids_file.read_text().split()]
        cancelled_at = time.monotonic()
        tasks.cancel_scope.cancel()
    until = cancelled_at + window
    if tool == "fetch":
        cid = upstream.server.requests[requests_before].connection
        if await anyio.to_thread.run_sync(upstream.server.wait_closed, cid, window):
            outcome.close_ms = (upstream.server.close_times[cid] - cancelled_at) * 1000
    if tool == "run":
        gone = await anyio.to_thread.run_sync(_wait_gone, pids, until)
        if gone is not None:
            outcome.gone_ms = (gone - cancelled_at) * 1000

    if await anyio.to_thread.run_sync(probe.exited.wait, max(0.0, until - time.monotonic())):
        assert probe.exited_at is not None
        outcome.exit_ms = (probe.exited_at - cancelled_at) * 1000
    # The work that ran on is ended by the bench, before the next trial.
    release.set()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    await anyio.to_thread.run_sync(probe.exited.wait, BOUND * 3)
    if setup.facts is not None:
        # The server's report follows its thread's exit (bounded: it may not come).
        deadline = time.monotonic() + BOUND
        while len(setup.facts) == facts_before and time.monotonic() < deadline:  # noqa: ASYNC110
            await anyio.sleep(0.001)  # A bench may poll; the report has no event to wait on.
        outcome.confirmed = any(f.stopped for f in setup.facts[facts_before:])
    return outcome


async def _row(
    name: str, server: Any, tool: str, trials: int, window: float, upstream: Upstream
) -> dict[str, Any]:
    reports = isinstance(server, example.MCPServer)
    facts: list[StopFacts] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        if params.logger == LOGGER and (found := StopFacts.from_json(params.data)) is not None:
            facts.append(found)

    outcomes: list[Outcome] = []
    # The SDK's sync sleep cannot be stopped: it sleeps just past the window,
    # so that its threads do not pile up.
    seconds = window + 0.2 if name.startswith("SDK MCPServer, def") else 300.0
    with tempfile.TemporaryDirectory() as tmp:
        async with Client(server, mode="legacy", logging_callback=on_log) as client:
            setup = Setup(
                client, tool, seconds, upstream, Path(tmp), window, facts if reports else None
            )
            for _ in range(trials):
                outcomes.append(await _trial(setup))
    return _summary(name, tool, outcomes)


def _stats(values: list[float | None]) -> dict[str, Any]:
    reached = [v for v in values if v is not None]
    return {
        "p50": _round(percentile(reached, 50)),
        "p99": _round(percentile(reached, 99)),
        "never": len(values) - len(reached),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _summary(name: str, tool: str, outcomes: list[Outcome]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "server": name,
        "tool": tool,
        "cancels": len(outcomes),
        "cancel_to_tool_exit_ms": _stats([o.exit_ms for o in outcomes]),
        "server_confirmed": sum(o.confirmed for o in outcomes),
    }
    if tool == "fetch":
        row["cancel_to_upstream_close_ms"] = _stats([o.close_ms for o in outcomes])
    if tool == "run":
        row["cancel_to_process_gone_ms"] = _stats([o.gone_ms for o in outcomes])
    return row


def _cell(stats: dict[str, Any] | None, n: int) -> str:
    if stats is None:
        return "-"
    reached = n - stats["never"]
    if not reached:
        return f"never ({n}/{n} ran on)"
    text = f"{stats['p50']:.2f} / {stats['p99']:.2f} ms"
    return text + (f", {stats['never']}/{n} ran on" if stats["never"] else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=100, help="cancels per row (default 100)")
    parser.add_argument("--window", type=float, default=0.3, help="seconds to wait for a stop")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()}; cpus: {os.cpu_count()}")
    rows: list[dict[str, Any]] = []
    upstream = Upstream()
    try:
        for name, server in _servers().items():
            for tool in ("fetch", "run", "wait"):
                row = anyio.run(_row, name, server, tool, args.trials, args.window, upstream)
                rows.append(row)
                print(f"  {name} / {tool}: done", file=sys.stderr)
    finally:
        upstream.next_trial()
        upstream.server.stop()
    head = [
        "server",
        "tool",
        "cancels",
        "cancel -> tool returned p50 / p99",
        "cancel -> upstream close",
        "cancel -> process tree gone",
        "server confirmed",
    ]
    print(f"\n{args.trials} cancels a row; what did not happen within {args.window:g} s ran on.\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        n = row["cancels"]
        cells = [
            row["server"],
            row["tool"],
            str(n),
            _cell(row["cancel_to_tool_exit_ms"], n),
            _cell(row.get("cancel_to_upstream_close_ms"), n),
            _cell(row.get("cancel_to_process_gone_ms"), n),
            f"{row['server_confirmed']}/{n}",
        ]
        print("| " + " | ".join(cells) + " |")
    if args.out is not None:
        report = {
            "version": __version__,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "window_s": args.window,
            "rows": rows,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
