"""The host: the runner core, ``CommandRunner``, the terminal record, and what they are made of.

Knows nothing about WebSockets: a server drives a runner from its event loop
and gets each command's frames back through a ``CommandSink``.
"""

from wirecut.console.runner._contract import CommandSink, Runner, RunnerObserver
from wirecut.console.runner._core import (
    Accepted,
    CommandRecord,
    Placement,
    Reporter,
    RunnerCore,
    RunnerLimits,
)
from wirecut.console.runner._lifecycle import (
    TRANSITIONS,
    CommandEvent,
    CommandLifecycle,
    CommandState,
    LifecycleError,
)
from wirecut.console.runner._output import OutputBuffer, OutputFlusher, bind_output, route_stdio
from wirecut.console.runner._pool import WorkerPool
from wirecut.console.runner._runner import (
    CommandRunner,
    LocalCommand,
    ThreadPlacement,
)
from wirecut.record import (
    COMMIT_OPEN_ERROR,
    CompleteFacts,
    Ending,
    LifecycleFacts,
    Reason,
    Status,
    TimelineStep,
    UsageFacts,
    decide,
    make_timeline,
)

__all__ = [
    "COMMIT_OPEN_ERROR",
    "TRANSITIONS",
    "Accepted",
    "CommandEvent",
    "CommandLifecycle",
    "CommandRecord",
    "CommandRunner",
    "CommandSink",
    "CommandState",
    "CompleteFacts",
    "Ending",
    "LifecycleError",
    "LifecycleFacts",
    "LocalCommand",
    "OutputBuffer",
    "OutputFlusher",
    "Placement",
    "Reason",
    "Reporter",
    "Runner",
    "RunnerCore",
    "RunnerLimits",
    "RunnerObserver",
    "Status",
    "ThreadPlacement",
    "TimelineStep",
    "UsageFacts",
    "WorkerPool",
    "bind_output",
    "decide",
    "make_timeline",
    "route_stdio",
]
