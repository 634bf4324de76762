"""AIAgent against the simulator: every blocking point of a turn is cut as one unit.

Each cut test runs a turn on a thread owned by a host scope, waits (with a
bound) until the turn is blocked where the test wants it, cancels, and then
checks the three promises: the turn returns "interrupted", the host scope's
ledger drains to zero, and the provider recorded the close of every request
that was in flight.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

import wirecut.scope as ws
from _pids import exited
from _support import BOUND
from wirecut.agent import (
    AIAgent,
    ConversationResult,
    ConversationStatus,
    Tool,
    ToolCallError,
    delegate_tool,
    http_get_tool,
    shell_tool,
    tool,
)
from wirecut.agent._builtins import ESCAPED_NOTE
from wirecut.provider import ChatClient
from wirecut.scope import InterruptScope
from wirecut.simulator import SimConfig, SimulatorServer

Script = Callable[[dict[str, Any]], Mapping[str, Any] | None]


def _last(request: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = request["messages"][-1]
    return message


def call(name: str, arguments: dict[str, Any] | str, call_id: str = "call_1") -> dict[str, Any]:
    """A scripted assistant reply asking for one tool call."""
    return {"tool_calls": [{"id": call_id, "function": {"name": name, "arguments": arguments}}]}


class Provider:
    """A simulator whose replies a test scripts, per request."""

    def __init__(self) -> None:
        self.script: Script = lambda request: None
        config = SimConfig(slots=4, tokens_per_second=100, prompt_ms=5, endless=True)
        self.server = SimulatorServer(config, responder=lambda request: self.script(request))

    def requests_closed_by_peer(self) -> list[bool]:
        return [summary.closed_by_peer for summary in self.server.requests()]

    def wait(self, kind: str, nth: int = 1) -> None:
        """Wait until ``nth`` events of ``kind`` were logged."""
        seen = 0

        def match(event: Any) -> bool:
            nonlocal seen
            seen += event.kind == kind
            return seen >= nth

        self.server.wait_for(match, timeout=BOUND)


@pytest.fixture
def provider() -> Iterator[Provider]:
    p = Provider()
    with p.server:
        yield p


@pytest.fixture
def client(provider: Provider) -> Iterator[ChatClient]:
    with ChatClient(provider.server.base_url, model="sim") as c:
        yield c


def run_in_host(agent: AIAgent, text: str) -> tuple[InterruptScope, Future[ConversationResult]]:
    """Run a turn the way a host does: on a thread owned by the host's scope."""
    host = InterruptScope("host")
    return host, host.spawn(agent.run_conversation, text)


def assert_cut(
    host: InterruptScope, future: Future[ConversationResult], provider: Provider, reason: str
) -> ConversationResult:
    result = future.result(BOUND)
    assert result.status is ConversationStatus.INTERRUPTED
    assert result.reason == reason
    assert host.wait_quiescent(BOUND), host.live()
    assert host.live() == {"threads": 0, "sockets": 0, "processes": 0, "objects": 0}
    # Every request reaches an end: a scripted reply finished by itself before
    # the cut; an endless one can only end by the provider seeing the close,
    # which it notices at its next token.
    for summary in provider.server.requests():
        provider.server.wait_for(
            lambda event, rid=summary.id: (
                event.request_id == rid and event.kind in ("request_finished", "peer_closed")
            ),
            timeout=BOUND,
        )
    return result


# -- cuts at each blocking point ---------------------------------------------------------


def test_cut_while_the_model_streams(provider: Provider, client: ChatClient) -> None:
    tokens: list[str] = []
    three = threading.Event()

    def on_token(text: str) -> None:
        tokens.append(text)
        if len(tokens) == 3:
            three.set()

    agent = AIAgent(client)
    host = InterruptScope("host")
    future = host.spawn(agent.run_conversation, "hello", on_token=on_token)
    assert three.wait(BOUND)
    host.cancel("user")
    result = assert_cut(host, future, provider, "user")
    assert provider.requests_closed_by_peer() == [True]
    # What arrived before the cut is kept, in the text and in the usage.
    assert result.final_text == "".join(tokens)
    assert result.usage.completion_tokens == len(tokens) >= 3


def test_cut_during_the_header_wait_of_a_non_streaming_call(provider: Provider) -> None:
    with ChatClient(provider.server.base_url, wire_stream=False) as client:
        agent = AIAgent(client, stream=False)
        host, future = run_in_host(agent, "hello")
        provider.wait("first_token")  # decoding; headers come only at the end
        host.cancel("user")
        assert_cut(host, future, provider, "user")
    assert provider.requests_closed_by_peer() == [True]


def test_cut_while_a_tool_runs_a_subprocess(
    provider: Provider, client: ChatClient, tmp_path: Path
) -> None:
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    provider.script = lambda request: (
        call("shell", {"argv": ["sh", "-c", f"sleep 300 & echo up > {fifo}; sleep 300"]})
        if _last(request)["role"] == "user"
        else None
    )
    agent = AIAgent(client, tools=[shell_tool()])
    host, future = run_in_host(agent, "run it")
    assert fifo.read_text() == "up\n"  # blocks until the program runs
    host.cancel("user")
    assert_cut(host, future, provider, "user")


def test_cut_while_a_tool_sleeps_through_the_scope(provider: Provider, client: ChatClient) -> None:
    napping = threading.Event()

    def nap(seconds: float) -> str:
        """Sleep a while."""
        napping.set()
        ws.sleep(seconds)
        return "rested"

    provider.script = lambda request: (
        call("nap", {"seconds": 300}) if _last(request)["role"] == "user" else None
    )
    host, future = run_in_host(AIAgent(client, tools=[nap]), "rest")
    assert napping.wait(BOUND)
    host.cancel("user")
    assert_cut(host, future, provider, "user")


def test_cut_in_a_thread_the_tool_started_through_the_scope(
    provider: Provider, client: ChatClient
) -> None:
    working = threading.Event()

    def crunch() -> str:
        """Work in a background thread."""

        def worker() -> str:
            working.set()
            ws.sleep(300)
            return "done"

        scope = ws.current_scope()
        assert scope is not None
        return scope.spawn(worker).result()

    provider.script = lambda request: (
        call("crunch", {}) if _last(request)["role"] == "user" else None
    )
    host, future = run_in_host(AIAgent(client, tools=[crunch]), "go")
    assert working.wait(BOUND)
    host.cancel("user")
    assert_cut(host, future, provider, "user")


def test_cut_inside_a_delegated_child_agent(provider: Provider, client: ChatClient) -> None:
    def script(request: dict[str, Any]) -> Mapping[str, Any] | None:
        if _last(request)["content"] == "parent task":
            return call("delegate", {"task": "child task"})
        return None  # the child's request: an endless stream

    provider.script = script
    parent = AIAgent(client, tools=[delegate_tool(lambda: AIAgent(client))])
    host, future = run_in_host(parent, "parent task")
    provider.wait("first_token", nth=2)  # the child's stream is under way
    host.cancel("user")
    assert_cut(host, future, provider, "user")
    summaries = provider.server.requests()
    assert len(summaries) == 2
    assert summaries[1].closed_by_peer  # the child's request was cut


def test_parallel_tool_calls_are_all_cut(provider: Provider, client: ChatClient) -> None:
    started = threading.Barrier(3)

    def nap(seconds: float) -> str:
        """Sleep a while."""
        started.wait(BOUND)
        ws.sleep(seconds)
        return "rested"

    provider.script = lambda request: (
        {
            "tool_calls": [
                {"id": "a", "function": {"name": "nap", "arguments": {"seconds": 300}}},
                {"id": "b", "function": {"name": "nap", "arguments": {"seconds": 300}}},
            ]
        }
        if _last(request)["role"] == "user"
        else None
    )
    host, future = run_in_host(AIAgent(client, tools=[nap]), "rest")
    started.wait(BOUND)  # both tools run at once, in the turn's threads
    host.cancel("user")
    assert_cut(host, future, provider, "user")


def test_interrupt_from_the_host_cuts_without_a_scope(
    provider: Provider, client: ChatClient
) -> None:
    agent = AIAgent(client)
    outcome: list[ConversationResult] = []
    thread = threading.Thread(target=lambda: outcome.append(agent.run_conversation("hi")))
    thread.start()
    provider.wait("token", nth=2)
    agent.interrupt("stop button")
    thread.join(BOUND)
    assert not thread.is_alive(), "the turn did not return after interrupt()"
    assert outcome[0].status is ConversationStatus.INTERRUPTED
    assert outcome[0].reason == "stop button"
    provider.server.wait_for_event("peer_closed", timeout=BOUND)


def test_a_running_turn_is_in_the_host_scopes_ledger(
    provider: Provider, client: ChatClient
) -> None:
    streaming = threading.Event()
    host = InterruptScope("host")
    future = host.spawn(
        AIAgent(client).run_conversation, "hello", on_token=lambda _: streaming.set()
    )
    assert streaming.wait(BOUND)
    mid_turn = host.live()
    host.cancel("user")
    assert_cut(host, future, provider, "user")
    # The turn itself is registered with the host's scope (an object), and
    # its scope is a child of the host's, so the turn's request counts there.
    assert mid_turn == {"threads": 1, "sockets": 1, "processes": 0, "objects": 1}


def test_tools_run_in_a_turn_scope_that_is_a_child_of_the_host_scope(
    provider: Provider, client: ChatClient
) -> None:
    seen: list[InterruptScope | None] = []

    def where() -> str:
        """Say where you run."""
        seen.append(ws.current_scope())
        return "here"

    provider.script = lambda request: (
        call("where", {}) if _last(request)["role"] == "user" else {"content": "done"}
    )
    host = InterruptScope("host")
    with ws.bind_scope(host):
        result = AIAgent(client, tools=[where]).run_conversation("where?")
    assert result.status is ConversationStatus.OK
    (turn,) = seen
    assert turn is not None
    assert turn is not host
    assert turn.parent is host


# -- interrupt semantics --------------------------------------------------------------------


def test_interrupt_before_the_turn_starts_sends_no_request(
    provider: Provider, client: ChatClient
) -> None:
    agent = AIAgent(client)
    agent.interrupt("early")
    result = agent.run_conversation("hi")
    assert result.status is ConversationStatus.INTERRUPTED
    assert result.reason == "early"
    assert provider.server.requests() == []
    agent.clear_interrupt()
    provider.script = lambda request: {"content": "fine"}
    assert agent.run_conversation("hi").final_text == "fine"


def test_cancelled_host_scope_interrupts_the_turn_on_entry(
    provider: Provider, client: ChatClient
) -> None:
    host = InterruptScope("host")
    host.cancel("disconnect")
    with ws.bind_scope(host):
        outcome = AIAgent(client).run_conversation("hi")
    assert outcome.status is ConversationStatus.INTERRUPTED
    assert outcome.reason == "disconnect"
    assert provider.server.requests() == []


def test_interrupt_twice_keeps_the_first_reason(provider: Provider, client: ChatClient) -> None:
    agent = AIAgent(client)
    host, future = run_in_host(agent, "hello")
    provider.wait("token", nth=2)
    agent.interrupt("first")
    agent.interrupt("second")
    assert_cut(host, future, provider, "first")
    assert agent.interrupted


# -- the tool loop ------------------------------------------------------------------------


def test_malformed_tool_call_goes_back_to_the_model(provider: Provider, client: ChatClient) -> None:
    seen: list[str] = []

    def script(request: dict[str, Any]) -> Mapping[str, Any] | None:
        last = _last(request)
        if last["role"] == "user":
            return call("add", "{not json")
        if last["role"] == "tool" and "not valid JSON" in last["content"]:
            seen.append(last["content"])
            return call("add", {"a": 1, "b": "two"}, call_id="call_2")
        if last["role"] == "tool" and "invalid arguments" in last["content"]:
            seen.append(last["content"])
            return call("subtract", {"a": 1}, call_id="call_3")
        if last["role"] == "tool" and "unknown tool" in last["content"]:
            seen.append(last["content"])
            return call("add", {"a": 1, "b": 2}, call_id="call_4")
        return {"content": f"the sum is {last['content']}"}

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    provider.script = script
    result = AIAgent(client, tools=[add]).run_conversation("1+2?")
    assert result.status is ConversationStatus.OK
    assert result.final_text == "the sum is 3"
    assert len(seen) == 3
    assert "b" in seen[1]  # the schema error names the field
    assert "available: add" in seen[2]


def test_max_iterations_is_reached(provider: Provider, client: ChatClient) -> None:
    provider.script = lambda request: call("ping", {})

    def ping() -> str:
        """Ping."""
        return "pong"

    result = AIAgent(client, tools=[ping], max_iterations=3).run_conversation("loop")
    assert result.status is ConversationStatus.MAX_ITERATIONS
    assert result.iterations == 3
    assert len(provider.server.requests()) == 3
    assert result.usage.requests == 3


def test_final_answer_with_history_and_system_prompt(
    provider: Provider, client: ChatClient
) -> None:
    requests: list[dict[str, Any]] = []

    def script(request: dict[str, Any]) -> Mapping[str, Any] | None:
        requests.append(request)
        return {"content": "answer"}

    provider.script = script
    history = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}]
    agent = AIAgent(client, system_prompt="be brief")
    result = agent.run_conversation("now", history=history)
    assert result.status is ConversationStatus.OK
    assert [m["role"] for m in requests[0]["messages"]] == ["system", "user", "assistant", "user"]
    assert result.messages[-1] == {"role": "assistant", "content": "answer"}
    assert len(history) == 2  # not modified


def test_failing_tool_is_reported_to_the_model(provider: Provider, client: ChatClient) -> None:
    def broken() -> str:
        """Fail."""
        raise RuntimeError("disk on fire")

    provider.script = lambda request: (
        call("broken", {})
        if _last(request)["role"] == "user"
        else {"content": _last(request)["content"]}
    )
    result = AIAgent(client, tools=[broken]).run_conversation("try")
    assert result.final_text == "error: broken failed: RuntimeError: disk on fire"


def test_provider_failure_ends_the_turn_with_error() -> None:
    with ChatClient("http://127.0.0.1:9/v1", max_retries=0) as client:
        result = AIAgent(client).run_conversation("hi")
    assert result.status is ConversationStatus.ERROR
    assert result.reason is not None
    assert "127.0.0.1:9" in result.reason


# -- tools --------------------------------------------------------------------------------


def test_tool_schema_is_derived_from_hints_and_docstring() -> None:
    def search(query: str, limit: int = 5) -> list[str]:
        """Search the notes.

        query: words to look for
        limit: how many results at most
        """
        return [query] * limit

    t = Tool(search)
    assert t.schema() == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the notes.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "words to look for"},
                    "limit": {
                        "type": "integer",
                        "default": 5,
                        "description": "how many results at most",
                    },
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }
    assert json.loads(t.call('{"query": "x", "limit": 2}')) == ["x", "x"]


def test_explicit_schema_is_validated() -> None:
    t = Tool(
        lambda **kw: kw["path"],
        name="read",
        description="Read a file.",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    )
    assert t.call('{"path": "/etc"}') == "/etc"
    with pytest.raises(ToolCallError, match="'path' is a required property"):
        t.call("{}")
    with pytest.raises(ToolCallError, match="must be a JSON object"):
        t.call("[1]")


def test_shell_tool_runs_argv_and_never_a_shell_line() -> None:
    shell = shell_tool(allow={"echo"})
    assert shell.call('{"argv": ["echo", "a; rm -rf /"]}') == "exit status 0\na; rm -rf /\n"
    with pytest.raises(ToolCallError, match="'sh' is not allowed"):
        shell.call('{"argv": ["sh", "-c", "echo hi"]}')
    with pytest.raises(ToolCallError, match="argv"):
        shell.call('{"argv": "echo hi"}')


# A program whose grandchild escapes its process group (a new session, and a
# second fork so that it leads nothing) and keeps the inherited stdout open.
# The escaped process writes its pid into the FIFO argv[1]; with argv[2]
# "stay" the program itself runs on after printing "hi", else it exits.
ESCAPING_PROGRAM = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(sys.argv[1], "w") as fifo:
            fifo.write(str(os.getpid()))
        time.sleep(300)
    os._exit(0)
os.wait()
print("hi", flush=True)
if sys.argv[2] == "stay":
    time.sleep(300)
"""


class EscapedProcess:
    """The escaping program's argv, and its escaped grandchild, killed at the end by pid."""

    def __init__(self, tmp_path: Path) -> None:
        self.fifo = tmp_path / "escaped.pid"
        os.mkfifo(self.fifo)
        # Non-blocking, so that opening does not wait for the writer; select does, bounded.
        self._fd = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
        self._pid: int | None = None

    def argv(self, mode: str) -> str:
        return json.dumps({"argv": [sys.executable, "-c", ESCAPING_PROGRAM, str(self.fifo), mode]})

    def pid(self) -> int:
        """Wait (bounded) until the escaped process runs; its pid."""
        if self._pid is None:
            assert select.select([self._fd], [], [], BOUND)[0], "the program never escaped"
            self._pid = int(os.read(self._fd, 64))
        return self._pid

    def kill(self) -> None:
        try:
            pid = self.pid()
        finally:
            os.close(self._fd)
        # Outside the group, nothing but its pid reaches it.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        assert exited(pid, BOUND)


@pytest.fixture
def escaped(tmp_path: Path) -> Iterator[EscapedProcess]:
    process = EscapedProcess(tmp_path)
    yield process
    process.kill()


def test_shell_tool_returns_at_once_on_cancel_though_a_descendant_escaped(
    escaped: EscapedProcess,
) -> None:
    host = InterruptScope("host")
    future = host.spawn(shell_tool().call, escaped.argv("stay"))
    pid = escaped.pid()  # the program runs, and its grandchild left the group
    host.cancel("user")
    # The escaped process holds the output open for 300 s: the tool stops
    # reading the pipe of a killed group instead of waiting for EOF.
    with pytest.raises(ws.Interrupted):
        future.result(BOUND)
    assert host.wait_quiescent(BOUND), host.live()
    assert not exited(pid, 0)  # beyond a group kill: the fixture kills it by pid


def test_shell_tool_timeout_holds_though_a_descendant_escaped(escaped: EscapedProcess) -> None:
    host = InterruptScope("host")
    future = host.spawn(shell_tool(timeout=0.5).call, escaped.argv("stay"))
    escaped.pid()
    output = future.result(BOUND)
    assert output.startswith("error: ")
    assert "timed out after 0.5 s\nhi\n" in output
    assert output.endswith(ESCAPED_NOTE)
    assert "escaped the process group" in ESCAPED_NOTE
    assert host.wait_quiescent(BOUND), host.live()


def test_shell_tool_returns_when_the_program_exits_though_a_descendant_escaped(
    escaped: EscapedProcess,
) -> None:
    host = InterruptScope("host")
    future = host.spawn(shell_tool().call, escaped.argv("exit"))
    escaped.pid()
    assert future.result(BOUND) == f"exit status 0\nhi\n{ESCAPED_NOTE}"


def test_shell_tool_kills_what_the_program_left_in_its_group(tmp_path: Path) -> None:
    # Without an escape, the program's end is the end: its background job
    # (same group) is killed, and nothing is reported as escaped.
    pidfile = tmp_path / "job.pid"
    line = f"sleep 300 & echo $! > {pidfile}; echo $!"
    host = InterruptScope("host")
    future = host.spawn(shell_tool().call, json.dumps({"argv": ["sh", "-c", line]}))
    try:
        output = future.result(BOUND)
    except TimeoutError:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)  # the job holds the tool: end it
        raise
    status, pid, rest = output.split("\n")
    assert (status, rest) == ("exit status 0", "")
    assert exited(int(pid), 0)


def test_shell_tool_feeds_stdin_and_survives_a_program_that_stops_reading() -> None:
    shell = shell_tool()
    data = "x" * 1_000_000  # far more than a pipe holds

    def run(*argv: str) -> str:
        return shell.call(json.dumps({"argv": argv, "stdin": data}))

    assert run("wc", "-c") == "exit status 0\n1000000\n"
    assert run("head", "-c", "3") == "exit status 0\nxxx"  # stops reading: the rest is dropped


@pytest.mark.parametrize(
    ("options", "name"),
    [({"timeout": float("nan")}, "timeout"), ({"timeout": 0}, "timeout"), ({"grace": -1}, "grace")],
)
def test_shell_tool_refuses_bad_options(options: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        shell_tool(**options)


def test_delegate_returns_the_child_agents_answer(provider: Provider, client: ChatClient) -> None:
    def script(request: dict[str, Any]) -> Mapping[str, Any] | None:
        last = _last(request)
        if last["content"] == "parent task":
            return call("delegate", {"task": "child task"})
        if last["content"] == "child task":
            return {"content": "child says 42"}
        return {"content": f"parent heard: {last['content']}"}

    provider.script = script
    parent = AIAgent(client, tools=[delegate_tool(lambda: AIAgent(client))])
    result = parent.run_conversation("parent task")
    assert result.final_text == "parent heard: child says 42"
    assert result.usage.requests == 2  # the child's request is its own turn's


def test_http_get_tool_fetches_through_the_scope(provider: Provider) -> None:
    http_get = http_get_tool()
    health = provider.server.url + "/health"
    assert http_get.call(json.dumps({"url": health})) == 'HTTP 200\n{"status":"ok"}'
    with pytest.raises(ToolCallError, match="http:// or https://"):
        http_get.call('{"url": "file:///etc/passwd"}')
    scope = InterruptScope()
    scope.cancel("user")
    with ws.bind_scope(scope), pytest.raises(ws.Interrupted):
        http_get.call(json.dumps({"url": health}))
