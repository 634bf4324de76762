"""The console's wire (docs/protocol.md, ``/api/console``): every frame, built and read here.

Client -> server: ``RunFrame``, ``ConfirmFrame``, ``CancelFrame`` and
``PingFrame``; a client builds the wire form with ``to_wire()``, the server
checks a text frame at the boundary with ``parse_frame(text)``, which
returns one of them or raises ``FrameError`` whose message names the field
that is wrong and why (the connection answers it with an ``error`` frame
and stays open). Checks that need the connection's state (a duplicate live
id, an id that is not live) are the connection's.

Server -> client: the ``*_frame`` functions build each frame the server
sends (``complete_frame`` from the typed ``CompleteFacts``); a client reads
one with ``read_frame``. The close codes, the timeline events a
``complete`` may hold (``TIMELINE_EVENTS``) and the ``/api/proof`` HMAC
(``proof``) are the protocol's too, so the server, the clients and the
page's catalog take them from here.

Pure functions and values: call them from any thread.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from wirecut.record._complete import CompleteFacts
from wirecut.scope import TimelineEvent

__all__ = [
    "CLOSE_FORBIDDEN_ORIGIN",
    "CLOSE_SLOW_READER",
    "CLOSE_UNAUTHORIZED",
    "DEFAULT_PROMPT",
    "MAX_FRAME_CHARS",
    "MAX_ID_CHARS",
    "MAX_LINE_CHARS",
    "PROOF_CHALLENGE",
    "TIMELINE_EVENTS",
    "CancelFrame",
    "ClientFrame",
    "ConfirmFrame",
    "Frame",
    "FrameError",
    "PingFrame",
    "RunFrame",
    "accepted_frame",
    "complete_frame",
    "confirm_required_frame",
    "error_frame",
    "output_frame",
    "parse_frame",
    "pong_frame",
    "proof",
    "read_frame",
    "ready_frame",
    "started_frame",
]

#: A frame as JSON-ready values (what ``json.dumps`` sends, what ``read_frame`` gives).
Frame = dict[str, Any]

#: A text frame longer than this is refused with an error frame (the connection stays).
MAX_FRAME_CHARS = 64 * 1024
#: A command line longer than this is refused.
MAX_LINE_CHARS = 16 * 1024
#: Ids are the client's: 1 to 64 characters.
MAX_ID_CHARS = 64

#: WebSocket close codes of the protocol: a wrong or missing token, a foreign
#: ``Origin``, a client whose unsent frames passed the server's outbox bound.
CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN_ORIGIN = 4403
CLOSE_SLOW_READER = 4429

#: The prompt a server announces in ``ready`` (and a client shows when none came).
DEFAULT_PROMPT = "wirecut> "

#: Every event a ``complete``'s timeline may hold, in the order an unwind goes:
#: the scope's own, then the runner's ``worker_exited`` and the steps a Ray host
#: adds (docs/protocol.md, "Extensions").
TIMELINE_EVENTS: tuple[str, ...] = (
    *(event.value for event in TimelineEvent),
    "host_cancelled",
    "host_killed",
    "host_worker_exited",
    "worker_exited",
)

#: A challenge for ``/api/proof``: 32 to 128 URL-safe characters.
PROOF_CHALLENGE = re.compile(r"[A-Za-z0-9_-]{32,128}")
#: The domain of ``/api/proof``'s HMAC.
_PROOF_DOMAIN = b"wirecut-console-proof/1"


def proof(token: str, instance: str, challenge: str) -> str:
    """The HMAC-SHA256 (hex) that proves knowing ``token``; the server and a client compute it.

    ``instance`` is the server's random id (in ``serve.json``): a proof made by
    another live console that happens to share the token does not pass.
    """
    message = b"\0".join([_PROOF_DOMAIN, instance.encode(), challenge.encode()])
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


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
class RunFrame:
    """Run ``line`` as command ``id`` (None: the server picks one), within ``timeout`` seconds."""

    id: str | None
    line: str
    timeout: float | None = None

    def to_wire(self) -> Frame:
        frame: Frame = {"type": "run", "id": self.id, "line": self.line}
        if self.timeout is not None:
            frame["timeout"] = self.timeout
        return frame


@dataclass(frozen=True)
class ConfirmFrame:
    """Go ahead with the ``confirm_required`` of ``id``."""

    id: str

    def to_wire(self) -> Frame:
        return {"type": "confirm", "id": self.id}


@dataclass(frozen=True)
class CancelFrame:
    """Cancel ``id`` (None: every command of the connection)."""

    id: str | None = None

    def to_wire(self) -> Frame:
        return {"type": "cancel"} if self.id is None else {"type": "cancel", "id": self.id}


@dataclass(frozen=True)
class PingFrame:
    """Ask for a ``pong``."""

    def to_wire(self) -> Frame:
        return {"type": "ping"}


ClientFrame = RunFrame | ConfirmFrame | CancelFrame | PingFrame

_FIELDS = {
    "run": {"type", "id", "line", "timeout"},
    "confirm": {"type", "id"},
    "cancel": {"type", "id"},
    "ping": {"type"},
}


def parse_frame(text: str) -> ClientFrame:
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
        return PingFrame()
    if kind == "cancel":
        return CancelFrame(id)
    if kind == "confirm":
        assert id is not None
        return ConfirmFrame(id)
    line = data.get("line")
    if not isinstance(line, str):
        raise FrameError("'line' is missing or not a string", id, kind)
    if len(line) > MAX_LINE_CHARS:
        raise FrameError(
            f"'line' too long: {len(line)} characters (at most {MAX_LINE_CHARS})", id, kind
        )
    return RunFrame(id, line, _timeout(data.get("timeout"), id))


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


# -- server -> client ------------------------------------------------------------------


def ready_frame(version: str, prompt: str = DEFAULT_PROMPT) -> Frame:
    return {"type": "ready", "version": version, "prompt": prompt}


def pong_frame() -> Frame:
    return {"type": "pong"}


def accepted_frame(id: str, queued: bool) -> Frame:
    return {"type": "accepted", "id": id, "queued": queued}


def started_frame(id: str) -> Frame:
    return {"type": "started", "id": id}


def output_frame(id: str, stream: str, data: str) -> Frame:
    return {"type": "output", "id": id, "stream": stream, "data": data}


def confirm_required_frame(id: str, message: str) -> Frame:
    return {"type": "confirm_required", "id": id, "message": message}


def complete_frame(id: str, facts: CompleteFacts) -> Frame:
    """The one terminal frame of ``id`` (``CompleteFacts.from_wire`` reads it back)."""
    return {"type": "complete", "id": id, **facts.to_wire()}


def error_frame(message: str, id: str | None = None, *, ref: str | None = None) -> Frame:
    """An ``error``; ``ref`` names an id that is not live (its ``id`` is then null)."""
    frame: Frame = {"type": "error", "id": id, "message": message}
    if ref is not None:
        frame["ref"] = ref
    return frame


def read_frame(message: str | bytes) -> Frame | None:
    """A server's frame as a dict; None for a message that is not a JSON object."""
    try:
        frame = json.loads(message)
    except ValueError:
        return None
    return frame if isinstance(frame, dict) else None
