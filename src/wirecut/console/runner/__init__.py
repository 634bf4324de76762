"""The host: ``CommandRunner`` and what it is made of.

Knows nothing about WebSockets: a server drives it from its event loop and
gets each command's frames back through a ``CommandSink``.
"""

from wirecut.console.runner._contract import CommandRecord, CommandSink, Runner, RunnerObserver
from wirecut.console.runner._lifecycle import (
    TRANSITIONS,
    CommandEvent,
    CommandLifecycle,
    CommandState,
    LifecycleError,
)
from wirecut.console.runner._output import OutputBuffer, bind_output, route_stdio
from wirecut.console.runner._pool import WorkerPool
from wirecut.console.runner._runner import STATUS_BY_REASON, CommandRunner, RunningCommand

__all__ = [
    "STATUS_BY_REASON",
    "TRANSITIONS",
    "CommandEvent",
    "CommandLifecycle",
    "CommandRecord",
    "CommandRunner",
    "CommandSink",
    "CommandState",
    "LifecycleError",
    "OutputBuffer",
    "Runner",
    "RunnerObserver",
    "RunningCommand",
    "WorkerPool",
    "bind_output",
    "route_stdio",
]
