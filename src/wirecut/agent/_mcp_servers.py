"""The MCP servers of a host: configured by name, started together, their tools for agents.

``McpServerSpec`` is one server as a user names it (``NAME=COMMAND`` for a
stdio server, ``NAME=URL`` for Streamable HTTP: ``wirecut serve --mcp``).
``McpServers`` starts them all at once (a ``wirecut.mcp.McpClient`` each,
every step bounded), lists their tools, offers those that fit
(``_mcp_tools.offered_tools``) to agents, and closes them together. A server
that does not start, speaks something else than MCP, never answers
``tools/list``, or breaks its connection later is not used, and a one-line
message naming it says why; the others go on. The host owns the servers'
processes: ``close()`` ends them (EOF, then their process group is killed)
and reaps them.

Imports ``wirecut.mcp`` (the extra ``mcp``) only when a server is started.
"""

from __future__ import annotations

import concurrent.futures
import enum
import logging
import re
import shlex
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from wirecut.agent._mcp_tools import McpCalls, McpToolSpec, mcp_tool, offered_tools
from wirecut.agent._tools import Tool

if TYPE_CHECKING:
    from wirecut.mcp import McpClient, McpError

__all__ = ["McpServer", "McpServerSpec", "McpServerStatus", "McpServers"]

_log = logging.getLogger("wirecut.agent")

#: A server's name: letters and digits, single ``-`` or ``_`` between them. No
#: ``__`` (the separator in the tools' names) and no trailing ``_``, so that a
#: tool's name as offered says which server it belongs to.
_SERVER_NAME = re.compile(r"[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*")
#: The longest server name.
MAX_SERVER_NAME = 32
#: How much of a command line a message quotes.
_SHOWN = 120


@dataclass(frozen=True)
class McpServerSpec:
    """One MCP server as configured: its ``name``, and a command (stdio) or URL to reach it.

    ``target`` is an ``http://``/``https://`` URL (Streamable HTTP) or a
    command line, split as a shell would split it (``shlex``) and run
    without one. ``env`` adds to the safe default environment the MCP SDK
    gives a stdio server. The constructor raises ValueError (one line) for a
    bad name or target.
    """

    name: str
    target: str
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.name) > MAX_SERVER_NAME or not _SERVER_NAME.fullmatch(self.name):
            raise ValueError(
                f"MCP server name {self.name!r} must be 1 to {MAX_SERVER_NAME} letters and "
                "digits, with single '-' or '_' between them"
            )
        if self.transport == "http":
            parts = urlsplit(self.target.strip())
            if not parts.hostname:
                raise ValueError(f"MCP server {self.name!r}: the URL {self.target!r} has no host")
            return
        try:
            argv = shlex.split(self.target)
        except ValueError as exc:
            raise ValueError(
                f"MCP server {self.name!r}: cannot read the command {self.target!r}: {exc}"
            ) from None
        if not argv:
            raise ValueError(f"MCP server {self.name!r}: give a command or an http(s) URL")

    @classmethod
    def parse(cls, text: str) -> McpServerSpec:
        """``NAME=COMMAND`` or ``NAME=URL``; ValueError (one line) saying what is wrong."""
        name, sep, target = text.partition("=")
        if not sep or not target.strip():
            raise ValueError(f"{text!r} is not NAME=COMMAND or NAME=URL")
        return cls(name.strip(), target.strip())

    @property
    def transport(self) -> str:
        """``http`` for a URL, ``stdio`` for a command."""
        scheme = self.target.strip().lower()
        return "http" if scheme.startswith(("http://", "https://")) else "stdio"

    @property
    def where(self) -> str:
        """``stdio: COMMAND`` or ``http: URL`` for messages (a URL without its secrets)."""
        if self.transport == "http":
            # A user name, a password or a query may hold a secret: not shown.
            parts = urlsplit(self.target.strip())
            host = parts.hostname or ""
            host = f"[{host}]" if ":" in host else host
            port = f":{parts.port}" if parts.port is not None else ""
            return f"http: {parts.scheme}://{host}{port}{parts.path}"
        command = " ".join(self.target.split())
        return f"stdio: {command if len(command) <= _SHOWN else command[: _SHOWN - 3] + '...'}"


class McpServerStatus(enum.StrEnum):
    """Where a configured MCP server stands."""

    NEW = "new"  # not started yet
    READY = "ready"  # connected and its tools listed: they are offered
    UNAVAILABLE = "unavailable"  # it did not start, or did not list its tools: not used
    BROKEN = "broken"  # it was ready, then its connection ended: not used any more
    CLOSED = "closed"  # close() ended it


class McpServer:
    """One configured MCP server of a host: its client, its offered tools, or why it is unused.

    Made and started by ``McpServers``; its properties may be read from any
    thread.
    """

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self.client: McpClient | None = None
        #: The tools offered to agents.
        self.tools: tuple[McpToolSpec, ...] = ()
        #: One line per listed tool that is not offered, saying why.
        self.notes: tuple[str, ...] = ()
        # Guards _problem and _broken: a tool's thread sets them, any thread reads them.
        self._lock = threading.Lock()
        self._problem: str | None = None
        self._started = False
        self._broken = False
        self._closed = False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def status(self) -> McpServerStatus:
        if self._closed:
            return McpServerStatus.CLOSED
        if not self._started:
            return McpServerStatus.NEW
        if self.client is None:
            return McpServerStatus.UNAVAILABLE
        from wirecut.mcp import ClientState

        with self._lock:
            broken = self._broken
        if broken or self.client.state is not ClientState.OPEN:
            return McpServerStatus.BROKEN
        return McpServerStatus.READY

    @property
    def problem(self) -> str | None:
        """Why it is not used (one line that names it); None while it is, or before its start."""
        status = self.status
        with self._lock:
            problem = self._problem
        if status is McpServerStatus.UNAVAILABLE:
            return problem
        if status is McpServerStatus.BROKEN:
            return problem or f"MCP server {self.name!r}: its connection ended"
        return None

    def _start(self, options: Mapping[str, Any]) -> None:
        """Connect and list the tools (bounded by ``options``' timeouts); never raises."""
        from wirecut.mcp import McpClient, McpError

        client: McpClient | None = None
        try:
            client = McpClient(self.spec.target, name=self.name, env=self.spec.env, **options)
            client.connect()
            listed = client.list_tools()
        except McpError as exc:
            self._problem = str(exc)
        except Exception as exc:  # A server must not stop its host: said, and left out.
            _log.exception("MCP server %r: starting it failed", self.name)
            self._problem = f"MCP server {self.name!r} could not be used: {type(exc).__name__}"
        else:
            offered, notes = offered_tools(self.name, listed)
            self.tools, self.notes = tuple(offered), tuple(notes)
            self.client = client
        finally:
            self._started = True
        if self.client is None and client is not None:
            client.close()

    def _failed(self, error: McpError) -> None:
        """A call's ``McpError``: one that ends the connection (a protocol error) says why."""
        from wirecut.mcp import McpProtocolError

        # The client ends the connection after a protocol error, a moment later
        # on its loop: the server is left out from now on, for this reason.
        if isinstance(error, McpProtocolError) or self.status is McpServerStatus.BROKEN:
            with self._lock:
                if self._problem is None:
                    self._problem = str(error)
                self._broken = True

    def _close(self) -> None:
        self._closed = True
        if self.client is not None:
            self.client.close()

    def line(self) -> str:
        """``NAME (stdio: CMD): NAME__a, NAME__b``, or what keeps it unused, in one line."""
        head = f"{self.name} ({self.spec.where})"
        status = self.status
        if status is McpServerStatus.READY:
            return f"{head}: {', '.join(t.name for t in self.tools) or 'no tools'}"
        if status in (McpServerStatus.UNAVAILABLE, McpServerStatus.BROKEN):
            return f"{head}: not used: {self.problem}"
        return f"{head}: {status.value}"

    def to_json(self) -> dict[str, Any]:
        """``{"server", "transport", "status", "error", "tools": [{"name", "tool", ...}]}``."""
        status = self.status
        ready = status is McpServerStatus.READY
        return {
            "server": self.name,
            "transport": self.spec.transport,
            "status": status.value,
            "error": self.problem,
            "tools": [
                {"name": t.name, "tool": t.tool, "description": t.description}
                for t in (self.tools if ready else ())
            ],
        }


class McpServers:
    """The MCP servers of a host (``wirecut serve --mcp``), for its agents.

    ``start()`` connects every server at once and lists its tools: each step
    is bounded (``connect_timeout`` for the handshake, ``list_timeout`` for
    ``tools/list``), and a server that fails is left out with one line that
    names it. ``tools()`` makes the agent tools of the ready servers;
    ``close()`` ends every server and its processes. Use from one thread
    (the host's), except ``tools()``, ``lines()`` and ``to_json()``, which
    any thread may call once ``start()`` returned. ``confirm_timeout`` is
    how long a cancelled call waits for its server to confirm the stop.

    Cancellation: a call of a tool from ``tools()`` is cut by a cancel of the
    scope bound in its thread (``mcp_tool``); ``start()`` and ``close()``
    are bounded and not cut.
    """

    def __init__(
        self,
        specs: Iterable[McpServerSpec] = (),
        *,
        connect_timeout: float = 10.0,
        list_timeout: float = 10.0,
        confirm_timeout: float = 2.0,
        max_message_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.servers: tuple[McpServer, ...] = tuple(McpServer(spec) for spec in specs)
        seen: set[str] = set()
        for server in self.servers:
            if server.name in seen:
                raise ValueError(f"MCP server name {server.name!r} is given twice")
            seen.add(server.name)
        self._options: dict[str, Any] = {
            "connect_timeout": connect_timeout,
            "request_timeout": list_timeout,
            "confirm_timeout": confirm_timeout,
            "max_message_bytes": max_message_bytes,
        }

    def __len__(self) -> int:
        return len(self.servers)

    def __enter__(self) -> McpServers:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self, echo: Callable[[str], None] | None = None) -> None:
        """Start every server at once; ``echo`` gets one line per server (and per unoffered tool).

        Returns when each is ready or left out (within ``connect_timeout``
        plus ``list_timeout``). Never raises for a server's failure.
        """
        fresh = [server for server in self.servers if server.status is McpServerStatus.NEW]
        if fresh:
            with concurrent.futures.ThreadPoolExecutor(
                len(fresh), thread_name_prefix="wirecut-mcp-start"
            ) as pool:
                list(pool.map(lambda server: server._start(self._options), fresh))
        if echo is None:
            return
        for server in fresh:
            if server.status is McpServerStatus.READY:
                names = ", ".join(t.tool for t in server.tools)
                count = f"{len(server.tools)} tool{'' if len(server.tools) == 1 else 's'}"
                echo(f"MCP server {server.name!r} ({server.spec.where}): {count}: {names or '-'}")
                for note in server.notes:
                    echo(f"MCP server {server.name!r}: {note}")
            else:
                echo(f"{server.problem}; serving without it")

    def tools(self, calls: McpCalls | None = None) -> list[Tool]:
        """The agent tools of every ready server; ``calls`` records their cut calls."""
        made: list[Tool] = []
        for server in self.servers:
            client = server.client
            if client is None or server.status is not McpServerStatus.READY:
                continue
            for spec in server.tools:
                made.append(mcp_tool(client, spec, calls=calls, on_error=server._failed))
        return made

    def lines(self) -> list[str]:
        """One line per server: its tools as offered, or why it is not used."""
        return [server.line() for server in self.servers]

    def to_json(self) -> list[dict[str, Any]]:
        """Each server's status and offered tools (``/api/commands``' ``mcp``)."""
        return [server.to_json() for server in self.servers]

    def close(self) -> None:
        """End every server (at once; each bounded): a stdio server's process group is gone after.

        Idempotent.
        """
        servers = [server for server in self.servers if server.status is not McpServerStatus.CLOSED]
        if not servers:
            return
        with concurrent.futures.ThreadPoolExecutor(
            len(servers), thread_name_prefix="wirecut-mcp-close"
        ) as pool:
            for server, future in [(s, pool.submit(s._close)) for s in servers]:
                try:
                    future.result()
                except Exception:  # The others are closed all the same.
                    _log.exception("MCP server %r: closing it failed", server.name)
