"""Reading notes from JSON Lines: every line is checked before anything is written.

One JSON object a line::

    {"title": "Trip to Lyon", "body": "Train at 9:12", "state": "active",
     "created_at": "2024-05-01T09:00:00Z", "last_used_at": 1714554000}

``title`` and ``body`` are required; ``state`` defaults to "active";
``created_at`` and ``last_used_at`` (ISO 8601, a time without a zone being
UTC, or Unix seconds) default to the time of the import and to
``created_at``. Any other field is an error, so that a typo is not silently
dropped. Blank lines are skipped. Pure functions; call from anywhere.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from wirecut.memory._errors import NoteImportError
from wirecut.memory._notes import NoteState, check_body, check_title

__all__ = ["FIELDS", "NoteDraft", "parse_note_lines"]

FIELDS = ("title", "body", "state", "created_at", "last_used_at")


@dataclass(frozen=True, slots=True)
class NoteDraft:
    """A checked line: what the store inserts for it."""

    title: str
    body: str
    state: NoteState
    created_at: float
    last_used_at: float


def parse_note_lines(data: bytes, *, now: float) -> list[NoteDraft]:
    """Check every line of ``data`` and return the notes.

    Raises ``NoteImportError`` at the first bad line; the error names the
    1-based line number and, when one field is at fault, the field.
    """
    drafts: list[NoteDraft] = []
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NoteImportError(
                f"line {number}: not UTF-8 text ({exc.reason})", line=number
            ) from None
        if not text.strip():
            continue
        drafts.append(_parse_line(text, number, now))
    return drafts


def _parse_line(text: str, number: int, now: float) -> NoteDraft:
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise NoteImportError(f"line {number}: not JSON: {exc}", line=number) from None
    if not isinstance(obj, dict):
        raise NoteImportError(
            f"line {number}: must be a JSON object, not {_json_kind(obj)}", line=number
        )
    for name in obj:
        if name not in FIELDS:
            raise NoteImportError(
                f"line {number}: unknown field {name!r} (known: {', '.join(FIELDS)})",
                line=number,
                field=name,
            )
    for name in ("title", "body"):
        if name not in obj:
            raise NoteImportError(
                f"line {number}: field {name!r} is missing", line=number, field=name
            )

    def field(name: str, check: Any) -> Any:
        try:
            return check(obj[name])
        except ValueError as exc:
            raise NoteImportError(
                f"line {number}: field {name!r} {exc}", line=number, field=name
            ) from None

    title = field("title", check_title)
    body = field("body", check_body)
    state = field("state", _state) if obj.get("state") is not None else NoteState.ACTIVE
    created_at = field("created_at", _time) if obj.get("created_at") is not None else now
    last_used_at = (
        field("last_used_at", _time) if obj.get("last_used_at") is not None else created_at
    )
    if last_used_at < created_at:
        raise NoteImportError(
            f"line {number}: field 'last_used_at' is before 'created_at'",
            line=number,
            field="last_used_at",
        )
    return NoteDraft(title, body, state, created_at, last_used_at)


def _state(value: object) -> NoteState:
    states = ", ".join(s.value for s in NoteState)
    if not isinstance(value, str) or value not in {s.value for s in NoteState}:
        raise ValueError(f"must be one of {states}, not {json.dumps(value)}")
    return NoteState(value)


def _time(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"must be an ISO 8601 time or Unix seconds, not {_json_kind(value)}")
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"is not an ISO 8601 time: {value!r}") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"must be a finite number of seconds >= 0, not {value!r}")
    return seconds


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
