"""The terminal records of wirecut and the parts they share (library core).

Every piece of work that wirecut runs ends with one record that says what
happened: a status (``cancelled`` and ``timeout`` promise that the effect did
not happen), the usage (``None`` for a count nobody could know, never 0) and
the unwind's timeline. The console's ``complete`` and the proxy's record are
made of these parts. This package imports no app: the console, the proxy and
any host build their records here.
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
    "COMMIT_OPEN_ERROR",
    "NO_USAGE",
    "WORKER_EXITED",
    "CompleteFacts",
    "EndReason",
    "Ending",
    "LifecycleFacts",
    "Reason",
    "Status",
    "TimelineStep",
    "UsageFacts",
    "decide",
    "make_timeline",
    "unwind_timeline",
    "usage_facts",
]
