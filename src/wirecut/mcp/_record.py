"""``McpCallRecord``: what a client knows about a tool call it cancelled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wirecut.mcp._facts import StopFacts

__all__ = ["McpCallRecord"]


@dataclass(frozen=True)
class McpCallRecord:
    """One cancelled tool call: which server and tool, and whether the server stopped it.

    ``stopped`` is True only when the server confirmed the stop (a
    ``wirecut.mcp`` server's facts say so, or the call was cut before it was
    sent), False when the server answered the call anyway or its facts say the
    work went on (it committed, or its thread outlived the unwind bound), and
    None when nothing can be known (a server that says nothing after a cancel).
    ``facts`` are the server's, when it sent them.
    """

    server: str
    tool: str
    stopped: bool | None
    facts: StopFacts | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"server": ..., "tool": ..., "stopped": ...}``, the console's per-call entry."""
        return {"server": self.server, "tool": self.tool, "stopped": self.stopped}
