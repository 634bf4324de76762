"""The host: the runner core, ``CommandRunner``, and what they are made of.

Knows nothing about WebSockets: a server drives a runner from its event loop
and gets each command's frames back through a ``CommandSink``. The terminal
record a runner decides (``CompleteFacts``) is ``wirecut.record``'s.
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

__all__ = [
    "TRANSITIONS",
    "Accepted",
    "CommandEvent",
    "CommandLifecycle",
    "CommandRecord",
    "CommandRunner",
    "CommandSink",
    "CommandState",
    "LifecycleError",
    "LocalCommand",
    "OutputBuffer",
    "OutputFlusher",
    "Placement",
    "Reporter",
    "Runner",
    "RunnerCore",
    "RunnerLimits",
    "RunnerObserver",
    "ThreadPlacement",
    "WorkerPool",
    "bind_output",
    "route_stdio",
]
