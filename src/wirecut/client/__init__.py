"""Clients of the console's protocol; the terminal client, ``wirecut console [URL] [-c LINE]``.

See docs/terminal-client.md.

An app of its own, not part of the console: it speaks only the public
protocol (``/api/console`` frames, docs/protocol.md, built and read by
``wirecut.record``) and imports nothing of the server, so any other client
could do what it does. ``ConsoleClient`` is the synchronous client that the
proof tools and the tests use; ``Link`` is the terminal's asynchronous one.
"""

from wirecut.client._address import (
    SERVE_JSON,
    TOKEN_ENV,
    Address,
    AddressError,
    from_serve_json,
    from_url,
)
from wirecut.client._link import CommandChannel, Link, LinkError
from wirecut.client._main import run_terminal
from wirecut.client._render import Renderer, describe_complete, timeline_chart, visible
from wirecut.client._repl import HISTORY_FILE
from wirecut.client._session import (
    EXIT_CANCELLED,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_TIMEOUT,
    TerminalSession,
    exit_code,
)
from wirecut.client._sync import ConsoleClient, Received

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
    "ConsoleClient",
    "Link",
    "LinkError",
    "Received",
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
