"""The console server: the Starlette app, its WebSocket protocol, and running it."""

from wirecut.console.server._access import HostPolicy, host_name_problem
from wirecut.console.server._app import ConsoleState, create_app
from wirecut.console.server._metrics import ConsoleMetrics
from wirecut.console.server._serve import (
    ConsoleConfig,
    ConsoleServer,
    build_state,
    serve_forever,
)
from wirecut.serving import ConnectionLimits

__all__ = [
    "ConnectionLimits",
    "ConsoleConfig",
    "ConsoleMetrics",
    "ConsoleServer",
    "ConsoleState",
    "HostPolicy",
    "build_state",
    "create_app",
    "host_name_problem",
    "serve_forever",
]
