"""``MCPServer``: the official SDK's server, whose sync tools a cancel really stops.

The smallest change to a server written for the SDK is its import::

    from wirecut.mcp import MCPServer      # was: from mcp.server.mcpserver import MCPServer

    server = MCPServer("tools")

    @server.tool()                         # as before; timeout=30 is optional
    def fetch(url: str) -> str: ...

Everything else is the SDK's: the transports, ``run()``, async tools (which
keep running as the SDK runs them), resources and prompts. What changes is
how a plain ``def`` tool runs (``_tool_call``): on a thread under an
``InterruptScope``, stopped by the client's cancel, a closed response stream,
the server's end or the tool's timeout.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from mcp.server.lowlevel.server import LifespanResultT
from mcp.server.mcpserver import Context
from mcp.server.mcpserver import MCPServer as _SdkServer
from mcp_types import CallToolResult, Icon, InputRequiredResult, ToolAnnotations
from starlette.applications import Starlette

from wirecut.mcp._facts import StopReason
from wirecut.mcp._tool_call import LiveCalls, serving_request, sync_tool

__all__ = ["MCPServer"]

_CallableT = TypeVar("_CallableT", bound=Callable[..., Any])

#: The default bound on the wait for a stopped tool's thread, in seconds.
DEFAULT_UNWIND_TIMEOUT = 10.0


class MCPServer(_SdkServer[LifespanResultT]):
    """``mcp.server.mcpserver.MCPServer`` whose sync tools run under a scope that a cancel cuts.

    Takes the SDK's arguments, and ``unwind_timeout``: how long a stopped
    tool's handler waits for its thread (seconds, finite, >= 0; default 10).

    A sync tool (a plain ``def``) registered through ``tool()`` or
    ``add_tool()`` runs on a thread of its own with a new ``InterruptScope``
    bound: what it does through wirecut registers there (``wirecut.http`` and
    the adapters' requests, ``scope.popen`` process trees,
    ``wirecut.scope.sleep``/``wait``, a ``committing()`` block). Tools passed
    to the constructor as ``Tool`` objects, and async tools, run as the SDK
    runs them.

    Cancellation: a sync tool call is stopped by the client's
    ``notifications/cancelled`` for it, by its HTTP response stream closing
    (the 2026-07-28 wire, where that is the cancel), by the end of the
    connection or of the server, by ``cancel_calls()``, or by the tool's
    ``timeout``. The stop cuts the scope, waits up to ``unwind_timeout`` for
    the thread (which is never killed), logs one line of facts and sends them
    to the client as an MCP log notification with logger ``wirecut``. A
    cancelled request gets no result; a timeout or ``cancel_calls()`` gets an
    error result carrying the facts; a tool that committed keeps its result.
    Sync tools need the asyncio event loop (the SDK's default).
    """

    def __init__(
        self,
        name: str | None = None,
        *args: Any,
        unwind_timeout: float = DEFAULT_UNWIND_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        _check_seconds("unwind_timeout", unwind_timeout)
        self._unwind_timeout = float(unwind_timeout)
        self._calls = LiveCalls()
        super().__init__(name, *args, **kwargs)
        # Outermost, so it notes a notifications/cancelled before the stop's
        # report asks who cancelled (the SDK's own middleware may await first).
        self.middleware.insert(0, self._calls.observe)

    @property
    def unwind_timeout(self) -> float:
        """How long a stopped sync tool's handler waits for its thread, in seconds."""
        return self._unwind_timeout

    @property
    def running_calls(self) -> int:
        """How many sync tool calls run now (their thread, or their unwind)."""
        return len(self._calls)

    def cancel_calls(self, reason: str = "shutdown") -> int:
        """Stop every running sync tool call; returns how many there were.

        Safe from any thread; returns at once. Each call is stopped as a
        timeout is (``reason`` "shutdown" or "timeout" goes into its facts),
        and its request gets an error result carrying the facts. A host that
        ends the server on its own terms calls this first.
        """
        return self._calls.stop_all(StopReason(reason))

    def add_tool(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        annotations: ToolAnnotations | None = None,
        icons: list[Icon] | None = None,
        meta: dict[str, Any] | None = None,
        structured_output: bool | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """Add a tool, as the SDK's ``add_tool``; a sync one runs under a scope.

        ``timeout`` (seconds, finite, > 0, sync tools only) stops a call that
        runs longer, and answers it with an error result carrying the facts.
        """
        if timeout is not None:
            _check_seconds("timeout", timeout, positive=True)
        if _is_async(fn):
            if timeout is not None:
                raise TypeError(
                    f"timeout= is for sync tools; async tool {_name(fn, name)!r} can use "
                    "anyio.fail_after() itself"
                )
        else:
            fn = sync_tool(
                fn,
                tool=_name(fn, name),
                timeout=timeout,
                unwind_timeout=lambda: self._unwind_timeout,
                calls=self._calls,
            )
        super().add_tool(
            fn,
            name=name,
            title=title,
            description=description,
            annotations=annotations,
            icons=icons,
            meta=meta,
            structured_output=structured_output,
        )

    def tool(
        self,
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        annotations: ToolAnnotations | None = None,
        icons: list[Icon] | None = None,
        meta: dict[str, Any] | None = None,
        structured_output: bool | None = None,
        *,
        timeout: float | None = None,
    ) -> Callable[[_CallableT], _CallableT]:
        """Register a tool, as the SDK's ``@server.tool()``; see ``add_tool`` for ``timeout``.

        Returns the function itself (a sync tool stays callable as it was).
        """
        if callable(name):
            raise TypeError(
                "The @tool decorator was used incorrectly. Did you forget to call it? "
                "Use @tool() instead of @tool"
            )

        def decorator(fn: _CallableT) -> _CallableT:
            self.add_tool(
                fn,
                name=name,
                title=title,
                description=description,
                annotations=annotations,
                icons=icons,
                meta=meta,
                structured_output=structured_output,
                timeout=timeout,
            )
            return fn

        return decorator

    def streamable_http_app(self, **kwargs: Any) -> Starlette:
        """The SDK's Streamable HTTP app; its shutdown stops the running sync tool calls first.

        Takes the SDK's arguments. Before the app's lifespan ends the sessions
        (which cancels their handlers), ``cancel_calls("shutdown")`` stops the
        sync tool calls, so their facts say the server ended them.
        """
        app = super().streamable_http_app(**kwargs)
        inner = app.router.lifespan_context

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[Any]:
            async with inner(app) as state:
                try:
                    yield state
                finally:
                    self.cancel_calls("shutdown")

        app.router.lifespan_context = lifespan
        return app

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        """Call a tool, as the SDK's ``call_tool``, with its request known to a sync tool's stop."""
        request = None
        if context is not None:
            try:
                request = context.request_context
            except ValueError:
                request = None  # A direct call, outside of any request.
        with serving_request(request):
            return await super().call_tool(name, arguments, context)


def _check_seconds(what: str, value: object, *, positive: bool = False) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
        or value > threading.TIMEOUT_MAX
    ):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{what} must be a finite number of seconds {bound}, not {value!r}")


def _is_async(fn: Callable[..., Any]) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (an object with an async __call__)
    )


def _name(fn: Callable[..., Any], name: str | None) -> str:
    if name:
        return name
    named = getattr(fn, "__name__", None)
    return named if isinstance(named, str) else repr(fn)
