"""``GET /api/commands``: the commands and timeline labels clients take from the server.

Against a real console on loopback (uvicorn, real sockets): the answer is
authenticated like ``/api/health`` and says what this server runs.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from _console import running_console
from wirecut.console.commands import Args, CommandContext, builtin_commands, command
from wirecut.console.server._catalog import catalog
from wirecut.record import TIMELINE_EVENTS
from wirecut.scope import TimelineEvent


@command("test-extra", summary="(tests) a command of this console only")
def _extra(ctx: CommandContext, args: Args) -> None:
    pass


def test_api_commands_lists_the_consoles_commands_and_the_timeline_labels(
    tmp_path: Path,
) -> None:
    commands = builtin_commands().plus(_extra)
    with running_console(tmp_path, commands=commands) as console:
        url = console.server.url + "api/commands"
        token = str(console.server.token)
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer not-it"}).status_code == 401
        assert httpx.get(url, params={"token": token[:-1]}).status_code == 401
        by_header = httpx.get(url, headers={"Authorization": f"Bearer {token}"})
        by_query = httpx.get(url, params={"token": token})
    assert by_header.status_code == by_query.status_code == 200
    assert by_header.json() == by_query.json()
    body = by_header.json()
    assert body["commands"] == [
        {"name": c.name, "usage": c.usage, "summary": c.summary} for c in commands
    ]
    assert "test-extra" in {c["name"] for c in body["commands"]}
    assert {"chat", "curator run", "probe", "sleep"} <= {c["name"] for c in body["commands"]}
    timeline = body["timeline"]
    assert set(timeline) == set(TIMELINE_EVENTS)
    assert {event.value for event in TimelineEvent} | {"worker_exited"} <= set(timeline)
    assert timeline["cancel_requested"] == "cancel requested"
    assert all(isinstance(label, str) and label for label in timeline.values())


def test_catalog_takes_the_commands_it_is_given() -> None:
    mine = [c for c in builtin_commands() if c.name == "sleep"]
    assert catalog(mine)["commands"] == [
        {"name": "sleep", "usage": mine[0].usage, "summary": mine[0].summary}
    ]
