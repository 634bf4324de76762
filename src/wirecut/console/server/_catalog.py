"""``GET /api/commands``: what the console can run, its MCP tools, and how its unwind steps read.

Clients that offer completion or draw a timeline (the web page) take both from
here instead of keeping their own copies: a command added to the server, or a
new timeline event, reaches them without a new client. The answer is built
from the runner's command set and the scope's timeline events each time (it is
small), so it says what this server runs: its MCP servers' status too (a
server whose connection broke is shown so). See docs/protocol.md.

Event loop only (a route handler); it reads, never changes, the command set.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from wirecut.console.commands import Command
from wirecut.record import TIMELINE_EVENTS

if TYPE_CHECKING:
    from wirecut.agent import McpServers

__all__ = ["TIMELINE_EVENTS", "catalog"]


def _label(event: str) -> str:
    return event.replace("_", " ")


def catalog(commands: Iterable[Command], mcp: McpServers | None = None) -> dict[str, Any]:
    """The ``/api/commands`` body: ``commands`` (in their order), the timeline labels, and
    each MCP server with the tools it offers now (``mcp``: ``[]`` without any)."""
    return {
        "commands": [
            {"name": command.name, "usage": command.usage, "summary": command.summary}
            for command in commands
        ],
        "timeline": {event: _label(event) for event in TIMELINE_EVENTS},
        "mcp": [] if mcp is None else mcp.to_json(),
    }
