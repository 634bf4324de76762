"""The console's terminal client: ``wirecut console [URL] [-c LINE]``.

See docs/terminal-client.md.

It speaks only the public protocol (``/api/console`` frames, docs/protocol.md)
and imports nothing of the server: any other client could do what it does.
"""

from wirecut.console.terminal._address import (
    SERVE_JSON,
    TOKEN_ENV,
    Address,
    AddressError,
    from_serve_json,
    from_url,
)
from wirecut.console.terminal._link import CommandChannel, Link, LinkError
from wirecut.console.terminal._main import run_terminal
from wirecut.console.terminal._render import Renderer, describe_complete, timeline_chart, visible
from wirecut.console.terminal._repl import HISTORY_FILE
from wirecut.console.terminal._session import (
    EXIT_CANCELLED,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_TIMEOUT,
    TerminalSession,
    exit_code,
)

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "HISTORY_FILE",
    "SERVE_JSON",
    "TOKEN_ENV",
    "Address",
    "AddressError",
    "CommandChannel",
    "Link",
    "LinkError",
    "Renderer",
    "TerminalSession",
    "describe_complete",
    "exit_code",
    "from_serve_json",
    "from_url",
    "run_terminal",
    "timeline_chart",
    "visible",
]
