"""MCP servers' tools for an agent: each listed tool an agent ``Tool`` that calls it.

A tool an MCP server lists (``tools/list``) becomes an agent ``Tool`` whose
function calls it through the server's ``wirecut.mcp.McpClient``, in the
calling thread, so that a cancel of the bound scope (the agent's turn) sends
``notifications/cancelled`` for it and waits, bounded, for the server's word.

What the model sees is bounded and namespaced: the tool is offered as
``SERVER__TOOL`` (characters a provider refuses in a function name become
``_``), so two servers' tools never share a name, nor do they share one
with a built-in tool; its description is cut at ``MAX_DESCRIPTION``
characters; its input schema is the server's own, offered only when it is a
valid JSON Schema (2020-12) of an object, at most ``MAX_SCHEMA_BYTES`` long
and ``_json.MAX_DEPTH`` deep. A server's tool that does not fit is not
offered, and a one-line note says why. What a call returns reaches the
model as text, at most ``MAX_OUTPUT`` characters of it.

``McpCalls`` keeps, for one piece of work (a console command), the calls a
cancel reached and whether each server confirmed the stop: what the
command's ``complete`` reports under ``mcp``.

Imports ``wirecut.mcp`` (the extra ``mcp``) only where a client is used:
``wirecut.agent`` works without the extra.
"""

from __future__ import annotations

import enum
import json
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jsonschema

from wirecut import _json
from wirecut.agent._tools import Tool, truncate_output
from wirecut.record import McpCallFacts

if TYPE_CHECKING:
    from mcp_types import CallToolResult
    from mcp_types import Tool as ListedTool

    from wirecut.mcp import McpClient, McpError

__all__ = [
    "MAX_DESCRIPTION",
    "MAX_SCHEMA_BYTES",
    "MAX_TOOLS",
    "McpCalls",
    "McpToolSpec",
    "mcp_tool",
    "offered_tools",
    "result_text",
]

#: Between a server's name and its tool's in the name the model sees.
SEPARATOR = "__"
#: The longest function name providers accept (OpenAI: ``^[a-zA-Z0-9_-]{1,64}$``).
MAX_NAME = 64
#: Characters of a tool's description offered to the model.
MAX_DESCRIPTION = 1024
#: The largest input schema offered, as compact JSON.
MAX_SCHEMA_BYTES = 16 * 1024
#: The most tools of one server offered to the model.
MAX_TOOLS = 64

_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class McpToolSpec:
    """One tool of an MCP server as offered to a model."""

    #: The server's name (as configured).
    server: str
    #: The tool's name on the server (what ``tools/call`` names).
    tool: str
    #: The name the model sees: ``SERVER__TOOL``.
    name: str
    description: str
    #: The server's input schema (a JSON Schema of an object).
    parameters: dict[str, Any]


def offered_tools(server: str, listed: Iterable[ListedTool]) -> tuple[list[McpToolSpec], list[str]]:
    """The tools of ``listed`` that can be offered to a model, and a one-line note per other one.

    A pure function; call it from any thread.
    """
    offered: list[McpToolSpec] = []
    notes: list[str] = []
    names: set[str] = set()
    for found in listed:
        if len(offered) == MAX_TOOLS:
            notes.append(f"tool {found.name!r} is not offered: more than {MAX_TOOLS} tools")
            continue
        name = f"{server}{SEPARATOR}{_NOT_IN_A_NAME.sub('_', found.name)}"
        problem = _name_problem(found.name, name, names) or _schema_problem(found.input_schema)
        if problem is not None:
            notes.append(f"tool {_quote(found.name)} is not offered: {problem}")
            continue
        names.add(name)
        description = " ".join((found.description or found.title or "").split())
        if len(description) > MAX_DESCRIPTION:
            description = description[: MAX_DESCRIPTION - 3] + "..."
        offered.append(McpToolSpec(server, found.name, name, description, dict(found.input_schema)))
    return offered, notes


def _name_problem(tool: str, name: str, taken: set[str]) -> str | None:
    if not tool:
        return "it has no name"
    if len(name) > MAX_NAME:
        return f"its name as offered ({name[:MAX_NAME]}...) is longer than {MAX_NAME} characters"
    if name in taken:
        return f"its name as offered ({name}) is another tool's too"
    return None


def _schema_problem(schema: Any) -> str | None:
    """Why ``schema`` cannot be offered as a tool's parameters, or None."""
    if not isinstance(schema, dict):
        return "its input schema is not a JSON object"
    try:
        text = json.dumps(schema, separators=(",", ":"))
        _json.loads(text)  # Bounded nesting: a validator recurses into it.
    except (ValueError, TypeError, RecursionError) as exc:
        return f"its input schema cannot be read: {_first_line(str(exc))}"
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        return f"its input schema is {len(text.encode())} bytes (at most {MAX_SCHEMA_BYTES})"
    if schema.get("type") != "object":
        return "its input schema is not of type object"
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"its input schema is not valid JSON Schema: {_first_line(exc.message)}"
    return None


# -- the calls of one piece of work ------------------------------------------------


class _CallState(enum.Enum):
    RUNNING = "running"  # in call_tool: nothing known yet
    CUT = "cut"  # a cancel reached it: ``stopped`` says what the server did
    ANSWERED = "answered"  # it ended by itself (a result, an error, or never sent)


class _Call:
    __slots__ = ("server", "state", "stopped", "tool")

    def __init__(self, server: str, tool: str) -> None:
        self.server = server
        self.tool = tool
        self.state = _CallState.RUNNING
        self.stopped: bool | None = None


class McpCalls:
    """The MCP tool calls of one piece of work (a console command) that a cancel reached.

    Thread-safe: tool calls run on the agent's threads and the host reads
    ``report()`` from its own.
    """

    def __init__(self) -> None:
        # Guards the calls' states, changed by the tool threads and read by the host.
        self._lock = threading.Lock()
        self._calls: list[_Call] = []

    def _begin(self, server: str, tool: str) -> _Call:
        call = _Call(server, tool)
        with self._lock:
            self._calls.append(call)
        return call

    def _cut(self, call: _Call, stopped: bool | None) -> None:
        with self._lock:
            call.state, call.stopped = _CallState.CUT, stopped

    def _end(self, call: _Call) -> None:
        with self._lock:
            if call.state is _CallState.RUNNING:
                call.state = _CallState.ANSWERED

    def report(self) -> tuple[McpCallFacts, ...]:
        """The calls a cancel reached, in the order they began, and whether each was stopped.

        A call still waiting for its server's word (its thread had not come
        back when the host asked) is reported with ``stopped`` None: unknown,
        never guessed. Calls that ended by themselves are not listed.
        """
        with self._lock:
            return tuple(
                McpCallFacts(call.server, call.tool, call.stopped)
                for call in self._calls
                if call.state is not _CallState.ANSWERED
            )

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)


def mcp_tool(
    client: McpClient,
    spec: McpToolSpec,
    *,
    calls: McpCalls | None = None,
    on_error: Callable[[McpError], None] | None = None,
) -> Tool:
    """The agent ``Tool`` that calls ``spec``'s tool through ``client``.

    The tool's text for the model is the call's result (``result_text``);
    an ``McpError`` (the server broke the connection, a call timeout) goes to
    ``on_error`` and then on, to the model as the tool's failure. ``calls``
    records the call for its host's report.

    Cancellation: the call runs in the calling thread under its bound scope
    (see ``McpClient.call_tool``): a cancel sends ``notifications/cancelled``
    for it and waits (up to the client's ``confirm_timeout``) for the
    server's word; ``McpCallInterrupted`` then goes on up (the agent's turn
    ends "interrupted"), its record kept in ``calls``.
    """
    from wirecut.mcp import McpCallInterrupted, McpError

    def call(**arguments: Any) -> str:
        entry = calls._begin(spec.server, spec.tool) if calls is not None else None
        try:
            result = client.call_tool(spec.tool, arguments)
        except McpCallInterrupted as cut:
            if calls is not None and entry is not None:
                calls._cut(entry, cut.record.stopped)
            raise
        except McpError as exc:
            if on_error is not None:
                on_error(exc)
            raise
        finally:
            if calls is not None and entry is not None:
                calls._end(entry)
        return result_text(result)

    return Tool(call, name=spec.name, description=spec.description, parameters=spec.parameters)


def result_text(result: CallToolResult) -> str:
    """A tool call's result as the model's text (at most ``MAX_OUTPUT`` characters).

    Text blocks as they are; other content named in brackets (an image's
    type and size, a resource's URI); the structured content as JSON when
    there is nothing else; ``error: `` in front of a result the server
    marked as an error.
    """
    parts: list[str] = []
    for block in result.content:
        kind = block.type
        if block.type == "text":
            parts.append(block.text)
        elif block.type in ("image", "audio"):
            parts.append(f"[{kind}: {block.mime_type}, {len(block.data)} base64 characters]")
        elif block.type == "resource_link":
            parts.append(f"[resource: {block.uri}]")
        elif block.type == "resource":
            text = getattr(block.resource, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource: {block.resource.uri}]")
        else:
            parts.append(f"[{kind}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, default=str))
    text = "\n".join(parts)
    if result.is_error:
        text = f"error: {text or 'the tool failed'}"
    return truncate_output(text)


def _first_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 200 else line[:197] + "..."


def _quote(name: str) -> str:
    return repr(name if len(name) <= 80 else name[:77] + "...")
