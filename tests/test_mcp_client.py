"""``wirecut.mcp.McpClient``: a worker's cancel stops its MCP call, and says whether it stopped.

Each call runs as a console command would: on a thread of an
``InterruptScope`` (``scope.spawn``), cancelled with ``scope.cancel()``. The
servers are the example (examples/mcp_server.py) over stdio and over
Streamable HTTP in this process, on wirecut's ``MCPServer`` and on the SDK's
own, and ``_fake_mcp.py``, a stdio server that breaks the protocol in one
way per mode. Every bad server ends in one ``McpError`` with a one-line
message that names it, and nothing is left running.
"""

from __future__ import annotations

import concurrent.futures
import math
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _loopback import Exchange, LoopbackServer
from _mcp import BOUND, EXAMPLE, SRC, example, serve_http, threads_in
from _pids import exited
from _support import until
from wirecut.mcp import (
    McpCallInterrupted,
    McpClient,
    McpError,
    McpProtocolError,
    McpStartError,
    McpTimeoutError,
)
from wirecut.mcp._client import ClientState
from wirecut.scope import Interrupted, InterruptScope

FAKE = Path(__file__).resolve().parent / "_fake_mcp.py"
ENV = {"PYTHONPATH": str(SRC)}


def _example(*flags: str, **kwargs: Any) -> McpClient:
    return McpClient([sys.executable, str(EXAMPLE), *flags], name="example", env=ENV, **kwargs)


def _fake(mode: str, **kwargs: Any) -> McpClient:
    return McpClient([sys.executable, str(FAKE), mode], name=f"fake-{mode}", **kwargs)


def _in_a_worker(
    client: McpClient, tool: str, arguments: dict[str, Any]
) -> tuple[InterruptScope, concurrent.futures.Future[Any]]:
    scope = InterruptScope("command")
    return scope, scope.spawn(client.call_tool, tool, arguments)


def _cut(scope: InterruptScope, future: concurrent.futures.Future[Any]) -> BaseException:
    scope.cancel("user")
    error = future.exception(BOUND)
    assert error is not None, "the call answered after the cut"
    return error


def _one_line(error: BaseException, name: str) -> str:
    message = str(error)
    assert "\n" not in message
    assert repr(name) in message
    return message


@pytest.fixture
def upstream() -> Iterator[LoopbackServer]:
    def held(exchange: Exchange) -> None:
        exchange.hold(timeout=BOUND * 3)

    with LoopbackServer(held, name="upstream") as server:
        yield server


# -- calls and their cuts --------------------------------------------------------------


def test_lists_and_calls_the_tools_of_a_stdio_server() -> None:
    with _example() as client:
        assert [tool.name for tool in client.list_tools()] == ["fetch", "run", "wait"]
        result = client.call_tool("wait", {"seconds": 0})
        assert not result.is_error
        assert client.scope.live()["processes"] == 1  # The server is ours, and counted.


def test_a_cut_sends_the_cancel_and_the_record_says_the_server_stopped(
    upstream: LoopbackServer,
) -> None:
    with _example() as client:
        scope, future = _in_a_worker(client, "fetch", {"url": upstream.url})
        assert upstream.wait_requests(1, BOUND)
        error = _cut(scope, future)
        assert isinstance(error, McpCallInterrupted)
        assert error.reason == "user"
        assert error.record.to_json() == {"server": "example", "tool": "fetch", "stopped": True}
        assert error.record.facts is not None
        assert error.record.facts.open_requests == 0
        assert upstream.wait_closed(0, BOUND)
        assert scope.wait_quiescent(BOUND)  # The worker returned; nothing of the call is left.
        # The connection stays up for the next call.
        assert not client.call_tool("wait", {"seconds": 0}).is_error


def test_a_cut_over_http_is_confirmed_on_the_calls_own_stream() -> None:
    with serve_http(example.build()) as url, McpClient(url, name="http") as client:
        scope, future = _in_a_worker(client, "wait", {"seconds": 300})
        until(lambda: bool(threads_in(example.wait)))
        error = _cut(scope, future)
        assert isinstance(error, McpCallInterrupted)
        assert error.record.stopped is True
        assert not threads_in(example.wait)
        assert not client.call_tool("wait", {"seconds": 0}).is_error


def test_a_plain_sdk_server_leaves_the_stop_unknown() -> None:
    with serve_http(example.build(plain=True)) as url:
        with McpClient(url, name="plain", confirm_timeout=0.3) as client:
            scope, future = _in_a_worker(client, "wait", {"seconds": 3.0})
            until(lambda: bool(threads_in(example.wait)))
            error = _cut(scope, future)
            assert isinstance(error, McpCallInterrupted)
            assert error.record.stopped is None
            assert error.record.facts is None
            assert threads_in(example.wait)  # It did not stop; we could not know.
        until(lambda: not threads_in(example.wait))


def test_a_server_that_answers_a_cancelled_call_anyway_is_recorded_as_not_stopped() -> None:
    with _fake("answers-anyway") as client:
        scope, future = _in_a_worker(client, "echo", {})
        # The fake holds every call until its cancel comes, and says so on stderr.
        until(lambda: any(line.startswith("holding call") for line in client.stderr_tail))
        error = _cut(scope, future)
        assert isinstance(error, McpCallInterrupted)
        assert error.record.stopped is False
        assert error.record.facts is None


def test_a_cut_before_the_call_sends_nothing() -> None:
    with _fake("good") as client:
        scope = InterruptScope("command")
        scope.cancel("user")
        with pytest.raises(Interrupted) as caught, scope:
            client.call_tool("echo", {"n": 1})
        assert type(caught.value) is Interrupted
        assert client.call_tool("echo", {"n": 2}).content[0].text == '{"n": 2}'  # type: ignore[union-attr]


def test_a_call_timeout_stops_the_call_and_keeps_the_record() -> None:
    with _example(call_timeout=0.3) as client:
        with pytest.raises(McpTimeoutError) as caught:
            client.call_tool("wait", {"seconds": 300})
        assert caught.value.record is not None
        assert caught.value.record.stopped is True
        assert "within 0.3 s" in _one_line(caught.value, "example")


def test_a_cut_of_the_handshake_interrupts_connect_and_leaves_no_server() -> None:
    client = _fake("mute", connect_timeout=BOUND)
    scope = InterruptScope("command")
    future = scope.spawn(client.connect)
    until(lambda: client.server_pid is not None)
    pid = client.server_pid
    assert pid is not None
    scope.cancel("user")
    assert isinstance(future.exception(BOUND), Interrupted)
    assert client.state is ClientState.CLOSED
    assert exited(pid, BOUND)


# -- the server process belongs to the client ---------------------------------------------


def test_close_ends_the_stdio_server() -> None:
    client = _example()
    client.connect()
    pid = client.server_pid
    assert pid is not None
    client.close()
    assert exited(pid, BOUND)
    assert client.scope.live() == {"threads": 0, "sockets": 0, "processes": 0, "objects": 0}


def test_close_kills_a_server_that_ignores_its_stdin_and_sigterm() -> None:
    client = _fake("stays")
    client.connect()
    pid = client.server_pid
    assert pid is not None
    client.close()
    assert exited(pid, BOUND)
    assert not any(client.scope.live().values())


# -- bad servers: one line each, nothing left behind ---------------------------------------


def test_a_command_that_does_not_exist_is_a_start_error() -> None:
    client = McpClient("/no/such/mcp-server --flag", name="missing")
    with pytest.raises(McpStartError) as caught:
        client.connect()
    assert "did not start" in _one_line(caught.value, "missing")
    assert client.state is ClientState.CLOSED


def test_a_server_that_exits_at_once_says_its_code_and_its_last_words() -> None:
    client = _fake("exit")
    with pytest.raises(McpStartError) as caught:
        client.connect()
    message = _one_line(caught.value, "fake-exit")
    assert "code 3" in message
    assert "fatal: no config" in message


def test_a_server_that_writes_garbage_is_a_protocol_error() -> None:
    client = _fake("garbage")
    with pytest.raises(McpProtocolError) as caught:
        client.connect()
    assert "not MCP" in _one_line(caught.value, "fake-garbage")
    assert "hello, I am not an MCP server" in str(caught.value)
    pid = client.server_pid
    assert pid is not None
    assert exited(pid, BOUND)


def test_a_server_that_never_answers_the_handshake_times_out() -> None:
    client = _fake("mute", connect_timeout=0.5)
    with pytest.raises(McpStartError) as caught:
        client.connect()
    assert "did not finish the handshake within 0.5 s" in _one_line(caught.value, "fake-mute")
    pid = client.server_pid
    assert pid is not None
    assert exited(pid, BOUND)


def test_a_server_that_never_answers_tools_list_times_out() -> None:
    with _fake("no-list", request_timeout=0.5) as client:
        with pytest.raises(McpTimeoutError) as caught:
            client.list_tools()
        assert "did not answer tools/list within 0.5 s" in _one_line(caught.value, "fake-no-list")
        assert client.state is ClientState.OPEN  # A late answer is not a broken connection.


def test_a_huge_result_is_a_protocol_error_and_ends_the_connection() -> None:
    with _fake("huge", max_message_bytes=64 * 1024) as client:
        with pytest.raises(McpProtocolError) as caught:
            client.call_tool("echo", {})
        assert "over 65536 bytes" in _one_line(caught.value, "fake-huge")
        until(lambda: client.state is ClientState.BROKEN)
        with pytest.raises(McpError, match="not connected"):
            client.list_tools()


def test_a_url_where_nothing_listens_is_a_start_error() -> None:
    with LoopbackServer(lambda exchange: None) as gone:
        url = gone.url
    client = McpClient(url + "/mcp", name="nobody")
    with pytest.raises(McpStartError) as caught:
        client.connect()
    _one_line(caught.value, "nobody")


def test_a_url_that_is_not_an_mcp_server_is_an_error() -> None:
    def page(exchange: Exchange) -> None:
        exchange.respond(404, b"<html>no</html>", content_type="text/html")

    with LoopbackServer(page) as web:
        client = McpClient(web.url + "/mcp", name="web", connect_timeout=5)
        with pytest.raises(McpError) as caught:
            client.connect()
        _one_line(caught.value, "web")


@pytest.mark.parametrize(
    ("target", "kwargs", "message"),
    [
        ("", {}, "command is empty"),
        ("echo 'unclosed", {}, "cannot read the MCP server command"),
        ("cmd", {"connect_timeout": -1}, "connect_timeout must be"),
        ("cmd", {"call_timeout": math.nan}, "call_timeout must be"),
        ("cmd", {"max_message_bytes": 10}, "max_message_bytes must be at least"),
    ],
)
def test_bad_arguments_are_value_errors(target: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        McpClient(target, **kwargs)


def test_a_client_is_not_reused() -> None:
    client = _fake("good")
    with pytest.raises(McpError, match="not connected"):
        client.call_tool("echo", {})
    client.connect()
    with pytest.raises(RuntimeError, match="that is open"):
        client.connect()
    client.close()
    with pytest.raises(RuntimeError, match="that is closed"):
        client.connect()
    with pytest.raises(McpError, match="not connected"):
        client.list_tools()


def test_calls_from_many_threads_share_one_connection() -> None:
    with _fake("good") as client:
        answers: list[str] = []
        lock = threading.Lock()

        def call(n: int) -> None:
            text = client.call_tool("echo", {"n": n}).content[0].text  # type: ignore[union-attr]
            with lock:
                answers.append(text)

        threads = [threading.Thread(target=call, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(BOUND)
        assert sorted(answers) == sorted(f'{{"n": {n}}}' for n in range(8))
