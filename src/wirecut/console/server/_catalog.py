"""``GET /api/commands``: what the console can run and how its unwind steps read.

Clients that offer completion or draw a timeline (the web page) take both from
here instead of keeping their own copies: a command added to the server, or a
new timeline event, reaches them without a new client. The answer is built
from the runner's command set and the scope's timeline events each time (it is
small), so it says what this server runs. See docs/protocol.md.

Event loop only (a route handler); it reads, never changes, the command set.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from wirecut.console.commands import Command
from wirecut.record import TIMELINE_EVENTS

__all__ = ["TIMELINE_EVENTS", "catalog"]


def _label(event: str) -> str:
    return event.replace("_", " ")


def catalog(commands: Iterable[Command]) -> dict[str, Any]:
    """The ``/api/commands`` body: ``commands`` (in their order) and the timeline labels."""
    return {
        "commands": [
            {"name": command.name, "usage": command.usage, "summary": command.summary}
            for command in commands
        ],
        "timeline": {event: _label(event) for event in TIMELINE_EVENTS},
    }
