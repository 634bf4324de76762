"""The client's frames on ``/api/console``, checked at the boundary (docs/protocol.md).

``parse_frame(text)`` returns one of ``Run``, ``Confirm``, ``Cancel``,
``Ping``, or raises ``FrameError`` whose message names the field that is wrong
and why; the connection answers it with an ``error`` frame and stays open.
Checks that need the connection's state (a duplicate live id, an id that is
not live) are the connection's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_FRAME_CHARS",
    "MAX_ID_CHARS",
    "MAX_LINE_CHARS",
    "Cancel",
    "Confirm",
    "FrameError",
    "Ping",
    "Run",
    "parse_frame",
]

#: A text frame longer than this is refused with an error frame (the connection stays).
MAX_FRAME_CHARS = 64 * 1024
#: A command line longer than this is refused.
MAX_LINE_CHARS = 16 * 1024
#: Ids are the client's: 1 to 64 characters.
MAX_ID_CHARS = 64


class FrameError(Exception):
    """A frame the protocol does not allow.

    ``id`` is the frame's id when it had a usable one, ``kind`` its type when
    it had a known one.
    """

    def __init__(self, message: str, id: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.id = id
        self.kind = kind


@dataclass(frozen=True)
class Run:
    id: str | None
    line: str
    timeout: float | None


@dataclass(frozen=True)
class Confirm:
    id: str


@dataclass(frozen=True)
class Cancel:
    id: str | None  # None: every command of the connection


@dataclass(frozen=True)
class Ping:
    pass


Frame = Run | Confirm | Cancel | Ping

_FIELDS = {
    "run": {"type", "id", "line", "timeout"},
    "confirm": {"type", "id"},
    "cancel": {"type", "id"},
    "ping": {"type"},
}


def parse_frame(text: str) -> Frame:
    """Check one client text frame; raises ``FrameError`` naming the problem."""
    if len(text) > MAX_FRAME_CHARS:
        raise FrameError(f"frame too large: {len(text)} characters (at most {MAX_FRAME_CHARS})")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise FrameError(f"not JSON: {exc}") from None
    except RecursionError:
        # json's C decoder recurses once per level: 1,100 bytes of "[[[[" reach
        # the interpreter's limit. No frame of the protocol nests past one level.
        raise FrameError("not a frame: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise FrameError(f"a frame must be a JSON object, not {type(data).__name__}")
    kind = data.get("type")
    if not isinstance(kind, str):
        raise FrameError("'type' is missing or not a string")
    if kind not in _FIELDS:
        raise FrameError(f"unknown type {kind!r} (expected one of: run, confirm, cancel, ping)")
    id = _id(data, required=kind == "confirm", kind=kind)
    unknown = sorted(set(data) - _FIELDS[kind])
    if unknown:
        raise FrameError(f"unknown field(s) for {kind}: {', '.join(unknown)}", id, kind)
    if kind == "ping":
        return Ping()
    if kind == "cancel":
        return Cancel(id)
    if kind == "confirm":
        assert id is not None
        return Confirm(id)
    line = data.get("line")
    if not isinstance(line, str):
        raise FrameError("'line' is missing or not a string", id, kind)
    if len(line) > MAX_LINE_CHARS:
        raise FrameError(
            f"'line' too long: {len(line)} characters (at most {MAX_LINE_CHARS})", id, kind
        )
    return Run(id, line, _timeout(data.get("timeout"), id))


def _id(data: dict[str, Any], *, required: bool, kind: str) -> str | None:
    if "id" not in data or (data["id"] is None and not required):
        if required:
            raise FrameError("'id' is required", kind=kind)
        return None
    value = data["id"]
    if not isinstance(value, str):
        raise FrameError(f"'id' must be a string, not {type(value).__name__}", kind=kind)
    if not 1 <= len(value) <= MAX_ID_CHARS:
        raise FrameError(
            f"'id' must be 1 to {MAX_ID_CHARS} characters, not {len(value)}", kind=kind
        )
    return value


def _timeout(value: Any, id: str | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FrameError(
            f"'timeout' must be a number of seconds, not {type(value).__name__}", id, "run"
        )
    if not math.isfinite(value) or value <= 0:
        raise FrameError(
            f"'timeout' must be a finite number of seconds > 0, not {value}", id, "run"
        )
    return float(value)
