"""An MCP server written for the official SDK, whose sync tools a cancel really stops.

Three plain ``def`` tools, the kind most servers have:

- ``fetch(url)``: an HTTP GET (through ``wirecut.http``);
- ``run(argv)``: a process tree (through ``scope.popen``);
- ``wait(seconds)``: a sleep (``wirecut.scope.sleep``).

The only change from a server for the plain SDK is where ``MCPServer`` comes
from. With ``--plain`` the very same tools run on the SDK's own ``MCPServer``
(and with no scope bound, the helpers behave exactly as ``httpx``,
``subprocess`` and ``time.sleep`` do), for comparing: there a cancelled call
runs to its end.

    python examples/mcp_server.py                   # stdio
    python examples/mcp_server.py --http --port 8000   # Streamable HTTP at /mcp
    wirecut mcp-probe "python examples/mcp_server.py" wait --args '{"seconds": 30}'

Used by docs/mcp.md, tests/test_mcp*.py and bench/bench_mcp.py.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer as PlainMCPServer

import wirecut.http
import wirecut.scope
from wirecut.mcp import MCPServer

#: The most of a body or an output a tool returns.
MAX_TEXT = 64 * 1024


def fetch(url: str) -> str:
    """HTTP GET ``url``; the status line and (at most 64 KiB of) the body."""
    with wirecut.http.client(timeout=60) as http:
        response = http.get(url)
    return f"{response.status_code} {response.reason_phrase}\n{response.text[:MAX_TEXT]}"


def run(argv: list[str]) -> str:
    """Run ``argv`` (and whatever it starts); its exit code and (at most 64 KiB of) output."""
    scope = wirecut.scope.current_scope()
    options: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
    if scope is None:
        process: subprocess.Popen[bytes] = subprocess.Popen(argv, **options)
    else:
        process = scope.popen(argv, **options)
    with process:
        output, _ = process.communicate()
    return f"exit {process.returncode}\n{output.decode(errors='replace')[:MAX_TEXT]}"


def wait(seconds: float) -> str:
    """Wait ``seconds``."""
    wirecut.scope.sleep(seconds)
    return f"waited {seconds} s"


TOOLS: tuple[Callable[..., Any], ...] = (fetch, run, wait)


def build(
    *,
    plain: bool = False,
    timeout: float | None = None,
    unwind_timeout: float = 10.0,
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
) -> PlainMCPServer[Any]:
    """The server with the three tools: wirecut's ``MCPServer``, or the SDK's with ``plain``.

    ``timeout`` stops a call after that many seconds (wirecut's only);
    ``wrap`` is applied to each tool before it is registered (the bench times
    them with it).
    """
    if plain:
        if timeout is not None:
            raise ValueError("the plain SDK has no tool timeout")
        server: PlainMCPServer[Any] = PlainMCPServer("wirecut-example-plain")
        for tool in TOOLS:
            server.add_tool(wrap(tool) if wrap else tool)
        return server
    cutting: MCPServer[Any] = MCPServer("wirecut-example", unwind_timeout=unwind_timeout)
    for tool in TOOLS:
        cutting.add_tool(wrap(tool) if wrap else tool, timeout=timeout)
    return cutting


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", action="store_true", help="serve Streamable HTTP at /mcp")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--plain", action="store_true", help="the SDK's own MCPServer")
    parser.add_argument("--timeout", type=float, default=None, help="stop a call after S seconds")
    parser.add_argument("--unwind-timeout", type=float, default=10.0)
    args = parser.parse_args()
    try:
        server = build(plain=args.plain, timeout=args.timeout, unwind_timeout=args.unwind_timeout)
    except ValueError as exc:
        parser.error(str(exc))
    if args.http:
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run()


if __name__ == "__main__":
    main()
