"""MCP tools that really stop: a server helper, a sync client, and their facts.

Library layer: imports ``wirecut.scope``, ``wirecut.aio``, the stdlib and the
official ``mcp`` SDK (extra ``mcp``), and changes nothing process-wide.

- ``MCPServer``: the SDK's ``MCPServer`` whose plain ``def`` tools run on a
  thread under an ``InterruptScope``; the client's ``notifications/cancelled``,
  a closed Streamable HTTP response stream, the server's end or a tool's
  ``timeout`` cut it, and the unwind's ``StopFacts`` go to the log and to the
  client as a log notification with logger ``wirecut``.
- ``McpClient``: a synchronous client for a worker thread under a bound scope;
  a cancel of that scope sends ``notifications/cancelled`` for the call in
  flight and raises ``McpCallInterrupted`` with an ``McpCallRecord`` that says
  whether the server confirmed the stop.

See docs/mcp.md.
"""

try:
    import mcp as _mcp_sdk  # noqa: F401 (fails here, with the extra's name, when missing)
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("wirecut.mcp needs the official MCP SDK: pip install 'wirecut[mcp]'") from exc

from wirecut.mcp._client import McpClient
from wirecut.mcp._errors import (
    McpCallInterrupted,
    McpError,
    McpProtocolError,
    McpStartError,
    McpTimeoutError,
)
from wirecut.mcp._facts import CALL_META_KEY, LOGGER, StopFacts, StopReason
from wirecut.mcp._record import McpCallRecord
from wirecut.mcp._server import MCPServer
from wirecut.mcp._tool_call import FACTS_META_KEY

__all__ = [
    "CALL_META_KEY",
    "FACTS_META_KEY",
    "LOGGER",
    "MCPServer",
    "McpCallInterrupted",
    "McpCallRecord",
    "McpClient",
    "McpError",
    "McpProtocolError",
    "McpStartError",
    "McpTimeoutError",
    "StopFacts",
    "StopReason",
]
