"""A host's MCP servers (``wirecut.agent.McpServers``): started together, the bad ones left out.

Real servers: the example (examples/mcp_server.py) over stdio and over
Streamable HTTP in this process, and ``_fake_mcp.py``, a stdio server that
breaks the protocol in one way per mode. Each bad one is left out with one
line that names it, the good ones serve, and ``close()`` leaves no process.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from _mcp import BOUND, EXAMPLE, SRC, example, serve_http
from _pids import exited
from wirecut.agent import McpServers, McpServerSpec, McpServerStatus
from wirecut.agent._tools import MAX_OUTPUT
from wirecut.mcp import McpProtocolError

FAKE = Path(__file__).resolve().parent / "_fake_mcp.py"
PYTHON = sys.executable


def _example(name: str = "tools") -> McpServerSpec:
    return McpServerSpec(name, f"{PYTHON} {EXAMPLE}", env={"PYTHONPATH": str(SRC)})


def _fake(name: str, mode: str) -> McpServerSpec:
    return McpServerSpec(name, f"{PYTHON} {FAKE} {mode}")


# -- the configuration --------------------------------------------------------------------


def test_a_spec_is_a_name_and_a_command_or_a_url() -> None:
    stdio = McpServerSpec.parse("tools=python 'my server.py' --flag")
    assert (stdio.name, stdio.transport) == ("tools", "stdio")
    assert stdio.target == "python 'my server.py' --flag"
    http = McpServerSpec.parse("web = https://user:secret@example.com:8443/mcp?key=secret")
    assert (http.name, http.transport) == ("web", "http")
    # Messages never show what may be a secret in a URL.
    assert http.where == "http: https://example.com:8443/mcp"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tools", "'tools' is not NAME=COMMAND or NAME=URL"),
        ("tools=", "'tools=' is not NAME=COMMAND or NAME=URL"),
        ("=python x.py", "MCP server name '' must be 1 to 32 letters and digits"),
        ("a__b=python x.py", "MCP server name 'a__b' must be"),
        ("tool_=python x.py", "MCP server name 'tool_' must be"),
        ("my tools=python x.py", "MCP server name 'my tools' must be"),
        ("t=python 'x.py", "MCP server 't': cannot read the command \"python 'x.py\""),
        ("t=http:///mcp", "MCP server 't': the URL 'http:///mcp' has no host"),
    ],
)
def test_a_bad_spec_is_one_line_saying_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        McpServerSpec.parse(text)
    assert "\n" not in str(caught.value)


def test_a_name_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="MCP server name 'tools' is given twice"):
        McpServers([_example(), _fake("tools", "good")])


# -- starting, serving, closing -------------------------------------------------------------


def test_every_server_is_started_and_the_bad_ones_are_left_out_with_one_line() -> None:
    servers = McpServers(
        [
            _example(),
            McpServerSpec("missing", "no-such-mcp-server --stdio"),
            _fake("garbage", "garbage"),
            _fake("exits", "exit"),
            _fake("nolist", "no-list"),
        ],
        list_timeout=1.0,
    )
    lines: list[str] = []
    try:
        servers.start(echo=lines.append)
        status = {server.name: server.status for server in servers.servers}
        assert status == {
            "tools": McpServerStatus.READY,
            "missing": McpServerStatus.UNAVAILABLE,
            "garbage": McpServerStatus.UNAVAILABLE,
            "exits": McpServerStatus.UNAVAILABLE,
            "nolist": McpServerStatus.UNAVAILABLE,
        }
        assert [t.name for t in servers.tools()] == ["tools__fetch", "tools__run", "tools__wait"]
        assert len(lines) == 5
        assert lines[0].startswith("MCP server 'tools' (stdio: ")
        assert lines[0].endswith("3 tools: fetch, run, wait")
        for line, name, why in zip(
            lines[1:],
            ["missing", "garbage", "exits", "nolist"],
            [
                "did not start: No such file or directory: no-such-mcp-server",
                "wrote something that is not MCP on stdout",
                "exited with code 3 (fatal: no config)",
                "did not answer tools/list within 1 s",
            ],
            strict=True,
        ):
            assert line.startswith(f"MCP server {name!r} ")
            assert why in line
            assert line.endswith("; serving without it")
            assert "\n" not in line
        # help and /api/commands say the same, per server.
        help_lines = servers.lines()
        assert help_lines[0].endswith(": tools__fetch, tools__run, tools__wait")
        assert help_lines[1] == (
            "missing (stdio: no-such-mcp-server --stdio): not used: MCP server 'missing' did not "
            "start: No such file or directory: no-such-mcp-server"
        )
        listed = servers.to_json()
        assert [entry["status"] for entry in listed] == ["ready", *["unavailable"] * 4]
        assert [t["tool"] for t in listed[0]["tools"]] == ["fetch", "run", "wait"]
        assert listed[3]["tools"] == []
        assert "exited with code 3" in listed[3]["error"]
        [ready] = [server for server in servers.servers if server.client is not None]
        assert ready.client is not None
        pid = ready.client.server_pid
        assert pid is not None
    finally:
        servers.close()
    assert exited(pid, BOUND)  # Its process is gone, and reaped (not a zombie of ours).
    assert {server.status for server in servers.servers} == {McpServerStatus.CLOSED}
    assert servers.tools() == []


def test_an_http_server_is_reached_by_its_url() -> None:
    with serve_http(example.build()) as url, McpServers([McpServerSpec("web", url)]) as servers:
        [server] = servers.servers
        assert server.status is McpServerStatus.READY
        assert server.spec.where == f"http: {url}"
        wait = {t.name: t for t in servers.tools()}["web__wait"]
        assert wait.call(json.dumps({"seconds": 0})) == "waited 0.0 s"


def test_a_huge_result_reaches_the_model_cut_to_size() -> None:
    with McpServers([_fake("big", "huge")]) as servers:
        [echo] = servers.tools()
        text = echo.call("{}")
        assert text.startswith("x" * MAX_OUTPUT)
        assert text.endswith(f"[... {(1 << 20) - MAX_OUTPUT} more characters cut]")
        assert servers.servers[0].status is McpServerStatus.READY


def test_a_result_over_the_message_bound_leaves_the_server_out() -> None:
    with McpServers([_fake("big", "huge"), _example()], max_message_bytes=64 * 1024) as servers:
        big, tools = servers.servers
        [echo] = [t for t in servers.tools() if t.name == "big__echo"]
        with pytest.raises(McpProtocolError) as caught:
            echo.call("{}")
        assert "'big'" in str(caught.value)
        assert big.status is McpServerStatus.BROKEN
        assert big.problem == str(caught.value)
        assert big.line().startswith(f"big ({big.spec.where}): not used: MCP server 'big' ")
        # The other server goes on; the broken one's tools are no longer offered.
        assert tools.status is McpServerStatus.READY
        assert [t.name for t in servers.tools()] == ["tools__fetch", "tools__run", "tools__wait"]
