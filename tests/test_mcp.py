"""``wirecut.mcp.MCPServer``: a cancelled sync tool call stops, and the server says so.

End to end, with the official SDK's client and server: the example server
(examples/mcp_server.py) runs as a stdio subprocess or in this process under
uvicorn (Streamable HTTP); its tools block on a real HTTP read from a
loopback server, a real process tree, or a sleep. The claims come from
outside the server wherever they can: the loopback server saw the close,
each process of the tree exited (a pidfd), no thread of this process is
still inside the tool. The server's own report (its ``wirecut`` log
notification) is checked against them. The same tools on the SDK's own
``MCPServer`` (``--plain``) run to their end: each of those tests shows it.
"""

from __future__ import annotations

import math
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from mcp import Client
from mcp.client.stdio import stdio_client
from mcp.server.mcpserver import MCPServer as PlainMCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent

import wirecut.scope
from _loopback import Exchange, LoopbackServer
from _mcp import BOUND, Facts, example, example_params, serve_http, threads_in
from _pids import exited
from _support import until
from wirecut.mcp import FACTS_META_KEY, MCPServer, StopFacts, StopReason

# -- helpers ---------------------------------------------------------------------------


def _text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def _held(server_log: list[Exchange]) -> Any:
    """A loopback handler that answers nothing and returns once the peer closed."""

    def handler(exchange: Exchange) -> None:
        server_log.append(exchange)
        exchange.hold(timeout=BOUND * 3)

    return handler


def _released(release: threading.Event) -> Any:
    """A loopback handler that answers once ``release`` is set."""

    def handler(exchange: Exchange) -> None:
        release.wait(BOUND * 3)
        exchange.respond(200, b"the whole body", content_type="text/plain")

    return handler


def _in_wait() -> None:
    until(lambda: bool(threads_in(example.wait)))


TREE = "sleep 300 & echo $! >> {pids}; sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; wait"


def _tree_pids(path: Path) -> list[int]:
    until(lambda: path.exists() and len(path.read_text().split()) == 3)
    return [int(pid) for pid in path.read_text().split()]


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids a test started that must not outlive it, whatever the test found."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


async def _call_then_cancel(
    client: Client, tool: str, arguments: dict[str, Any], started: Any
) -> None:
    """Call ``tool``; once ``started()`` (a blocking wait, on a thread) returns, cancel it."""
    async with anyio.create_task_group() as tasks:

        async def call() -> None:
            await client.call_tool(tool, arguments)
            raise AssertionError(f"{tool} answered a cancelled call")

        tasks.start_soon(call)
        await anyio.to_thread.run_sync(started)
        tasks.cancel_scope.cancel()


# -- stdio: a subprocess server, notifications/cancelled -------------------------------


def test_stdio_cancel_of_fetch_closes_the_upstream_and_the_server_confirms() -> None:
    exchanges: list[Exchange] = []
    with LoopbackServer(_held(exchanges), name="upstream") as upstream:

        async def main() -> StopFacts:
            facts = Facts()
            async with Client(example_params(), logging_callback=facts, log_level="info") as client:
                await _call_then_cancel(
                    client, "fetch", {"url": upstream.url}, lambda: upstream.wait_requests(1)
                )
                return await facts.first()

        facts = anyio.run(main)
        assert upstream.wait_closed(0, BOUND)  # The server's read was cut: the peer saw it.
    assert facts.tool == "fetch"
    assert facts.reason is StopReason.CANCELLED
    assert facts.stopped
    assert facts.started
    assert facts.worker_exited
    assert facts.cancel_to_exit_ms is not None
    assert facts.cancel_to_exit_ms < BOUND * 1000
    assert facts.open_requests == 0
    assert "sockets_shut" in [event for event, _ in facts.timeline]


def test_stdio_cancel_of_run_kills_the_whole_process_tree(
    tmp_path: Path, leftovers: list[int]
) -> None:
    pids_file = tmp_path / "pids"
    argv = ["sh", "-c", TREE.format(pids=pids_file)]

    async def main() -> StopFacts:
        facts = Facts()
        async with Client(example_params(), logging_callback=facts, log_level="info") as client:

            def started() -> None:
                leftovers.extend(_tree_pids(pids_file))

            await _call_then_cancel(client, "run", {"argv": argv}, started)
            return await facts.first()

    facts = anyio.run(main)
    assert len(leftovers) == 3
    for pid in leftovers:
        assert exited(pid, BOUND), f"process {pid} of the tree outlived the cancel"
    assert facts.stopped
    assert facts.worker_exited
    assert facts.open_processes == 0
    events = [event for event, _ in facts.timeline]
    assert events.index("processes_signalled") < events.index("processes_killed")


def test_stdio_cancel_of_wait_is_confirmed_with_the_thread_gone() -> None:
    async def main() -> StopFacts:
        facts = Facts()
        async with Client(example_params(), logging_callback=facts, log_level="info") as client:
            with anyio.move_on_after(0.5):
                await client.call_tool("wait", {"seconds": 300})
            # The next call is served: the server keeps serving after a stop.
            assert _text(await client.call_tool("wait", {"seconds": 0})) == "waited 0.0 s"
            return await facts.first()

    facts = anyio.run(main)
    assert facts.tool == "wait"
    assert facts.reason is StopReason.CANCELLED
    assert facts.stopped
    assert facts.worker_exited


def test_stdio_end_of_the_connection_stops_a_running_call(
    tmp_path: Path, leftovers: list[int]
) -> None:
    # The client goes away (stdin EOF) in the middle of a call: the stop's
    # reason is the shutdown, and the tool's process tree goes with it.
    pids_file = tmp_path / "pids"
    errlog = tmp_path / "server.log"
    argv = ["sh", "-c", TREE.format(pids=pids_file)]

    async def main() -> None:
        with errlog.open("w") as err:
            client = Client(stdio_client(example_params(), errlog=err))
            async with anyio.create_task_group() as tasks:
                await client.__aenter__()

                async def call() -> None:
                    with pytest.raises(MCPError, match="Connection closed"):
                        await client.call_tool("run", {"argv": argv})

                tasks.start_soon(call)
                await anyio.to_thread.run_sync(lambda: leftovers.extend(_tree_pids(pids_file)))
                # The client leaves without cancelling the call: the server's
                # stdin closes with the call in flight.
                await client.__aexit__(None, None, None)

    anyio.run(main)
    for pid in leftovers:
        assert exited(pid, BOUND), f"process {pid} of the tree outlived the server's end"
    log = " ".join(errlog.read_text().split())
    assert "tool 'run'" in log
    assert "stopped on shutdown" in log


def test_plain_sdk_lets_a_cancelled_process_tree_run_to_its_end(
    tmp_path: Path, leftovers: list[int]
) -> None:
    go, finished, pids_file = tmp_path / "go", tmp_path / "finished", tmp_path / "pids"
    script = (
        f"echo $$ > {pids_file}.1; while [ ! -e {go} ]; do sleep 0.02; done; echo done > {finished}"
    )

    async def main() -> None:
        async with Client(example_params("--plain")) as client:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(client.call_tool, "run", {"argv": ["sh", "-c", script]})
                started = Path(f"{pids_file}.1")
                await anyio.to_thread.run_sync(lambda: until(started.exists))
                tasks.cancel_scope.cancel()
            # Served after the cancel, on the same pipe: the cancel was applied.
            await client.call_tool("wait", {"seconds": 0})
            pid = int(await anyio.Path(started).read_text())
            leftovers.append(pid)
            assert not exited(pid, 0), "the plain SDK stopped the process"
            go.touch()
            await anyio.to_thread.run_sync(lambda: until(finished.exists))

    anyio.run(main)
    assert finished.read_text() == "done\n"


def test_plain_sdk_keeps_reading_a_cancelled_fetch_to_its_end() -> None:
    release = threading.Event()
    with LoopbackServer(_released(release), name="upstream") as upstream:

        async def main() -> None:
            async with Client(example_params("--plain")) as client:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(client.call_tool, "fetch", {"url": upstream.url})
                    await anyio.to_thread.run_sync(upstream.wait_requests, 1)
                    tasks.cancel_scope.cancel()
                await client.call_tool("wait", {"seconds": 0})  # The cancel was applied.
                assert upstream.closes == []  # Still reading after the cancel.
                release.set()
                # It read the whole answer, then closed its client.
                assert await anyio.to_thread.run_sync(upstream.wait_closed, 0, BOUND)

        anyio.run(main)


# -- Streamable HTTP: in this process, the 2026-07-28 wire and the session wire ----------


def test_http_disconnect_stops_wait_and_no_thread_is_left_in_the_tool() -> None:
    server = example.build()
    with serve_http(server) as url:

        async def main() -> None:
            async with Client(url) as client:  # 2026-07-28: a cancel closes the stream
                await _call_then_cancel(client, "wait", {"seconds": 300}, _in_wait)
            await anyio.to_thread.run_sync(lambda: until(lambda: not threads_in(example.wait)))

        anyio.run(main)
        assert server.running_calls == 0


def test_http_disconnect_cuts_fetch_and_the_upstream_sees_the_close() -> None:
    exchanges: list[Exchange] = []
    with LoopbackServer(_held(exchanges), name="upstream") as upstream:
        with serve_http(example.build()) as url:

            async def main() -> None:
                async with Client(url) as client:
                    await _call_then_cancel(
                        client, "fetch", {"url": upstream.url}, lambda: upstream.wait_requests(1)
                    )

            anyio.run(main)
            assert upstream.wait_closed(0, BOUND)
            until(lambda: not threads_in(example.fetch))


def test_http_session_cancel_is_a_notification_and_its_facts_reach_the_client() -> None:
    with serve_http(example.build()) as url:

        async def main() -> StopFacts:
            facts = Facts()
            async with Client(url, mode="legacy", logging_callback=facts) as client:
                await _call_then_cancel(client, "wait", {"seconds": 300}, _in_wait)
                return await facts.first()

        facts = anyio.run(main)
    assert facts.reason is StopReason.CANCELLED
    assert facts.stopped
    assert facts.worker_exited
    assert not threads_in(example.wait)


def test_plain_sdk_leaves_the_thread_in_the_tool_after_a_disconnect() -> None:
    server = example.build(plain=True)
    with serve_http(server) as url:

        async def main() -> None:
            async with Client(url) as client:
                await _call_then_cancel(client, "wait", {"seconds": 2.0}, _in_wait)
                # The server answers again (the cancel was seen), the tool still sleeps.
                await client.call_tool("wait", {"seconds": 0})
                assert threads_in(example.wait)
            # It runs to its end by itself.
            await anyio.to_thread.run_sync(lambda: until(lambda: not threads_in(example.wait)))

        anyio.run(main)


def test_http_shutdown_stops_a_running_call_with_reason_shutdown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="wirecut.mcp")
    with serve_http(example.build()) as server:

        async def main() -> None:
            async with Client(server, mode="legacy") as client:
                async with anyio.create_task_group() as tasks:

                    async def call() -> None:
                        with pytest.raises(MCPError):  # The server went away.
                            await client.call_tool("wait", {"seconds": 300})

                    tasks.start_soon(call)
                    await anyio.to_thread.run_sync(_in_wait)
                    await anyio.to_thread.run_sync(server.stop)

        anyio.run(main)
    assert not threads_in(example.wait)
    stops = [r.getMessage() for r in caplog.records if r.name == "wirecut.mcp"]
    assert len(stops) == 1
    assert "tool 'wait'" in stops[0]
    assert "stopped on shutdown" in stops[0]


# -- the server's rules, in process ----------------------------------------------------


def test_a_timeout_answers_an_error_result_carrying_the_facts() -> None:
    server = example.build(timeout=0.2)

    async def main() -> CallToolResult:
        async with Client(server, mode="legacy") as client:
            return await client.call_tool("wait", {"seconds": 300})

    result = anyio.run(main)
    assert result.is_error
    assert "stopped on timeout" in _text(result)
    assert result.meta is not None
    facts = StopFacts.from_json(result.meta[FACTS_META_KEY])
    assert facts is not None
    assert facts.reason is StopReason.TIMEOUT
    assert facts.stopped
    assert facts.worker_exited
    assert not threads_in(example.wait)


def test_a_tool_that_committed_keeps_its_result_after_a_late_timeout() -> None:
    entered, release, scopes = threading.Event(), threading.Event(), []
    server: MCPServer[Any] = MCPServer("commit")

    @server.tool(timeout=0.2)
    def write(text: str) -> str:
        scope = wirecut.scope.current_scope()
        assert scope is not None
        scopes.append(scope)
        with wirecut.scope.committing():
            entered.set()
            release.wait(BOUND)  # The commit: no cut reaches it.
        return f"wrote {text}"

    async def main() -> CallToolResult:
        async with Client(server, mode="legacy") as client:
            async with anyio.create_task_group() as tasks:

                async def release_once_cut() -> None:
                    await anyio.to_thread.run_sync(entered.wait, BOUND)
                    await anyio.to_thread.run_sync(lambda: until(lambda: scopes[0].cancelled))
                    release.set()

                tasks.start_soon(release_once_cut)
                return await client.call_tool("write", {"text": "x"})

    result = anyio.run(main)
    assert not result.is_error
    assert _text(result) == "wrote x"
    assert scopes[0].committed
    assert scopes[0].reason == "timeout"


def test_a_cancel_after_the_commit_is_reported_as_not_stopped() -> None:
    entered, release, scopes = threading.Event(), threading.Event(), []
    server: MCPServer[Any] = MCPServer("commit")

    @server.tool()
    def write(text: str) -> str:
        scope = wirecut.scope.current_scope()
        assert scope is not None
        scopes.append(scope)
        with wirecut.scope.committing():
            entered.set()
            release.wait(BOUND)
        return f"wrote {text}"

    async def main() -> StopFacts:
        facts = Facts()
        async with Client(server, mode="legacy", logging_callback=facts) as client:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(client.call_tool, "write", {"text": "x"})
                await anyio.to_thread.run_sync(entered.wait, BOUND)
                tasks.cancel_scope.cancel()
            await anyio.to_thread.run_sync(lambda: until(lambda: scopes[0].cancelled))
            release.set()
            return await facts.first()

    facts = anyio.run(main)
    assert facts.committed
    assert not facts.stopped  # Its effect is durable: the stop came too late.
    assert facts.worker_exited


def test_a_tool_that_ignores_every_cut_is_reported_after_the_bound_and_left_running() -> None:
    entered, release = threading.Event(), threading.Event()
    server: MCPServer[Any] = MCPServer("stubborn", unwind_timeout=0.3)

    @server.tool(timeout=0.2)
    def stubborn() -> str:
        entered.set()
        release.wait(BOUND)  # A plain wait: no cut wakes it.
        return "done"

    async def main() -> CallToolResult:
        async with Client(server, mode="legacy") as client:
            return await client.call_tool("stubborn", {})

    try:
        result = anyio.run(main)
        assert result.is_error
        assert result.meta is not None
        facts = StopFacts.from_json(result.meta[FACTS_META_KEY])
        assert facts is not None
        assert not facts.worker_exited
        assert not facts.stopped
        assert "STILL RUNNING" in _text(result)
        assert threads_in(stubborn)  # Reported, never killed.
    finally:
        release.set()
    until(lambda: not threads_in(stubborn))


def test_cancel_calls_stops_the_running_calls_with_an_error_result() -> None:
    server = example.build()

    async def main() -> CallToolResult:
        async with Client(server, mode="legacy") as client:
            async with anyio.create_task_group() as tasks:
                results: list[CallToolResult] = []

                async def call() -> None:
                    results.append(await client.call_tool("wait", {"seconds": 300}))

                tasks.start_soon(call)
                await anyio.to_thread.run_sync(_in_wait)
                assert server.cancel_calls() == 1
            return results[0]

    result = anyio.run(main)
    assert result.is_error
    assert "stopped on shutdown" in _text(result)
    assert server.running_calls == 0


def test_async_tools_run_as_the_sdk_runs_them() -> None:
    server: MCPServer[Any] = MCPServer("async")
    outcomes: list[str] = []

    @server.tool()
    async def nap(seconds: float) -> str:
        try:
            await anyio.sleep(seconds)
        except BaseException:
            outcomes.append("cancelled")
            raise
        return "rested"

    async def main() -> None:
        async with Client(server, mode="legacy") as client:
            assert _text(await client.call_tool("nap", {"seconds": 0})) == "rested"
            with anyio.move_on_after(0.2):
                await client.call_tool("nap", {"seconds": 300})
            await anyio.to_thread.run_sync(lambda: until(lambda: outcomes == ["cancelled"]))

    anyio.run(main)


def test_a_sync_tool_keeps_its_name_parameters_and_description() -> None:
    async def main() -> list[Any]:
        async with Client(example.build(), mode="legacy") as client:
            return (await client.list_tools()).tools

    tools = {tool.name: tool for tool in anyio.run(main)}
    plain = {tool.name: tool for tool in anyio.run(_list_plain)}
    assert tools.keys() == {"fetch", "run", "wait"}
    for name, tool in tools.items():
        assert tool.input_schema == plain[name].input_schema
        assert tool.description == plain[name].description
    # The decorated function is the user's own, still callable as it was.
    assert example.wait(0) == "waited 0 s"


async def _list_plain() -> list[Any]:
    async with Client(example.build(plain=True), mode="legacy") as client:
        return (await client.list_tools()).tools


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, True, "1"])
def test_a_bad_unwind_timeout_is_a_value_error(bad: Any) -> None:
    with pytest.raises(ValueError, match="unwind_timeout must be a finite number"):
        MCPServer("bad", unwind_timeout=bad)


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf])
def test_a_bad_tool_timeout_is_a_value_error(bad: Any) -> None:
    server: MCPServer[Any] = MCPServer("bad")
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds > 0"):
        server.add_tool(example.wait, timeout=bad)


def test_a_timeout_on_an_async_tool_is_refused() -> None:
    server: MCPServer[Any] = MCPServer("bad")

    async def nap() -> None:
        await anyio.lowlevel.checkpoint()

    with pytest.raises(TypeError, match="timeout= is for sync tools"):
        server.add_tool(nap, timeout=1)


def test_plain_server_is_the_sdks_own() -> None:
    assert type(example.build(plain=True)) is PlainMCPServer


# -- the facts on the wire ---------------------------------------------------------------


def test_facts_survive_their_wire_form() -> None:
    facts = StopFacts(
        tool="fetch",
        request_id=7,
        call="abc",
        reason=StopReason.DISCONNECT,
        stopped=True,
        started=True,
        worker_exited=True,
        committed=False,
        cancel_to_exit_ms=1.25,
        open_requests=0,
        open_processes=0,
        timeline=(("cancel_requested", 0.0), ("sockets_shut", 0.125)),
    )
    assert StopFacts.from_json(facts.to_json()) == facts


@pytest.mark.parametrize(
    "data",
    [None, "text", [], {"tool": "x"}, {"stopped": "yes"}],
)
def test_anything_else_is_not_facts(data: Any) -> None:
    assert StopFacts.from_json(data) is None
