"""``wirecut mcp-probe (COMMAND | URL) TOOL``: does this MCP server stop a cancelled call?

Connects to any MCP server (a stdio command, or a Streamable HTTP URL),
calls TOOL with ``--args``, cancels the call after ``--cancel-after``
seconds as a console command's cancel would (``McpClient`` under a scope),
and reports whether the server stopped it. The last line on stdout is one
JSON object (docs/protocol.md, "MCP"):
``{"server", "tool", "cancel_after_s", "stopped", "facts"}``; ``stopped`` is
true only when the server confirmed the stop (a ``wirecut.mcp`` server's
facts), false when it answered the call anyway, null when nothing can be
known. Exits 0 unless the probe itself failed (1), or on a usage error (2).
"""

from __future__ import annotations

import concurrent.futures
import json
import math
from typing import Any

import click

from wirecut._json import JSONError, loads
from wirecut.cli._options import seconds_option

__all__ = ["mcp_probe"]


def _arguments(ctx: click.Context, param: click.Parameter, value: str) -> dict[str, Any]:
    try:
        parsed = loads(value)
    except JSONError as exc:
        raise click.BadParameter(str(exc)) from None
    if not isinstance(parsed, dict):
        raise click.BadParameter(f"must be a JSON object, not {type(parsed).__name__}")
    return parsed


def _seconds(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise click.BadParameter(f"must be a finite number of seconds >= 0, not {value}")
    return value


@click.command("mcp-probe")
@click.argument("server", metavar="(COMMAND | URL)")
@click.argument("tool")
@click.option(
    "--args",
    "arguments",
    default="{}",
    callback=_arguments,
    metavar="JSON",
    help="The tool's arguments, a JSON object. Default: {}.",
)
@seconds_option(
    "--cancel-after",
    1.0,
    "Seconds from the call to its cancel.",
    check=_seconds,
    metavar="S",
)
@seconds_option(
    "--confirm-timeout",
    10.0,
    "How long to wait for the server to confirm the stop.",
    check=_seconds,
    metavar="S",
)
@seconds_option(
    "--connect-timeout",
    10.0,
    "How long the server may take to start and finish the handshake.",
    check=_seconds,
    metavar="S",
)
def mcp_probe(
    server: str,
    tool: str,
    arguments: dict[str, Any],
    cancel_after: float,
    confirm_timeout: float,
    connect_timeout: float,
) -> None:
    """Call TOOL on an MCP server, cancel it, and tell whether the server stopped it."""
    try:
        from wirecut.mcp import McpCallInterrupted, McpClient, McpError
    except ImportError as exc:
        raise click.ClickException(str(exc)) from None
    from wirecut.scope import InterruptScope

    try:
        client = McpClient(
            server,
            name=server,
            connect_timeout=connect_timeout,
            confirm_timeout=confirm_timeout,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="(COMMAND | URL)") from None
    try:
        with client:  # Connects; a server that cannot be used is an McpError.
            names = [listed.name for listed in client.list_tools()]
            if tool not in names:
                listed = ", ".join(names) or "-"
                raise click.ClickException(
                    f"MCP server {server!r} has no tool {tool!r} (it has: {listed})"
                )
            scope = InterruptScope("mcp-probe")
            call = scope.spawn(client.call_tool, tool, arguments)
            done, _ = concurrent.futures.wait([call], timeout=cancel_after)
            if done:
                # It ended before the cancel: nothing was probed.
                answer = call.result()
                click.echo(
                    f"{tool} answered before the cancel ({_answer(answer)}); "
                    "try a longer call or a shorter --cancel-after"
                )
                _report(server, tool, cancel_after, None, None)
                return
            scope.cancel("mcp-probe")
            error = call.exception(confirm_timeout + 30.0)
    except McpError as exc:
        raise click.ClickException(str(exc)) from None
    if not isinstance(error, McpCallInterrupted):
        raise click.ClickException(f"the cancelled call ended with {error!r}")
    record = error.record
    click.echo(f"called {tool} on {server}, cancelled it after {cancel_after:g} s")
    if record.facts is not None:
        click.echo(f"the server says: {record.facts.summary()}")
    click.echo(_verdict(record.stopped))
    _report(
        server,
        tool,
        cancel_after,
        record.stopped,
        None if record.facts is None else record.facts.to_json(),
    )


def _answer(result: Any) -> str:
    return "an error result" if getattr(result, "is_error", False) else "a result"


def _verdict(stopped: bool | None) -> str:
    if stopped is True:
        return "stopped: yes, the server confirmed it"
    if stopped is False:
        return "stopped: NO, the server went on with the call"
    return "stopped: unknown, the server said nothing after the cancel"


def _report(
    server: str,
    tool: str,
    cancel_after: float,
    stopped: bool | None,
    facts: dict[str, Any] | None,
) -> None:
    click.echo(
        json.dumps(
            {
                "server": server,
                "tool": tool,
                "cancel_after_s": cancel_after,
                "stopped": stopped,
                "facts": facts,
            }
        )
    )
