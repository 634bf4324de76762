"""``StopFacts``: what a ``wirecut.mcp`` server knew when it stopped a tool call.

The server builds one per stopped call (the client's cancel, a disconnect, the
shutdown, the tool's timeout), writes ``summary()`` as one log line, and sends
``to_json()`` to the client as the ``data`` of an MCP log notification whose
``logger`` is ``wirecut`` (``LOGGER``). A client reads it back with
``from_json``, which says None to anything that is not one: that notification
is how a client learns that the stop was confirmed (docs/mcp.md).

A client that wants its calls' facts tagged puts a token of its own in the
request's ``_meta`` under ``CALL_META_KEY``; the server echoes it as ``call``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CALL_META_KEY", "LOGGER", "StopFacts", "StopReason"]

#: The ``logger`` of the MCP log notification that carries a call's facts.
LOGGER = "wirecut"
#: The ``_meta`` key of a request whose facts the client wants tagged.
CALL_META_KEY = "dev.wirecut/call"


class StopReason(enum.StrEnum):
    """Who ended a tool call that did not finish by itself."""

    CANCELLED = "cancelled"  # the client's notifications/cancelled for the request
    DISCONNECT = "disconnect"  # the request's HTTP response stream closed (2026-07-28 wire)
    SHUTDOWN = "shutdown"  # the server, or the client's stdio connection, ended
    TIMEOUT = "timeout"  # the tool's own timeout passed


@dataclass(frozen=True)
class StopFacts:
    """The unwind of one stopped tool call, as its server saw it.

    - ``stopped``: the cut ended the work before its effect: the tool's thread
      returned (or never started) and it had not committed. False when the
      thread was still running at the unwind bound, when the tool committed
      (``committed``), or when it had already returned before the cut.
    - ``started``: the tool's thread had begun running it.
    - ``worker_exited``: the thread had returned by the time of the report.
    - ``cancel_to_exit_ms``: from the cut to the thread's return; None when
      it did not start, had not returned, or returned before the cut.
    - ``open_requests``, ``open_processes``: sockets and processes the call
      still owned at the report.
    - ``timeline``: ``(event, ms since the cut)``, the scope's unwind steps
      and ``worker_exited``.
    """

    tool: str
    request_id: str | int | None
    call: str | None
    reason: StopReason
    stopped: bool
    started: bool
    worker_exited: bool
    committed: bool
    cancel_to_exit_ms: float | None
    open_requests: int
    open_processes: int
    timeline: tuple[tuple[str, float], ...]

    def to_json(self) -> dict[str, Any]:
        """The wire form (the log notification's ``data``)."""
        return {
            "tool": self.tool,
            "request_id": self.request_id,
            "call": self.call,
            "reason": self.reason.value,
            "stopped": self.stopped,
            "started": self.started,
            "worker_exited": self.worker_exited,
            "committed": self.committed,
            "cancel_to_exit_ms": _round(self.cancel_to_exit_ms),
            "open_requests": self.open_requests,
            "open_processes": self.open_processes,
            "timeline": [{"event": event, "ms": _round(ms)} for event, ms in self.timeline],
        }

    @classmethod
    def from_json(cls, data: object) -> StopFacts | None:
        """The facts in ``data``, or None when it is not a ``to_json()`` object."""
        if not isinstance(data, Mapping):
            return None
        try:
            timeline = tuple(
                (_str(step["event"]), _number(step["ms"])) for step in _list(data["timeline"])
            )
            to_exit = data["cancel_to_exit_ms"]
            request_id = data["request_id"]
            if request_id is not None and not isinstance(request_id, str | int):
                return None
            call = data["call"]
            return cls(
                tool=_str(data["tool"]),
                request_id=request_id,
                call=None if call is None else _str(call),
                reason=StopReason(data["reason"]),
                stopped=_bool(data["stopped"]),
                started=_bool(data["started"]),
                worker_exited=_bool(data["worker_exited"]),
                committed=_bool(data["committed"]),
                cancel_to_exit_ms=None if to_exit is None else _number(to_exit),
                open_requests=_count(data["open_requests"]),
                open_processes=_count(data["open_processes"]),
                timeline=timeline,
            )
        except (KeyError, TypeError, ValueError):
            return None

    def summary(self) -> str:
        """One line for a log: the call, who ended it, and what was left."""
        request = "" if self.request_id is None else f" (request {self.request_id})"
        if not self.started:
            how = "stopped before its thread ran it"
        elif self.worker_exited and self.cancel_to_exit_ms is not None:
            how = f"worker exited {self.cancel_to_exit_ms:.1f} ms after the cut"
        elif self.worker_exited:
            how = "worker had already returned"
        else:
            how = "worker STILL RUNNING at the unwind bound"
        if self.committed:
            how += ", after it committed"
        steps = ", ".join(f"{event} {ms:.1f}" for event, ms in self.timeline)
        verdict = "stopped" if self.stopped else "NOT stopped"
        return (
            f"tool {self.tool!r}{request} {verdict} on {_CAUSES[self.reason]}: {how}; "
            f"open requests {self.open_requests}, processes {self.open_processes}; "
            f"timeline (ms) {steps or '-'}"
        )


_CAUSES = {
    StopReason.CANCELLED: "the client's cancel",
    StopReason.DISCONNECT: "a disconnect",
    StopReason.SHUTDOWN: "shutdown",
    StopReason.TIMEOUT: "timeout",
}


def _round(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 3)


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(value)
    return value


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(value)
    return value


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(value)
    return float(value)


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(value)
    return value


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(value)
    return value
