"""The exceptions of ``wirecut.mcp``'s client.

The tree::

    Exception
    └── McpError               an MCP server could not be used; one line naming it
        ├── McpStartError      it did not start, could not be reached, or did not
        │                      finish the handshake within the connect bound
        ├── McpProtocolError   it wrote something that is not MCP, a message over
        │                      the size bound, or closed the connection
        └── McpTimeoutError    a request was not answered within its bound
    BaseException
    └── Interrupted            (wirecut.scope)
        └── McpCallInterrupted the bound scope was cancelled during a tool call;
                               carries the call's record (did the server stop?)

An ``McpError``'s message is one line, always names the server and says what
was wrong; nothing of a traceback reaches it. ``McpCallInterrupted`` is an
``Interrupted``: a cut travels through a tool's ``except Exception`` as every
other cut does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wirecut.scope import Interrupted

if TYPE_CHECKING:
    from wirecut.mcp._record import McpCallRecord

__all__ = [
    "McpCallInterrupted",
    "McpError",
    "McpProtocolError",
    "McpStartError",
    "McpTimeoutError",
]


class McpError(Exception):
    """An MCP server could not be used; the message is one line and names the server."""


class McpStartError(McpError):
    """The server did not start, could not be reached, or did not finish the handshake."""


class McpProtocolError(McpError):
    """The server wrote something that is not MCP, an oversized message, or hung up."""


class McpTimeoutError(McpError):
    """A request was not answered within its bound.

    For a tool call, ``record`` says whether the server confirmed the stop
    that followed (see ``McpCallInterrupted``); None for other requests.
    """

    def __init__(self, message: str, *, record: McpCallRecord | None = None) -> None:
        super().__init__(message)
        self.record = record


class McpCallInterrupted(Interrupted):
    """The bound scope was cancelled while a tool call was in flight.

    ``record`` says whether the server confirmed the stop
    (``McpCallRecord.stopped``: True, False or None when nothing is known).
    """

    def __init__(self, reason: str, record: McpCallRecord) -> None:
        super().__init__(reason)
        self.record = record

    def __str__(self) -> str:
        stopped = {True: "stopped", False: "NOT stopped", None: "stop not confirmed"}
        return (
            f"interrupted: {self.reason}; {self.record.server} tool {self.record.tool!r}: "
            f"{stopped[self.record.stopped]}"
        )
