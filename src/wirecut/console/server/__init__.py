"""The console server: the Starlette app, its WebSocket protocol, and running it."""

from wirecut.console.server._access import HostPolicy, host_name_problem
from wirecut.console.server._app import ConsoleState, create_app
from wirecut.console.server._connection import CLOSE_SLOW_READER
from wirecut.console.server._frames import FrameError, parse_frame
from wirecut.console.server._limits import ConnectionLimits
from wirecut.console.server._metrics import ConsoleMetrics
from wirecut.console.server._serve import (
    ConsoleConfig,
    ConsoleServer,
    Provider,
    ProviderUnavailable,
    build_state,
    resolve_provider,
    serve_forever,
)

__all__ = [
    "CLOSE_SLOW_READER",
    "ConnectionLimits",
    "ConsoleConfig",
    "ConsoleMetrics",
    "ConsoleServer",
    "ConsoleState",
    "FrameError",
    "HostPolicy",
    "Provider",
    "ProviderUnavailable",
    "build_state",
    "create_app",
    "host_name_problem",
    "parse_frame",
    "resolve_provider",
    "serve_forever",
]
