"""The console server: the Starlette app, its WebSocket protocol, and running it."""

from wirecut.console.server._app import ConsoleState, create_app
from wirecut.console.server._frames import FrameError, parse_frame
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
    "ConsoleConfig",
    "ConsoleMetrics",
    "ConsoleServer",
    "ConsoleState",
    "FrameError",
    "Provider",
    "ProviderUnavailable",
    "build_state",
    "create_app",
    "parse_frame",
    "resolve_provider",
    "serve_forever",
]
