"""What a note is: ``NoteState`` and ``Note``, plus the checks a new note must pass.

Plain data, safe to pass between threads. Times are Unix seconds (``time.time()``),
stored as SQLite REAL: a float read back is the float written, so a ``Note``
read twice compares equal while its row is unchanged.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "BODY_MAX_CHARS",
    "TITLE_MAX_CHARS",
    "Note",
    "NoteState",
    "Umbrella",
    "check_body",
    "check_title",
]

#: A title is one line of at most this many characters.
TITLE_MAX_CHARS = 200
#: A body longer than this is refused (a note, not a document store).
BODY_MAX_CHARS = 100_000


class NoteState(enum.StrEnum):
    """Where a note is in its life; the curator moves it along, a use moves it back."""

    ACTIVE = "active"  # in use: listed, and offered to the curator for consolidation
    STALE = "stale"  # unused for long: a later sweep archives it unless it is used again
    ARCHIVED = "archived"  # kept, out of the way: stale for long, or merged into an umbrella


@dataclass(frozen=True, slots=True)
class Note:
    """One row of the store.

    ``umbrella_id`` is the umbrella note this one was merged into (None if it
    was not); ``state_changed_at`` is when ``state`` last changed (the sweep
    archives notes stale for long, measured from it).
    """

    id: int
    title: str
    body: str
    state: NoteState
    created_at: float
    last_used_at: float
    state_changed_at: float
    umbrella_id: int | None = None


@dataclass(frozen=True, slots=True)
class Umbrella:
    """An umbrella note to create over existing notes, which are merged into it.

    The merged notes are archived and linked to the umbrella (``umbrella_id``);
    their text stays in the store. ``body`` is what the umbrella note says:
    its notes' own text (``umbrella_body``), after ``summary`` when one was
    asked for (None: none was).
    """

    title: str
    body: str
    note_ids: tuple[int, ...]
    summary: str | None = None


def check_title(title: object) -> str:
    """Return ``title`` if it is a fit title, else raise ValueError saying what is wrong."""
    if not isinstance(title, str):
        raise ValueError(f"must be a string, not {type(title).__name__}")
    if not title.strip():
        raise ValueError("must not be empty")
    if len(title) > TITLE_MAX_CHARS:
        raise ValueError(f"must be at most {TITLE_MAX_CHARS} characters, not {len(title)}")
    if any(ch in title for ch in "\r\n\x00"):
        raise ValueError("must be one line")
    return title


def check_body(body: object) -> str:
    """Return ``body`` if it is a fit body (any text, even empty), else raise ValueError."""
    if not isinstance(body, str):
        raise ValueError(f"must be a string, not {type(body).__name__}")
    if len(body) > BODY_MAX_CHARS:
        raise ValueError(f"must be at most {BODY_MAX_CHARS} characters, not {len(body)}")
    if "\x00" in body:
        raise ValueError("must not contain NUL characters")
    return body
