"""One sync tool call on a thread under an ``InterruptScope``, and how it is stopped.

The official SDK runs a plain ``def`` tool through ``anyio.to_thread.run_sync``:
a cancel of the request lets the handler go and the thread run on. Here the
tool runs through ``wirecut.aio.run_sync`` instead, on a thread of its own
with a scope bound, so a cut reaches what it is blocked in (a request through
``wirecut.http`` or the adapters, a ``scope.popen`` process tree, a
``scope.sleep``/``wait``), and the handler waits, bounded, for the thread.

A call is stopped when the first of these comes:

- the handler is cancelled: the SDK does that for the client's
  ``notifications/cancelled``, for a closed response stream on the 2026-07-28
  HTTP wire, and when the session or server ends;
- the tool's ``timeout`` passes;
- ``LiveCalls.stop_all`` (the server's ``cancel_calls``) asks.

The stop cuts the scope, cancels the ``run_sync`` task (which waits up to
``unwind_timeout`` for the thread), then reports ``StopFacts`` once: one log
line, and an MCP log notification (logger ``wirecut``) on the request's own
channel. A cancelled request then ends as the SDK ends it, without a result;
a timeout or a server stop answers with an error result carrying the facts.
A tool that committed (``wirecut.scope.committing()``) keeps its result.

All of it runs on the server's event loop, which must be asyncio's.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from mcp.server.connection import allowed_log_levels
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import (
    CallToolResult,
    LoggingLevel,
    LoggingMessageNotification,
    LoggingMessageNotificationParams,
    TextContent,
)

from wirecut.aio import run_sync, unwind_of
from wirecut.mcp._facts import CALL_META_KEY, LOGGER, StopFacts, StopReason
from wirecut.scope import Interrupted, InterruptScope

__all__ = ["FACTS_META_KEY", "LiveCalls", "current_request", "run_cut", "serving_request"]

_log = logging.getLogger("wirecut.mcp")

#: The ``_meta`` key of an error result (a timeout, a server stop) that carries the facts.
FACTS_META_KEY = "dev.wirecut/stop"
#: How long the facts' notification may take to write before it is dropped:
#: a client that stopped reading must not hold the handler.
NOTIFY_BOUND = 2.0

# The request the running tool call answers: set by the server around its
# call_tool, read by run_cut in the same task.
_request: contextvars.ContextVar[ServerRequestContext[Any, Any] | None] = contextvars.ContextVar(
    "wirecut_mcp_request", default=None
)


def current_request() -> ServerRequestContext[Any, Any] | None:
    """The request whose tool call runs in this task, or None (a direct ``call_tool``)."""
    return _request.get()


class serving_request:  # lower case: used like a function, as contextlib.suppress is
    """Make ``request`` the one ``run_cut`` answers, for the ``with`` block (same task)."""

    __slots__ = ("_request", "_token")

    def __init__(self, request: ServerRequestContext[Any, Any] | None) -> None:
        self._request = request

    def __enter__(self) -> None:
        self._token = _request.set(self._request)

    def __exit__(self, *exc_info: object) -> None:
        _request.reset(self._token)


_CallKey = tuple[str | None, str]


def _key(request: ServerRequestContext[Any, Any] | None, request_id: object) -> _CallKey | None:
    """A request on one connection: its HTTP session (None on stdio) and its id as text.

    Ids are compared as text, as the SDK's dispatcher does: a client may name
    request 3 as "3" in its ``notifications/cancelled``.
    """
    if request is None or isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return None
    headers = getattr(request.request, "headers", None)
    session = headers.get("mcp-session-id") if isinstance(headers, Mapping) else None
    return (session if isinstance(session, str) else None, str(request_id))


@dataclass(eq=False)
class _LiveCall:
    """A running call as ``LiveCalls`` tracks it; its fields change on the server's loop."""

    key: _CallKey | None
    loop: asyncio.AbstractEventLoop
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stop_reason: StopReason = StopReason.SHUTDOWN
    peer_cancelled: bool = False


class LiveCalls:
    """The sync tool calls of one server that are running now.

    ``enter``/``leave`` and ``observe`` run on the server's event loop;
    ``stop_all`` may be called from any thread.
    """

    def __init__(self) -> None:
        # Guards _calls: stop_all reads it from other threads.
        self._lock = threading.Lock()
        self._calls: set[_LiveCall] = set()

    def enter(self, request: ServerRequestContext[Any, Any] | None) -> _LiveCall:
        call = _LiveCall(
            key=None if request is None else _key(request, request.request_id),
            loop=asyncio.get_running_loop(),
        )
        with self._lock:
            self._calls.add(call)
        return call

    def leave(self, call: _LiveCall) -> None:
        with self._lock:
            self._calls.discard(call)

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)

    def stop_all(self, reason: StopReason) -> int:
        """Stop every running call with ``reason``; returns how many were asked.

        Safe from any thread; returns at once (each call stops on its loop).
        """
        with self._lock:
            calls = list(self._calls)
        for call in calls:
            try:
                call.loop.call_soon_threadsafe(_stop, call, reason)
            except RuntimeError:
                pass  # Its loop closed: the call is over.
        return len(calls)

    async def observe(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """Server middleware: note which running calls the client cancelled.

        The SDK's dispatcher applies a ``notifications/cancelled`` itself (it
        cancels the handler) before any middleware sees it; this only tells
        the stop's report that the client asked, rather than a disconnect or
        the end of the connection.
        """
        if ctx.request_id is None and ctx.method == "notifications/cancelled":
            params = ctx.params or {}
            key = _key(ctx, params.get("requestId"))
            if key is not None:
                with self._lock:
                    for call in self._calls:
                        if call.key == key:
                            call.peer_cancelled = True
        return await call_next(ctx)


def _stop(call: _LiveCall, reason: StopReason) -> None:
    if not call.stop.is_set():
        call.stop_reason = reason
        call.stop.set()


class _Body:
    """``fn(**kwargs)``, noting when it returned (written in the tool's thread)."""

    __slots__ = ("exited_at", "fn", "kwargs")

    def __init__(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        self.fn = fn
        self.kwargs = kwargs
        self.exited_at: float | None = None

    def __call__(self) -> Any:
        try:
            return self.fn(**self.kwargs)
        finally:
            self.exited_at = time.monotonic()


_MISSING: Any = object()


async def run_cut(
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    *,
    tool: str,
    tool_timeout: float | None,
    unwind_timeout: float,
    calls: LiveCalls,
) -> Any:
    """Run the sync tool ``fn(**kwargs)`` on a thread under a new scope; stop it as the module says.

    Call from the tool's handler, on the server's asyncio loop. Returns what
    ``fn`` returns (or, for a timeout or a server stop, an error
    ``CallToolResult`` carrying the facts); raises what ``fn`` raises
    (``Interrupted`` becomes a ``ToolError``: a cut must not escape into the
    SDK as a ``BaseException``).

    Cancellation: a cancel of the handler cuts the scope and waits up to
    ``unwind_timeout`` seconds for the thread, shielded from the cancel's
    repeats; then the facts are reported and the cancel goes on (no result is
    sent), unless the tool committed, whose result is returned. A thread still
    running at the bound is reported, never killed.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise ToolError(
            f"wirecut.mcp runs sync tools on an asyncio event loop; tool {tool!r} was called "
            "on another one"
        ) from None
    request = _request.get()
    scope = InterruptScope(f"mcp tool {tool}")
    body = _Body(fn, kwargs)
    live = calls.enter(request)
    task = loop.create_task(run_sync(body, scope=scope, unwind_timeout=unwind_timeout))
    stop_wait = loop.create_task(live.stop.wait())
    cancelled: asyncio.CancelledError | None = None
    try:
        try:
            done, _ = await asyncio.wait(
                {task, stop_wait}, timeout=tool_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError as exc:
            cancelled = exc
            reason: StopReason | None = None  # Told after the unwind: see _cancel_reason.
        else:
            if task in done:
                return _outcome(task, tool)
            reason = live.stop_reason if stop_wait in done else StopReason.TIMEOUT
        # The cancel's repeats (anyio re-delivers it at every await) must not
        # cut the unwind short: the bound is unwind_timeout, not the next await.
        with anyio.CancelScope(shield=True):
            scope.cancel(_SCOPE_REASONS.get(reason, "cancelled"))
            facts, value = await _unwind(task, scope, body, unwind_timeout, tool)
            if reason is None:
                reason = _cancel_reason(live, request)
            facts = _with_reason(facts, reason, request)
            await _report(facts, request)
        if facts.committed and value is not _MISSING:
            return value  # Durable before the cut took effect: the result stands.
        if cancelled is not None:
            raise cancelled
        return CallToolResult(
            content=[TextContent(type="text", text=f"wirecut: {facts.summary()}")],
            is_error=True,
            _meta={FACTS_META_KEY: facts.to_json()},
        )
    finally:
        stop_wait.cancel()
        calls.leave(live)
        scope.close()


# What the scope is cancelled with (its reason, seen by the tool's Interrupted).
_SCOPE_REASONS: dict[StopReason | None, str] = {
    StopReason.TIMEOUT: "timeout",
    StopReason.SHUTDOWN: "shutdown",
}


def _outcome(task: asyncio.Task[Any], tool: str) -> Any:
    try:
        return task.result()
    except Interrupted as exc:
        # The tool was cut by a scope of its own: an error to report, not a
        # BaseException for the SDK's handler to die of.
        raise ToolError(f"tool {tool!r} was {exc}") from exc


async def _unwind(
    task: asyncio.Task[Any],
    scope: InterruptScope,
    body: _Body,
    unwind_timeout: float,
    tool: str,
) -> tuple[StopFacts, Any]:
    """Cancel the run_sync task (the scope is cut), wait for it; the facts and fn's value."""
    task.cancel()
    started = True
    exited = True
    value = _MISSING
    try:
        value = await task  # It had returned before the cut reached it.
    except asyncio.CancelledError as exc:
        unwind = unwind_of(exc)
        if unwind is not None:
            started, exited = unwind.started, unwind.worker_exited
            future = unwind.future
            if future.done() and not future.cancelled() and future.exception() is None:
                value = future.result()
    except BaseException:
        pass  # fn raised (Interrupted included) before the cut: no value to keep.
    cancelled_at = scope.cancelled_at
    assert cancelled_at is not None
    finished_first = body.exited_at is not None and body.exited_at < cancelled_at
    to_exit = None
    if started and exited and body.exited_at is not None and not finished_first:
        to_exit = (body.exited_at - cancelled_at) * 1000
    if exited:
        # Processes cut on the way out may still be dying: wait for the scope
        # to own nothing, within what is left of the unwind bound.
        remaining = unwind_timeout - (time.monotonic() - cancelled_at)
        if remaining > 0 and any(scope.live().values()):
            await anyio.to_thread.run_sync(scope.wait_quiescent, remaining)
    owned = scope.live()
    timeline = [(str(event), ms) for event, ms in scope.timeline]
    if to_exit is not None:
        timeline.append(("worker_exited", to_exit))
    timeline.sort(key=lambda step: step[1])
    committed = scope.committed
    facts = StopFacts(
        tool=tool,
        request_id=None,
        call=None,
        reason=StopReason.CANCELLED,
        stopped=exited and not committed and not finished_first,
        started=started,
        worker_exited=exited,
        committed=committed,
        cancel_to_exit_ms=to_exit,
        open_requests=owned["sockets"],
        open_processes=owned["processes"],
        timeline=tuple(timeline),
    )
    return facts, value


def _cancel_reason(live: _LiveCall, request: ServerRequestContext[Any, Any] | None) -> StopReason:
    """Who cancelled the handler: a stop of the server's, the client, a disconnect, the end."""
    if live.stop.is_set():
        # cancel_calls() asked first (the server's shutdown asks before its
        # transport cancels the handlers).
        return live.stop_reason
    if live.peer_cancelled:
        return StopReason.CANCELLED
    if request is not None and request.request is not None:
        # HTTP: on the 2026-07-28 wire the SDK cancels a handler whose
        # response stream closed; a legacy session's cancels are notifications.
        return StopReason.DISCONNECT
    return StopReason.SHUTDOWN  # stdio: the client closed the connection, or the server stopped


def _with_reason(
    facts: StopFacts, reason: StopReason, request: ServerRequestContext[Any, Any] | None
) -> StopFacts:
    meta: Mapping[str, Any] = (request.meta if request is not None else None) or {}
    call = meta.get(CALL_META_KEY)
    request_id = None if request is None else request.request_id
    return dataclasses.replace(
        facts,
        reason=reason,
        request_id=request_id,
        call=call if isinstance(call, str) else None,
    )


async def _report(facts: StopFacts, request: ServerRequestContext[Any, Any] | None) -> None:
    """One log line, and the facts to the client as a ``wirecut`` log notification."""
    if facts.stopped:
        _log.info("wirecut.mcp: %s", facts.summary())
    else:
        _log.warning("wirecut.mcp: %s", facts.summary())
    if request is None or request.request_id is None:
        return
    level: LoggingLevel = "info" if facts.stopped else "warning"
    # The 2026-07-28 wire sends a log only to a request that opted in at
    # that level; earlier ones send every level (the SDK's own gate).
    if level not in allowed_log_levels(request.protocol_version, request.meta):
        return
    notification = LoggingMessageNotification(
        params=LoggingMessageNotificationParams(level=level, logger=LOGGER, data=facts.to_json())
    )
    with anyio.move_on_after(NOTIFY_BOUND):
        try:
            await request.session.send_notification(
                notification, related_request_id=request.request_id
            )
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass  # The client is gone; the log line above still says it.


def sync_tool(
    fn: Callable[..., Any],
    *,
    tool: str,
    timeout: float | None,
    unwind_timeout: Callable[[], float],
    calls: LiveCalls,
) -> Callable[..., Any]:
    """An ``async def`` with ``fn``'s name, signature and docs that runs it through ``run_cut``.

    The SDK reads a tool's parameters, annotations and description from the
    function it registers; ``functools.wraps`` hands it ``fn``'s.
    """

    @functools.wraps(fn)
    async def call(**kwargs: Any) -> Any:
        return await run_cut(
            fn,
            kwargs,
            tool=tool,
            tool_timeout=timeout,
            unwind_timeout=unwind_timeout(),
            calls=calls,
        )

    return call
