"""The terminal records of wirecut and the parts they share (library core).

Every piece of work that wirecut runs ends with one record that says what
happened: a status (``cancelled`` and ``timeout`` promise that the effect did
not happen), the usage (``None`` for a count nobody could know, never 0) and
the unwind's timeline. The console's ``complete`` and the proxy's record are
made of these parts. The console's wire (its frames, close codes and
``/api/proof``) is here too, built and read in one place for the server and
every client. This package imports no app: the console, the proxy and any
host build their records here.
"""

from wirecut.record._complete import (
    COMMIT_OPEN_ERROR,
    CompleteFacts,
    Ending,
    EndReason,
    LifecycleFacts,
    Reason,
    decide,
)
from wirecut.record._frames import (
    CLOSE_FORBIDDEN_ORIGIN,
    CLOSE_SLOW_READER,
    CLOSE_UNAUTHORIZED,
    DEFAULT_PROMPT,
    MAX_FRAME_CHARS,
    MAX_ID_CHARS,
    MAX_LINE_CHARS,
    PROOF_CHALLENGE,
    TIMELINE_EVENTS,
    CancelFrame,
    ClientFrame,
    ConfirmFrame,
    Frame,
    FrameError,
    PingFrame,
    RunFrame,
    accepted_frame,
    complete_frame,
    confirm_required_frame,
    error_frame,
    output_frame,
    parse_frame,
    pong_frame,
    proof,
    read_frame,
    ready_frame,
    started_frame,
)
from wirecut.record._parts import (
    NO_USAGE,
    WORKER_EXITED,
    Status,
    TimelineStep,
    UsageFacts,
    make_timeline,
    unwind_timeline,
    usage_facts,
)

__all__ = [
    "CLOSE_FORBIDDEN_ORIGIN",
    "CLOSE_SLOW_READER",
    "CLOSE_UNAUTHORIZED",
    "COMMIT_OPEN_ERROR",
    "DEFAULT_PROMPT",
    "MAX_FRAME_CHARS",
    "MAX_ID_CHARS",
    "MAX_LINE_CHARS",
    "NO_USAGE",
    "PROOF_CHALLENGE",
    "TIMELINE_EVENTS",
    "WORKER_EXITED",
    "CancelFrame",
    "ClientFrame",
    "CompleteFacts",
    "ConfirmFrame",
    "EndReason",
    "Ending",
    "Frame",
    "FrameError",
    "LifecycleFacts",
    "PingFrame",
    "Reason",
    "RunFrame",
    "Status",
    "TimelineStep",
    "UsageFacts",
    "accepted_frame",
    "complete_frame",
    "confirm_required_frame",
    "decide",
    "error_frame",
    "make_timeline",
    "output_frame",
    "parse_frame",
    "pong_frame",
    "proof",
    "read_frame",
    "ready_frame",
    "started_frame",
    "unwind_timeline",
    "usage_facts",
]
