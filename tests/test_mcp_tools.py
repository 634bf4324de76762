"""MCP servers' tools for an agent (``wirecut.agent._mcp_tools``): offered bounded, cut for real.

What the model sees is checked on the SDK's own ``Tool`` values: each tool
as ``SERVER__TOOL``, two servers never colliding, a schema or a name that
does not fit left out with a note. Calls go through a real ``McpClient`` to
the example server (examples/mcp_server.py, over stdio and over Streamable
HTTP in this process), driven by an ``AIAgent`` whose "model" is the
simulator asking for the tool call; a cancel of the host's scope cuts the
call, and ``McpCalls`` says what the server did with it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from typing import Any

import pytest
from mcp_types import CallToolResult, ImageContent, TextContent
from mcp_types import Tool as ListedTool

from _loopback import Exchange, LoopbackServer
from _mcp import BOUND, EXAMPLE, SRC, example, serve_http, threads_in
from _support import until
from wirecut.agent import (
    AIAgent,
    ConversationResult,
    ConversationStatus,
    McpCalls,
    McpToolSpec,
    ToolRegistry,
    mcp_tool,
    offered_tools,
    result_text,
    shell_tool,
)
from wirecut.agent._mcp_tools import MAX_DESCRIPTION, MAX_SCHEMA_BYTES, MAX_TOOLS
from wirecut.agent._tools import MAX_OUTPUT
from wirecut.mcp import McpClient
from wirecut.provider import ChatClient
from wirecut.record import McpCallFacts
from wirecut.scope import InterruptScope
from wirecut.simulator import SimConfig, SimulatorServer

OBJECT = {"type": "object", "properties": {"x": {"type": "string"}}}


def _listed(name: str, schema: Any = None, description: str | None = "Does it.") -> ListedTool:
    return ListedTool(
        name=name, description=description, input_schema=OBJECT if schema is None else schema
    )


def _names(offered: list[McpToolSpec]) -> list[str]:
    return [spec.name for spec in offered]


# -- what the model sees ----------------------------------------------------------------


def test_each_tool_is_offered_as_server__tool_and_two_servers_never_collide() -> None:
    a, _ = offered_tools("files", [_listed("read"), _listed("write")])
    b, _ = offered_tools("web", [_listed("read")])
    assert _names(a) == ["files__read", "files__write"]
    assert _names(b) == ["web__read"]
    assert [(spec.server, spec.tool) for spec in a + b] == [
        ("files", "read"),
        ("files", "write"),
        ("web", "read"),
    ]
    # Beside each other and beside a built-in tool, in one agent: no name is taken twice.
    registry = ToolRegistry([shell_tool(), *(mcp_tool(_NO_CLIENT, spec) for spec in a + b)])
    assert sorted(t.name for t in registry) == ["files__read", "files__write", "shell", "web__read"]


def test_a_name_a_provider_refuses_is_rewritten_and_a_clash_left_out() -> None:
    offered, notes = offered_tools(
        "srv", [_listed("get.page"), _listed("get/page"), _listed(""), _listed("x" * 70)]
    )
    assert _names(offered) == ["srv__get_page"]
    assert offered[0].tool == "get.page"  # The call names it as the server does.
    assert len(notes) == 3
    assert "'get/page' is not offered: its name as offered (srv__get_page) is another" in notes[0]
    assert "'' is not offered: it has no name" in notes[1]
    assert "longer than 64 characters" in notes[2]


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"type": "array", "items": {}}, "not of type object"),
        ({"type": "object", "properties": {"x": {"type": 5}}}, "not valid JSON Schema"),
        (
            {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}},
            f"bytes (at most {MAX_SCHEMA_BYTES})",
        ),
        (
            {"type": "object", "properties": {"x": json.loads('{"a":' * 80 + "1" + "}" * 80)}},
            "cannot be read",
        ),
    ],
)
def test_a_schema_that_does_not_fit_is_not_offered_and_a_note_says_why(
    schema: dict[str, Any], why: str
) -> None:
    offered, notes = offered_tools("srv", [_listed("bad", schema), _listed("good")])
    assert _names(offered) == ["srv__good"]
    [note] = notes
    assert note.startswith("tool 'bad' is not offered: its input schema")
    assert why in note
    assert "\n" not in note


def test_at_most_max_tools_of_a_server_are_offered() -> None:
    offered, notes = offered_tools("srv", [_listed(f"t{i}") for i in range(MAX_TOOLS + 2)])
    assert len(offered) == MAX_TOOLS
    assert notes == [
        f"tool 't{i}' is not offered: more than {MAX_TOOLS} tools"
        for i in (MAX_TOOLS, MAX_TOOLS + 1)
    ]


def test_a_long_description_is_cut_and_the_schema_is_the_servers() -> None:
    [spec], _ = offered_tools("srv", [_listed("t", description="word " * 1000)])
    assert len(spec.description) == MAX_DESCRIPTION
    assert spec.description.endswith("...")
    assert spec.parameters == OBJECT
    assert mcp_tool(_NO_CLIENT, spec).schema()["function"]["parameters"] == OBJECT


def test_a_result_reaches_the_model_as_bounded_text() -> None:
    text = TextContent(type="text", text="hello")
    image = ImageContent(type="image", data="QUJD", mime_type="image/png")
    assert result_text(CallToolResult(content=[text, image])) == (
        "hello\n[image: image/png, 4 base64 characters]"
    )
    assert result_text(CallToolResult(content=[text], is_error=True)) == "error: hello"
    assert result_text(CallToolResult(content=[], structured_content={"n": 1})) == '{"n": 1}'
    long = result_text(CallToolResult(content=[TextContent(type="text", text="x" * 50_000)]))
    assert long.startswith("x" * MAX_OUTPUT)
    assert long.endswith(f"[... {50_000 - MAX_OUTPUT} more characters cut]")


class _NoClient:
    """Stands for a client in tests that only look at the offered tool."""

    def call_tool(self, tool: str, arguments: Mapping[str, Any]) -> CallToolResult:
        raise AssertionError("not called")


_NO_CLIENT: Any = _NoClient()


# -- calls through a real client, driven by an agent --------------------------------------


class Model:
    """The simulator as the agent's model: asks for one tool call, then answers with its result."""

    def __init__(self, name: str, arguments: dict[str, Any]) -> None:
        function = {"name": name, "arguments": arguments}
        self.call = {"tool_calls": [{"id": "c1", "function": function}]}
        self.tool_results: list[str] = []
        config = SimConfig(slots=2, tokens_per_second=200, prompt_ms=5)
        self.server = SimulatorServer(config, responder=self.respond)

    def respond(self, request: dict[str, Any]) -> Mapping[str, Any]:
        last = request["messages"][-1]
        if last["role"] == "tool":
            self.tool_results.append(last["content"])
            return {"content": "done"}
        return self.call


@pytest.fixture
def example_client() -> Iterator[McpClient]:
    argv = [sys.executable, str(EXAMPLE)]
    with McpClient(argv, name="tools", env={"PYTHONPATH": str(SRC)}, confirm_timeout=BOUND) as c:
        yield c


def _agent_of(client: McpClient, model: Model, calls: McpCalls) -> AIAgent:
    offered, notes = offered_tools("tools", client.list_tools())
    assert notes == []
    chat = ChatClient(model.server.base_url, model="sim")
    return AIAgent(chat, tools=[mcp_tool(client, spec, calls=calls) for spec in offered])


def _in_host(agent: AIAgent) -> tuple[InterruptScope, Future[ConversationResult]]:
    host = InterruptScope("command")
    return host, host.spawn(agent.run_conversation, "go")


def test_an_agent_calls_an_mcp_tool_and_the_model_gets_its_result(
    example_client: McpClient,
) -> None:
    model = Model("tools__wait", {"seconds": 0})
    calls = McpCalls()
    with model.server:
        result = _agent_of(example_client, model, calls).run_conversation("go")
    assert result.status is ConversationStatus.OK
    assert model.tool_results == ["waited 0.0 s"]
    assert len(calls) == 1
    assert calls.report() == ()  # It answered by itself: no cut call to report.


def test_a_cut_turn_cancels_the_call_and_records_that_the_server_stopped_it(
    example_client: McpClient,
) -> None:
    def held(exchange: Exchange) -> None:
        exchange.hold(timeout=BOUND * 3)

    with LoopbackServer(held, name="upstream") as upstream:
        model = Model("tools__fetch", {"url": upstream.url})
        calls = McpCalls()
        with model.server:
            host, future = _in_host(_agent_of(example_client, model, calls))
            assert upstream.wait_requests(1, BOUND)  # The tool's GET is held upstream.
            host.cancel("user")
            result = future.result(BOUND)
            assert result.status is ConversationStatus.INTERRUPTED
            assert result.reason == "user"
            assert calls.report() == (McpCallFacts("tools", "fetch", True),)
            assert upstream.wait_closed(0, BOUND)  # The server's fetch was cut.
            assert host.wait_quiescent(BOUND)
            assert model.tool_results == []


def test_a_call_whose_server_has_not_answered_is_reported_unknown() -> None:
    calls = McpCalls()
    with serve_http(example.build(plain=True)) as url, McpClient(url, name="plain") as client:
        [spec] = [s for s in offered_tools("plain", client.list_tools())[0] if s.tool == "wait"]
        tool = mcp_tool(client, spec, calls=calls)
        host = InterruptScope("command")
        future = host.spawn(tool.call, json.dumps({"seconds": 1.0}))
        until(lambda: bool(threads_in(example.wait)))
        # Asked now, the call is in flight: what became of it is not known.
        assert calls.report() == (McpCallFacts("plain", "wait", None),)
        assert future.result(BOUND) == "waited 1.0 s"
        assert calls.report() == ()
