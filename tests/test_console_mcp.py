"""MCP tools in the console's agents: a cancelled ``chat`` stops its tool call, and says so.

A real console (uvicorn, WebSocket, worker threads) whose ``chat`` agent gets
the tools of real MCP servers: the example (examples/mcp_server.py) as a
stdio process, over Streamable HTTP, and on the plain SDK (``--plain``), and
``_fake_mcp.py`` for servers that break the protocol. The "model" is the
simulator, told by the line (``#sim-reply``) to ask for one tool call; a
tool result goes back to it and it answers "done". Then the same through
``wirecut serve --mcp`` as a program.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from _console import ConsoleClient, serving
from _loopback import Exchange, LoopbackServer
from _mcp import BOUND, EXAMPLE, SRC, example, serve_http
from _pids import exited
from _support import assert_usage_error, run_wirecut, until
from wirecut.agent import McpServers, McpServerSpec
from wirecut.agent._tools import MAX_OUTPUT
from wirecut.console.server import ConsoleConfig, ConsoleServer
from wirecut.launch import Provider
from wirecut.simulator import SimConfig, SimulatorServer, directive_responder

FAKE = Path(__file__).resolve().parent / "_fake_mcp.py"
PYTHON = sys.executable
ENV = {"PYTHONPATH": str(SRC)}


class Model:
    """The simulator's replies: a ``#sim-reply`` line's tool call; "done" once a tool answered."""

    def __init__(self) -> None:
        self.tool_results: list[str] = []

    def __call__(self, body: dict[str, Any]) -> Mapping[str, Any] | None:
        last = body["messages"][-1]
        if last["role"] == "tool":
            self.tool_results.append(last["content"])
            return {"content": "done"}
        return directive_responder(body)


def chat_calling(tool: str, arguments: dict[str, Any]) -> str:
    """The ``chat`` line whose model asks for one call of ``tool``."""
    reply = {"content": None, "tool_calls": [{"function": {"name": tool, "arguments": arguments}}]}
    return "chat #sim-reply " + json.dumps(reply)


@contextlib.contextmanager
def mcp_console(
    tmp_path: Path, specs: list[McpServerSpec], *, unwind_timeout: float = 10.0, **options: Any
) -> Iterator[tuple[ConsoleServer, ConsoleClient, Model, McpServers]]:
    """A console over the simulator whose agents get ``specs``' tools (started, then closed)."""
    model = Model()
    config = SimConfig(slots=2, tokens_per_second=200, prompt_ms=5)
    console_config = ConsoleConfig(port=0, data_dir=tmp_path, unwind_timeout=unwind_timeout)
    # How serve sets it: the confirmation's wait fits in the unwind bound.
    confirm = console_config.runner_limits.mcp_confirm_timeout
    servers = McpServers(specs, confirm_timeout=confirm, **options)
    with SimulatorServer(config, responder=model) as sim, servers:
        provider = Provider(sim.base_url, None, "simulator (tests)")
        with ConsoleServer(console_config, provider, mcp=servers) as console:
            with ConsoleClient(console.ws_url) as client:
                yield console, client, model, servers


def _example(*flags: str, name: str = "tools") -> McpServerSpec:
    return McpServerSpec(name, f"{PYTHON} {EXAMPLE} {' '.join(flags)}", env=ENV)


def _fake(name: str, mode: str) -> McpServerSpec:
    return McpServerSpec(name, f"{PYTHON} {FAKE} {mode}")


@pytest.fixture
def upstream() -> Iterator[LoopbackServer]:
    """An HTTP server that holds every request open until its client closes it."""

    def held(exchange: Exchange) -> None:
        exchange.hold(timeout=BOUND * 3)

    with LoopbackServer(held, name="upstream") as server:
        yield server


def _tree_argv(pids: Path) -> list[str]:
    """A process tree (a shell and two sleeps) that writes its three pids to ``pids``."""
    record = f"echo $! >> {pids}"
    return ["sh", "-c", f"sleep 300 & {record}; sleep 300 & {record}; echo $$ >> {pids}; wait"]


def _pids_in(path: Path, count: int) -> list[int]:
    until(lambda: path.exists() and len(path.read_text().split()) == count)
    return [int(word) for word in path.read_text().split()]


# -- a cancel stops the call, and the complete says what the server did -----------------------


def test_a_cancelled_chat_stops_its_stdio_tools_fetch_and_the_upstream_sees_the_close(
    tmp_path: Path, upstream: LoopbackServer
) -> None:
    with mcp_console(tmp_path, [_example()]) as (_, client, model, _):
        id = client.run(chat_calling("tools__fetch", {"url": upstream.url}))
        assert upstream.wait_requests(1, BOUND)  # The tool's GET is held upstream.
        client.cancel(id)
        complete = client.complete(id)
        assert complete["status"] == "cancelled"
        assert complete["reason"] == "user"
        assert complete["mcp"] == [{"server": "tools", "tool": "fetch", "stopped": True}]
        assert complete["lifecycle"]["worker_exited"] is True
        assert upstream.wait_closed(0, BOUND)  # The server's request was cut, not left.
        assert model.tool_results == []


def test_a_cancelled_chat_stops_its_http_tools_process_tree(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    with serve_http(example.build()) as url:
        with mcp_console(tmp_path, [McpServerSpec("web", url)]) as (_, client, _, _):
            id = client.run(chat_calling("web__run", {"argv": _tree_argv(pids)}))
            tree = _pids_in(pids, 3)
            client.cancel(id)
            complete = client.complete(id)
            assert complete["status"] == "cancelled"
            assert complete["mcp"] == [{"server": "web", "tool": "run", "stopped": True}]
            for pid in tree:
                assert exited(pid, BOUND), f"process {pid} of the tool's tree is still there"


def test_a_plain_sdk_server_runs_on_and_the_complete_does_not_say_stopped(
    tmp_path: Path,
) -> None:
    started, finished = tmp_path / "started", tmp_path / "finished"
    script = f"touch {started}; sleep 3; touch {finished}"
    with mcp_console(tmp_path, [_example("--plain", name="plain")]) as (_, client, _, _):
        id = client.run(chat_calling("plain__run", {"argv": ["sh", "-c", script]}))
        until(started.exists)
        client.cancel(id)
        complete = client.complete(id)
        assert complete["status"] == "cancelled"
        # The plain SDK sends nothing after a cancel: the stop is not known, and not claimed.
        assert complete["mcp"] == [{"server": "plain", "tool": "run", "stopped": None}]
        until(finished.exists)  # ... and indeed the tool ran on to its end.


def test_the_wait_for_a_servers_word_fits_in_a_short_unwind_bound(tmp_path: Path) -> None:
    # A server that never confirms holds the worker for the whole wait: past
    # the unwind bound the worker would be reported as still running.
    with mcp_console(tmp_path, [_example("--plain", name="plain")], unwind_timeout=1.0) as (
        _,
        client,
        _,
        _,
    ):
        started = tmp_path / "started"
        argv = ["sh", "-c", f"touch {started}; sleep 3"]
        id = client.run(chat_calling("plain__run", {"argv": argv}))
        until(started.exists)
        client.cancel(id)
        complete = client.complete(id)
        assert complete["lifecycle"]["worker_exited"] is True
        assert complete["mcp"] == [{"server": "plain", "tool": "run", "stopped": None}]


def test_a_server_that_answers_a_cancelled_call_is_reported_not_stopped(tmp_path: Path) -> None:
    with mcp_console(tmp_path, [_fake("fake", "answers-anyway")]) as (_, client, _, servers):
        id = client.run(chat_calling("fake__echo", {}))
        [server] = servers.servers
        assert server.client is not None
        until(lambda: any(line.startswith("holding call") for line in server.client.stderr_tail))
        client.cancel(id)
        complete = client.complete(id)
        assert complete["mcp"] == [{"server": "fake", "tool": "echo", "stopped": False}]


def test_a_chat_that_finishes_reports_no_mcp_calls(tmp_path: Path) -> None:
    with mcp_console(tmp_path, [_example()]) as (_, client, model, _):
        complete = client.complete(client.run(chat_calling("tools__wait", {"seconds": 0})))
        assert complete["status"] == "ok"
        assert "mcp" not in complete
        assert model.tool_results == ["waited 0.0 s"]


# -- bad servers: one line each, and the console goes on --------------------------------------


def test_bad_servers_are_left_out_and_help_and_the_catalog_say_why(tmp_path: Path) -> None:
    specs = [
        _example(),
        McpServerSpec("missing", "no-such-mcp-server"),
        _fake("garbage", "garbage"),
        _fake("nolist", "no-list"),
    ]
    with mcp_console(tmp_path, specs, list_timeout=1.0) as (console, client, model, _):
        help_id = client.run("help")
        assert client.complete(help_id)["status"] == "ok"
        shown = client.output(help_id)
        assert "MCP servers (chat offers their tools to the model):" in shown
        assert ": tools__fetch, tools__run, tools__wait\n" in shown
        assert "missing (stdio: no-such-mcp-server): not used: MCP server 'missing' " in shown
        assert "garbage (stdio: " in shown
        assert "did not answer tools/list within 1 s" in shown
        catalog = httpx.get(console.url + "api/commands", params={"token": console.token}).json()
        assert [(s["server"], s["status"]) for s in catalog["mcp"]] == [
            ("tools", "ready"),
            ("missing", "unavailable"),
            ("garbage", "unavailable"),
            ("nolist", "unavailable"),
        ]
        assert [t["name"] for t in catalog["mcp"][0]["tools"]] == [
            "tools__fetch",
            "tools__run",
            "tools__wait",
        ]
        # The good server serves.
        complete = client.complete(client.run(chat_calling("tools__wait", {"seconds": 0})))
        assert complete["status"] == "ok"
        assert model.tool_results == ["waited 0.0 s"]


def test_a_huge_result_reaches_the_model_cut_to_size(tmp_path: Path) -> None:
    with mcp_console(tmp_path, [_fake("big", "huge")]) as (_, client, model, _):
        assert client.complete(client.run(chat_calling("big__echo", {})))["status"] == "ok"
        [text] = model.tool_results
        assert text == "x" * MAX_OUTPUT + f"\n[... {(1 << 20) - MAX_OUTPUT} more characters cut]"


def test_a_result_over_the_bound_is_the_tools_error_and_the_server_is_left_out(
    tmp_path: Path,
) -> None:
    with mcp_console(tmp_path, [_fake("big", "huge")], max_message_bytes=64 * 1024) as (
        console,
        client,
        model,
        _,
    ):
        assert client.complete(client.run(chat_calling("big__echo", {})))["status"] == "ok"
        [text] = model.tool_results
        assert text.startswith("error: big__echo failed: McpProtocolError: MCP server 'big' ")
        assert "\n" not in text
        help_id = client.run("help")
        client.complete(help_id)
        assert "big (stdio: " in client.output(help_id)
        assert ": not used: MCP server 'big' " in client.output(help_id)
        catalog = httpx.get(console.url + "api/commands", params={"token": console.token}).json()
        assert catalog["mcp"][0]["status"] == "broken"
        assert catalog["mcp"][0]["tools"] == []


# -- wirecut serve --mcp ---------------------------------------------------------------------------


def _children_running(pid: int, path: Path) -> list[int]:
    """The child processes of ``pid`` (every thread's) whose command line names ``path``."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                if str(path).encode() in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
    return found


def test_serve_with_mcp_cancels_a_tool_call_and_stops_its_servers_at_exit(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    model = Model()
    sim_config = SimConfig(slots=2, tokens_per_second=200, prompt_ms=5)
    command = f"env PYTHONPATH={SRC} {PYTHON} {EXAMPLE}"
    with SimulatorServer(sim_config, responder=model) as sim:
        with serving(
            tmp_path,
            "--provider-url",
            sim.base_url,
            "--mcp",
            f"tools={command}",
            "--mcp",
            "missing=no-such-mcp-server",
            env={**os.environ, "PYTHONPATH": str(SRC)},
        ) as running:
            # The stdio server, started by serve (env execs python: one process).
            [server_pid] = _children_running(running.proc.pid, EXAMPLE)
            with ConsoleClient(running.ws_url) as client:
                id = client.run(chat_calling("tools__run", {"argv": _tree_argv(pids)}))
                tree = _pids_in(pids, 3)
                client.cancel(id)
                complete = client.complete(id)
            assert complete["status"] == "cancelled"
            assert complete["mcp"] == [{"server": "tools", "tool": "run", "stopped": True}]
            for pid in tree:
                assert exited(pid, BOUND)
    # serve stopped (SIGTERM, exit 0), having ended and reaped its MCP server: not
    # even a zombie is left for init (an orphan would outlive it for a moment).
    assert not Path(f"/proc/{server_pid}").exists()
    lines = running.err.splitlines()
    assert [line for line in lines if "MCP server" in line] == [
        f"wirecut serve: MCP server 'tools' (stdio: {command}): 3 tools: fetch, run, wait",
        "wirecut serve: MCP server 'missing' did not start: No such file or directory: "
        "no-such-mcp-server; serving without it",
    ]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--mcp", "tools"], ["--mcp", "'tools' is not NAME=COMMAND or NAME=URL"]),
        (["--mcp", "a=x", "--mcp", "a=y"], ["--mcp", "'a' is given twice"]),
        (["--mcp", "a b=x"], ["--mcp", "MCP server name 'a b' must be"]),
        (["--mcp", "a=x", "--ray", "local"], ["--mcp cannot be used with --ray"]),
    ],
)
def test_serve_refuses_a_bad_mcp_option_in_one_line(
    tmp_path: Path, args: list[str], words: list[str]
) -> None:
    result = run_wirecut("serve", "--port", "0", "--data-dir", str(tmp_path), *args)
    assert_usage_error(result, *words)
