"""Notes as text for people: the lines of ``memory list`` and ``memory show``.

Shared by the command line and the console so both print the same thing.
Times are shown in UTC. Pure functions; call from anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from wirecut.memory._notes import Note

__all__ = ["format_note", "format_notes", "format_time"]


def format_time(seconds: float) -> str:
    """``2024-05-01 09:00 UTC`` for Unix seconds."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M UTC")


def format_notes(notes: Sequence[Note]) -> list[str]:
    """One line per note: id, state, last use, title (and the umbrella it was merged into)."""
    if not notes:
        return ["no notes"]
    width = max(len(f"#{note.id}") for note in notes)
    lines = []
    for note in notes:
        merged = f"  (merged into #{note.umbrella_id})" if note.umbrella_id is not None else ""
        lines.append(
            f"{f'#{note.id}':<{width}}  {note.state:<8}  {format_time(note.last_used_at)}"
            f"  {note.title}{merged}"
        )
    return lines


def format_note(
    note: Note, *, umbrella: Note | None = None, merged: Sequence[Note] = ()
) -> list[str]:
    """The whole note: header, facts, body; the umbrella it is in and the notes merged into it."""
    lines = [
        f"#{note.id} {note.title}",
        f"state: {note.state} · created {format_time(note.created_at)}"
        f" · last used {format_time(note.last_used_at)}",
    ]
    if note.umbrella_id is not None:
        title = f" {umbrella.title}" if umbrella is not None else ""
        lines.append(f"merged into: #{note.umbrella_id}{title}")
    if merged:
        lines.append("merges: " + ", ".join(f"#{m.id} {m.title}" for m in merged))
    lines.append("")
    lines.extend(note.body.splitlines() or [""])
    return lines
