"""Cancel console commands whose agent is in an MCP tool call: wirecut's server and the SDK's.

Run: ``python bench/bench_console_mcp.py [--trials 100] [--plain-trials 20] [--window 3]
[--out DIR]`` (the SDK's rows take the whole wait for the server's word, and the window,
each).
Prints a Markdown table (and writes ``DIR/bench_console_mcp.json`` with ``--out``);
asserts nothing.

A console (``ConsoleServer``: uvicorn, WebSocket, worker threads) over the
simulator gets, as ``serve --mcp`` does, the tools of examples/mcp_server.py
run as a stdio process: on wirecut's ``MCPServer``, and with ``--plain`` on
the SDK's own. Each trial runs ``chat`` whose model (the simulator, scripted)
asks for the ``run`` tool with a program that writes its pid and sleeps;
once the pid is there, the client cancels the command. The clock runs from
the cancel (the frame sent) to the ``complete`` (received), and to the
tool's process exiting (a pidfd). What has not exited ``--window`` seconds
after the cancel "ran on" (the bench then kills it). The last column counts
the ``complete``'s ``mcp`` entries by ``stopped``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import wirecut
from _procs import percentile
from _report import Report, cell
from wirecut.agent import McpServers, McpServerSpec
from wirecut.client import ConsoleClient
from wirecut.console.server import ConsoleConfig, ConsoleServer
from wirecut.launch import Provider
from wirecut.simulator import SimConfig, SimulatorServer, directive_responder

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mcp_server.py"
BOUND = 30.0


def _model(body: dict[str, Any]) -> Mapping[str, Any] | None:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return {"content": "done"}
    return directive_responder(body)


def _chat_line(tool: str, pid_file: Path) -> str:
    argv = ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 300"]
    call = {"function": {"name": tool, "arguments": {"argv": argv}}}
    return "chat #sim-reply " + json.dumps({"content": None, "tool_calls": [call]})


def _wait_pid(path: Path) -> int:
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text())
        time.sleep(0.005)
    raise TimeoutError(f"the tool never wrote {path}")


class _ExitWatch:
    """When a process exits, seen on a pidfd by a thread of its own from before the cancel."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd = os.pidfd_open(pid)
        self.exited_at: float | None = None
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        select.select([self.fd], [], [])
        self.exited_at = time.monotonic()

    def ms_after(self, since: float, window: float) -> float | None:
        """Milliseconds from ``since`` to the exit, or None if it lives past the window."""
        self._thread.join(max(0.0, since + window - time.monotonic()))
        if self.exited_at is None:
            os.kill(self.pid, signal.SIGKILL)  # It ran on: the bench ends it.
            self._thread.join(BOUND)
            os.close(self.fd)
            return None
        os.close(self.fd)
        return (self.exited_at - since) * 1000


@contextlib.contextmanager
def _console(tmp: Path, plain: bool) -> Iterator[ConsoleClient]:
    flags = " --plain" if plain else ""
    # The server imports the wirecut this bench runs.
    src = str(Path(wirecut.__file__).resolve().parent.parent)
    spec = McpServerSpec("tools", f"{sys.executable} {EXAMPLE}{flags}", env={"PYTHONPATH": src})
    config = ConsoleConfig(port=0, data_dir=tmp)
    sim_config = SimConfig(slots=4, tokens_per_second=500, prompt_ms=1)
    servers = McpServers([spec], confirm_timeout=config.runner_limits.mcp_confirm_timeout)
    with SimulatorServer(sim_config, responder=_model) as sim, servers:
        provider = Provider(sim.base_url, None, "simulator (bench)")
        with ConsoleServer(config, provider, mcp=servers) as console:
            with ConsoleClient(console.ws_url) as client:
                yield client


def run_side(plain: bool, trials: int, window: float) -> dict[str, Any]:
    to_complete: list[float] = []
    to_exit: list[float] = []
    ran_on = 0
    stopped: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp, _console(Path(tmp), plain) as client:
        for k in range(trials):
            pid_file = Path(tmp) / f"pid{k}"
            id = client.run(_chat_line("tools__run", pid_file))
            watch = _ExitWatch(_wait_pid(pid_file))
            sent = client.cancel(id)
            received = client.complete(id, BOUND)
            to_complete.append((received.at - sent) * 1000)
            for entry in received.frame.get("mcp", []):
                stopped[json.dumps(entry["stopped"])] += 1
            gone = watch.ms_after(sent, window)
            if gone is None:
                ran_on += 1
            else:
                to_exit.append(gone)
    return {
        "server": "SDK MCPServer (--plain)" if plain else "wirecut MCPServer",
        "trials": trials,
        "cancel_to_complete_ms": {
            "p50": percentile(to_complete, 50),
            "p99": percentile(to_complete, 99),
        },
        "cancel_to_process_exit_ms": {
            "p50": percentile(to_exit, 50),
            "p99": percentile(to_exit, 99),
            "ran_on": ran_on,
        },
        "stopped": dict(stopped),
    }


def report(rows: list[dict[str, Any]], window: float) -> Report:
    made = Report(
        name="bench_console_mcp",
        title="Cancelling a console command inside an MCP tool call",
        about=__doc__.split("\n\n")[0] if __doc__ else "",
    )
    table = made.table(
        "console command cancelled during an MCP tool call (stdio server)",
        [
            "server",
            "cancels",
            "cancel -> complete p50 / p99",
            "cancel -> tool process exited p50 / p99",
            "complete's mcp stopped: true / false / null",
        ],
        note=f"'ran on': the tool's process was still there {window:g} s after the cancel.",
    )
    for row in rows:
        done = row["cancel_to_complete_ms"]
        gone = row["cancel_to_process_exit_ms"]
        exit_cell = (
            f"never ({gone['ran_on']}/{row['trials']} ran on)"
            if gone["p50"] is None
            else f"{cell(gone['p50'], 'ms')} / {cell(gone['p99'], 'ms')}"
            + (f" ({gone['ran_on']} ran on)" if gone["ran_on"] else "")
        )
        counts = row["stopped"]
        table.add(
            row["server"],
            row["trials"],
            f"{cell(done['p50'], 'ms')} / {cell(done['p99'], 'ms')}",
            exit_cell,
            f"{counts.get('true', 0)} / {counts.get('false', 0)} / {counts.get('null', 0)}",
        )
    made.data["rows"] = rows
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--plain-trials", type=int, default=20)
    parser.add_argument("--window", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = [
        run_side(False, args.trials, args.window),
        run_side(True, args.plain_trials, args.window),
    ]
    made = report(rows, args.window)
    made.print()
    if args.out is not None:
        print(f"\nwrote {made.write(args.out)}")


if __name__ == "__main__":
    main()
