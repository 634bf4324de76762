"""``McpClient``: a synchronous MCP client whose calls a cancel of the bound scope stops.

A worker thread (a console command, an agent's tool call) holds no event
loop; the official SDK's client is async. ``McpClient`` runs the SDK's
``Client`` on an asyncio loop in a thread of its own, owned by the client's
own ``InterruptScope``, and the worker waits for each request with a
registration on its bound scope: a cancel of that scope cancels the request
on the loop, which makes the SDK send ``notifications/cancelled`` for it.
The client then waits (bounded) for the server's ``wirecut`` log
notification (``StopFacts``), closes the call's HTTP response stream if there
is still one, and raises ``McpCallInterrupted`` with the call's record.

Targets: a command (stdio; the process is a ``scope.popen`` of the client's
scope, so it is counted, and killed with its group at ``close()`` or if this
process dies) or an ``http(s)://`` URL (Streamable HTTP). Over HTTP the client
speaks the handshake-era protocol (2025-11-25): there a cancel is a
notification and the response stream stays open to carry the server's facts;
on the 2026-07-28 wire closing the stream is the cancel, and nothing can come
back on it.

Bounds: the handshake (``connect_timeout``), every other request
(``request_timeout``), a tool call (``call_timeout``, none by default), the
wait for a stopped call's confirmation (``confirm_timeout``), one message
(``max_message_bytes``). A breach is one ``McpError`` with a one-line message.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import math
import secrets
import shlex
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    CallToolResult,
    Implementation,
    LoggingMessageNotificationParams,
    RequestId,
    RequestParamsMeta,
    Tool,
)

from wirecut import __version__
from wirecut.mcp._errors import (
    McpCallInterrupted,
    McpError,
    McpProtocolError,
    McpStartError,
    McpTimeoutError,
)
from wirecut.mcp._facts import CALL_META_KEY, LOGGER, StopFacts
from wirecut.mcp._record import McpCallRecord
from wirecut.mcp._stdio import Breach, scoped_stdio
from wirecut.mcp._wire import HttpStreams, tapped
from wirecut.scope import Interrupted, InterruptScope, current_scope

__all__ = ["ClientState", "McpClient"]

T = TypeVar("T")

#: How long ``close()`` waits for the loop's thread (the stdio server's exit
#: and kill included) before the client's scope cuts what is left.
CLOSE_BOUND = 10.0
#: The most pages of tools/list ``list_tools()`` reads.
MAX_PAGES = 100
#: The longest server-supplied text an error message quotes.
MAX_QUOTE = 300


class ClientState(enum.Enum):
    """The lifecycle of an ``McpClient``: NEW -> CONNECTING -> OPEN -> (BROKEN) -> CLOSED."""

    NEW = "new"  # made; connect() not called yet
    CONNECTING = "connecting"  # the handshake is under way
    OPEN = "open"  # connected: list_tools() and call_tool() work
    BROKEN = "broken"  # the connection ended by itself (the server exited, or broke a rule)
    CLOSED = "closed"  # close() was called: a client is not reopened


@dataclass(eq=False)
class _Call:
    """One tools/call in flight, as the loop tracks it (its fields change on the loop)."""

    tool: str
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    task: asyncio.Task[Any] | None = None
    in_flight: bool = False  # awaiting the SDK's call_tool: a cut cancels it
    cut_reason: str | None = None
    request_id: RequestId | None = None
    answered: bool = False  # a result (not an error) came for its request id
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # facts or an answer came
    facts: StopFacts | None = None

    def cut(self, reason: str) -> None:
        if self.cut_reason is None:
            self.cut_reason = reason
            if self.in_flight and self.task is not None:
                self.task.cancel()


@dataclass(frozen=True)
class _Outcome:
    result: CallToolResult | None = None
    error: McpError | None = None
    record: McpCallRecord | None = None
    reason: str | None = None


class _CallTable:
    """The tools/calls in flight, by token and request id; the tap's ``TapEvents`` (on the loop)."""

    def __init__(self) -> None:
        self._calls: dict[str, _Call] = {}
        self._by_id: dict[str, _Call] = {}

    def add(self, call: _Call) -> None:
        self._calls[call.token] = call

    def remove(self, call: _Call) -> None:
        self._calls.pop(call.token, None)
        if call.request_id is not None:
            self._by_id.pop(str(call.request_id), None)

    def sent(self, token: str, request_id: RequestId) -> None:
        call = self._calls.get(token)
        if call is not None:
            call.request_id = request_id
            self._by_id[str(request_id)] = call

    def answered(self, request_id: RequestId, *, error: bool) -> None:
        call = self._by_id.pop(str(request_id), None)
        if call is not None and call.cut_reason is not None:
            call.answered = not error
            call.settled.set()

    def confirmed(self, facts: StopFacts) -> None:
        call = None if facts.call is None else self._calls.get(facts.call)
        if call is not None:
            call.facts = facts
            call.settled.set()


class _Cut:
    """The registration of a waiting worker on its bound scope: a cut calls ``on_cut``."""

    __slots__ = ("_on_cut",)

    def __init__(self, on_cut: Callable[[str], None]) -> None:
        self._on_cut = on_cut

    def interrupt(self, reason: str) -> None:
        self._on_cut(reason)


class McpClient:
    """A synchronous client of one MCP server, for worker threads under a bound scope.

    ``target`` is a command (a string, split as a shell would, or an argv
    list) to run as a stdio server, or an ``http://``/``https://`` URL of a
    Streamable HTTP server. ``name`` (default: the target as given) names
    the server in errors and records. ``env`` adds to the SDK's safe default
    environment of a stdio server; ``cwd`` is its working directory.

    Thread-safe: ``list_tools`` and ``call_tool`` may be called from several
    threads at once. Use as a context manager, or ``connect()`` then
    ``close()``; a closed client is not reopened. A client that is not
    connected, or whose connection ended (``state``), raises ``McpError``.

    Cancellation: a call waits for its answer with a registration on the
    scope bound in the calling thread. A cancel of that scope sends
    ``notifications/cancelled`` for the request (before it was sent, nothing
    is sent), waits up to ``confirm_timeout`` seconds for the server to
    confirm the stop, closes the call's HTTP response stream if it is still
    open, and raises ``McpCallInterrupted`` with the call's ``McpCallRecord``.
    A ``call_timeout`` does the same and raises ``McpTimeoutError`` (its
    ``record`` attribute holds the record). ``connect()`` is cut the same
    way (``Interrupted``). The stdio server's process belongs to the client's
    own scope (``scope``), not to the caller's: a cut call leaves the
    connection up for the next one.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        connect_timeout: float = 10.0,
        request_timeout: float = 30.0,
        call_timeout: float | None = None,
        confirm_timeout: float = 10.0,
        max_message_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self._url: str | None = None
        self._argv: list[str] | None = None
        if isinstance(target, str) and target.strip().lower().startswith(("http://", "https://")):
            self._url = target.strip()
        else:
            try:
                argv = shlex.split(target) if isinstance(target, str) else [str(a) for a in target]
            except ValueError as exc:
                raise ValueError(f"cannot read the MCP server command {target!r}: {exc}") from None
            if not argv:
                raise ValueError("the MCP server command is empty")
            self._argv = argv
        for what, seconds in (
            ("connect_timeout", connect_timeout),
            ("request_timeout", request_timeout),
            ("confirm_timeout", confirm_timeout),
            ("call_timeout", call_timeout),
        ):
            if seconds is not None:
                _check_seconds(what, seconds)
        if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int):
            raise ValueError(f"max_message_bytes must be an int, not {max_message_bytes!r}")
        if max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be at least 1024, not {max_message_bytes}")
        self.name = name or (target if isinstance(target, str) else shlex.join(self._argv or []))
        self._env = dict(env or {})
        self._cwd = cwd
        self._connect_timeout = connect_timeout
        self._request_timeout = request_timeout
        self._call_timeout = call_timeout
        self._confirm_timeout = confirm_timeout
        self._max_message_bytes = max_message_bytes
        self._scope = InterruptScope(f"mcp client {self.name}")
        # Guards _state and _abort_requested, read and written by callers'
        # threads and the loop's.
        self._lock = threading.Lock()
        self._state = ClientState.NEW
        self._abort_requested = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_ready = threading.Event()
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread: concurrent.futures.Future[None] | None = None
        # Loop-side state (the loop's thread only).
        self._client: Client | None = None
        self._closing: asyncio.Event | None = None
        self._main_scope: anyio.CancelScope | None = None
        self._breach: Breach | None = None  # Made on the loop (it holds an anyio.Event).
        self._calls = _CallTable()
        self._http_streams = HttpStreams()

    # -- state -------------------------------------------------------------------

    @property
    def state(self) -> ClientState:
        return self._state

    @property
    def scope(self) -> InterruptScope:
        """The client's own scope: it owns the loop's thread and a stdio server's process."""
        return self._scope

    @property
    def server_pid(self) -> int | None:
        """The process id of a stdio server once started (None over HTTP)."""
        return None if self._breach is None else self._breach.pid

    @property
    def stderr_tail(self) -> list[str]:
        """The last lines a stdio server wrote to its stderr."""
        return [] if self._breach is None else list(self._breach.stderr)

    def __repr__(self) -> str:
        return f"<McpClient {self.name!r} {self._state.value}>"

    def __enter__(self) -> McpClient:
        self.connect()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- connecting and closing --------------------------------------------------

    def connect(self) -> None:
        """Start (stdio) or reach (HTTP) the server and finish the MCP handshake.

        Call from any thread, once. Raises ``McpStartError`` (or
        ``McpProtocolError`` for a server that speaks something else) within
        ``connect_timeout`` seconds, having closed the client.

        Cancellation: a cancel of the bound scope aborts the handshake and
        raises ``Interrupted`` once the client is closed.
        """
        with self._lock:
            if self._state is not ClientState.NEW:
                raise RuntimeError(
                    f"Cannot connect an MCP client that is {self._state.value}; "
                    "make a new McpClient"
                )
            self._state = ClientState.CONNECTING
        self._thread = self._scope.spawn(self._run_loop, name=f"wirecut-mcp[{self.name}]")
        try:
            self._wait(self._ready, self._connect_timeout, self._abort)
        except concurrent.futures.TimeoutError:
            detail = self._breach_detail()
            self.close()
            raise McpStartError(
                f"MCP server {self.name!r} did not finish the handshake within "
                f"{self._connect_timeout:g} s{detail}"
            ) from None
        except BaseException:
            self.close()
            raise
        with self._lock:
            if self._state is ClientState.CONNECTING:
                self._state = ClientState.OPEN

    def close(self) -> None:
        """End the connection; a stdio server gets EOF, then its group is killed if it stays.

        Idempotent; safe from any thread. Returns once the loop's thread
        ended and the client's scope owns nothing (both bounded).
        """
        with self._lock:
            if self._state is ClientState.CLOSED:
                return
            self._state = ClientState.CLOSED
            self._abort_requested = True
        self._post(self._close_on_loop)
        if self._thread is not None:
            concurrent.futures.wait([self._thread], timeout=CLOSE_BOUND)
        # What did not end by itself (a server that outlived its grace) is cut.
        self._scope.cancel("closed")
        self._scope.wait_quiescent(CLOSE_BOUND)
        self._scope.close()

    def _abort(self, reason: str) -> None:
        """A cut of connect(): stop the handshake (from the cutting thread)."""
        with self._lock:
            self._abort_requested = True
        if not self._ready.done():
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                self._ready.set_exception(Interrupted(reason))
        self._post(self._close_on_loop)

    def _close_on_loop(self) -> None:
        if self._closing is not None:
            self._closing.set()
        if self._main_scope is not None and self._client is None:
            self._main_scope.cancel()  # Still in the handshake: it is abandoned.

    def _post(self, callback: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None:
            return  # The loop sees _abort_requested when it starts.
        with contextlib.suppress(RuntimeError):  # Its loop has closed: nothing to stop.
            loop.call_soon_threadsafe(callback)

    # -- requests ------------------------------------------------------------------

    def list_tools(self) -> list[Tool]:
        """The server's tools (every page of tools/list).

        Raises ``McpTimeoutError`` when the server does not answer within
        ``request_timeout`` seconds, ``McpError`` for a broken connection.

        Cancellation: a cancel of the bound scope cancels the request and
        raises ``Interrupted``.
        """
        return self._request(self._list_tools, "tools/list")

    def call_tool(
        self,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> CallToolResult:
        """Call ``tool`` with ``arguments``; the server's result (``is_error`` included).

        ``timeout`` (seconds; default ``call_timeout``) bounds the call: past
        it the call is cancelled as a cut is, and ``McpTimeoutError`` (with
        ``record``) is raised.

        Cancellation: see the class. Raises ``McpCallInterrupted`` (an
        ``Interrupted``) with the call's record once the stop is confirmed or
        ``confirm_timeout`` passed; plain ``Interrupted`` when the scope was
        cancelled before anything was sent.
        """
        if timeout is not None:
            _check_seconds("timeout", timeout)
        limit = self._call_timeout if timeout is None else timeout
        loop = self._open_loop()
        call = _Call(tool=tool)
        outcome = self._wait_for(
            lambda: asyncio.run_coroutine_threadsafe(
                self._call(call, dict(arguments or {}), limit), loop
            ),
            on_cut=lambda reason: self._post(lambda: call.cut(reason)),
        )
        if outcome.record is not None:
            if outcome.reason == "timeout":
                raise McpTimeoutError(
                    f"MCP server {self.name!r} did not answer tools/call {tool!r} within "
                    f"{limit:g} s; {_stop_words(outcome.record.stopped)}",
                    record=outcome.record,
                )
            raise McpCallInterrupted(outcome.reason or "cancelled", outcome.record)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.result is not None
        return outcome.result

    def _request(self, make: Callable[[], Coroutine[Any, Any, T]], method: str) -> T:
        loop = self._open_loop()
        box: list[concurrent.futures.Future[T]] = []

        def submit() -> concurrent.futures.Future[T]:
            box.append(
                asyncio.run_coroutine_threadsafe(self._bounded(make(), method), loop),
            )
            return box[0]

        def cut(reason: str) -> None:
            if box:
                box[0].cancel()  # The request's task is cancelled: the SDK sends the cancel.

        try:
            return self._wait_for(submit, on_cut=cut)
        except concurrent.futures.CancelledError:
            raise Interrupted("cancelled") from None

    def _wait_for(
        self,
        submit: Callable[[], concurrent.futures.Future[T]],
        *,
        on_cut: Callable[[str], None],
    ) -> T:
        """Submit, then wait for the outcome; a cut of the bound scope calls ``on_cut``."""
        bound = current_scope()
        if bound is None:
            return submit().result()
        # Registered before anything is sent: on a cancelled scope this
        # raises Interrupted and nothing goes out.
        with bound.register(_Cut(on_cut)):
            return submit().result()

    def _wait(
        self,
        future: concurrent.futures.Future[T],
        timeout: float | None,
        on_cut: Callable[[str], None] | None,
    ) -> T:
        bound = current_scope() if on_cut is not None else None
        if bound is None or on_cut is None:
            return future.result(timeout)
        with bound.register(_Cut(on_cut)):
            return future.result(timeout)

    def _open_loop(self) -> asyncio.AbstractEventLoop:
        state = self._state
        if state is not ClientState.OPEN or self._loop is None:
            why = self._breach_detail() if state is ClientState.BROKEN else ""
            raise McpError(f"MCP server {self.name!r} is not connected (client {state.value}){why}")
        return self._loop

    # -- the loop (its own thread) -------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._closing = asyncio.Event()
        self._breach = Breach()
        self._loop = asyncio.get_running_loop()
        self._loop_ready.set()
        try:
            with anyio.CancelScope() as self._main_scope:
                with self._lock:
                    if self._abort_requested:
                        return
                async with Client(
                    self._transport(),
                    mode="legacy" if self._url else "auto",
                    logging_callback=self._on_log,
                    log_level="info",
                    client_info=Implementation(name="wirecut", version=__version__),
                    cache=None,
                ) as client:
                    self._client = client
                    with contextlib.suppress(concurrent.futures.InvalidStateError):
                        self._ready.set_result(None)
                    await self._until_closed()
        except BaseException as exc:
            if not self._ready.done():
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    self._ready.set_exception(self._start_error(exc))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._client = None
            with self._lock:
                if self._state in (ClientState.OPEN, ClientState.CONNECTING):
                    self._state = ClientState.BROKEN
            if not self._ready.done():
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    self._ready.set_exception(
                        McpStartError(f"MCP server {self.name!r}: the client was closed")
                    )

    def _transport(self) -> Any:
        if self._url is not None:
            http = httpx2.AsyncClient(
                timeout=httpx2.Timeout(30.0, read=300.0),
                event_hooks=self._http_streams.hooks,
            )
            inner = streamable_http_client(
                self._url, http_client=http, max_sse_event_size=self._max_message_bytes
            )
            return tapped(_owning(inner, http), self._calls)
        assert self._argv is not None
        assert self._breach is not None
        stdio = scoped_stdio(
            self._argv,
            scope=self._scope.child("stdio"),
            env=self._env,
            cwd=self._cwd,
            max_message_bytes=self._max_message_bytes,
            breach=self._breach,
        )
        return tapped(stdio, self._calls)

    async def _until_closed(self) -> None:
        assert self._closing is not None
        async with anyio.create_task_group() as waits:

            async def until(event: asyncio.Event | anyio.Event) -> None:
                await event.wait()
                waits.cancel_scope.cancel()

            waits.start_soon(until, self._closing)
            if self._breach is not None and self._url is None:
                waits.start_soon(until, self._breach.ended)

    async def _on_log(self, params: LoggingMessageNotificationParams) -> None:
        if params.logger == LOGGER:
            facts = StopFacts.from_json(params.data)
            if facts is not None:
                self._calls.confirmed(facts)

    async def _bounded(self, coro: Coroutine[Any, Any, T], method: str) -> T:
        try:
            return await asyncio.wait_for(coro, self._request_timeout)
        except TimeoutError:
            raise McpTimeoutError(
                f"MCP server {self.name!r} did not answer {method} within "
                f"{self._request_timeout:g} s"
            ) from None
        except MCPError as exc:
            raise self._protocol_error(exc, method) from None

    async def _list_tools(self) -> list[Tool]:
        client = self._session()
        tools: list[Tool] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return tools
        raise McpProtocolError(f"MCP server {self.name!r} listed more than {MAX_PAGES} pages")

    async def _call(self, call: _Call, arguments: dict[str, Any], limit: float | None) -> _Outcome:
        """Run one tools/call on the loop; the cut path waits for the server's word."""
        task = asyncio.current_task()
        assert task is not None
        call.task = task
        if call.cut_reason is not None:
            # Cut before it was sent: nothing reached the server.
            record = McpCallRecord(self.name, call.tool, stopped=True)
            return _Outcome(record=record, reason=call.cut_reason)
        loop = asyncio.get_running_loop()
        timer = None if limit is None else loop.call_later(limit, call.cut, "timeout")
        self._calls.add(call)
        try:
            try:
                client = self._session()
                call.in_flight = True
                try:
                    result = await client.call_tool(
                        call.tool,
                        arguments,
                        meta=cast(RequestParamsMeta, {CALL_META_KEY: call.token}),
                    )
                finally:
                    call.in_flight = False
            except asyncio.CancelledError:
                if call.cut_reason is None:
                    raise  # The loop is ending: the caller gets the closed connection.
                task.uncancel()
                return await self._after_cut(call)
            except McpError as exc:
                return _Outcome(error=exc)
            except MCPError as exc:
                return _Outcome(error=self._protocol_error(exc, f"tools/call {call.tool!r}"))
            except Exception as exc:
                return _Outcome(error=self._protocol_error(exc, f"tools/call {call.tool!r}"))
            if call.cut_reason is not None:
                # The answer came as the cut did: the server did the work.
                record = McpCallRecord(self.name, call.tool, stopped=False)
                return _Outcome(result=result, record=record, reason=call.cut_reason)
            return _Outcome(result=result)
        finally:
            if timer is not None:
                timer.cancel()
            self._calls.remove(call)
            self._http_streams.forget(call.token)

    async def _after_cut(self, call: _Call) -> _Outcome:
        """The SDK sent notifications/cancelled; wait for the server's facts or answer."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(call.settled.wait(), self._confirm_timeout)
        if self._url is not None:
            # Whatever the server said, the call's stream is done with.
            await self._http_streams.close(call.token)
        stopped: bool | None
        if call.facts is not None:
            stopped = call.facts.stopped
        elif call.answered:
            stopped = False
        else:
            stopped = None
        record = McpCallRecord(self.name, call.tool, stopped=stopped, facts=call.facts)
        return _Outcome(record=record, reason=call.cut_reason)

    def _session(self) -> Client:
        if self._client is None:
            raise McpProtocolError(f"MCP server {self.name!r}: the connection is closed")
        return self._client

    # -- errors ----------------------------------------------------------------------

    def _breach_detail(self) -> str:
        breach = self._breach
        if breach is None:
            return ""
        if breach.problem:
            return f"; it {breach.problem}"
        code = breach.exit_code
        stderr = self.stderr_tail
        said = f" ({_quote(stderr[-1])})" if stderr else ""
        if code is not None:
            return f"; it exited with code {code}{said}"
        return said and f"; its stderr says {_quote(stderr[-1])}"

    def _protocol_error(self, exc: BaseException, method: str) -> McpError:
        if isinstance(exc, MCPError) and exc.error.code == CONNECTION_CLOSED:
            if self._breach is not None and self._breach.problem:
                return McpProtocolError(f"MCP server {self.name!r} {self._breach.problem}")
            return McpProtocolError(
                f"MCP server {self.name!r} closed the connection during {method}"
                f"{self._breach_detail()}"
            )
        if isinstance(exc, MCPError):
            return McpError(
                f"MCP server {self.name!r} answered {method} with error {exc.error.code}: "
                f"{_quote(exc.error.message)}"
            )
        return McpProtocolError(
            f"MCP server {self.name!r} failed during {method}: {_describe(exc)}"
        )

    def _start_error(self, exc: BaseException) -> BaseException:
        leaf = _leaf(exc)
        if isinstance(leaf, McpError | Interrupted):
            return leaf
        if self._breach is not None and self._breach.problem:
            return McpProtocolError(f"MCP server {self.name!r} {self._breach.problem}")
        if isinstance(leaf, OSError) and self._argv is not None:
            why = leaf.strerror or str(leaf)
            return McpStartError(f"MCP server {self.name!r} did not start: {why}: {self._argv[0]}")
        if isinstance(leaf, httpx2.HTTPError | OSError):
            return McpStartError(
                f"MCP server {self.name!r} could not be reached: {_describe(leaf)}"
            )
        if isinstance(leaf, MCPError):
            if leaf.error.code == CONNECTION_CLOSED:
                return McpStartError(
                    f"MCP server {self.name!r} closed the connection during the handshake"
                    f"{self._breach_detail()}"
                )
            return McpStartError(
                f"MCP server {self.name!r} refused the handshake: {_quote(leaf.error.message)}"
            )
        if isinstance(leaf, asyncio.CancelledError | anyio.get_cancelled_exc_class()):
            return McpStartError(f"MCP server {self.name!r}: the handshake was abandoned")
        return McpStartError(f"MCP server {self.name!r} could not connect: {_describe(leaf)}")


@contextlib.asynccontextmanager
async def _owning(
    transport: contextlib.AbstractAsyncContextManager[T], http: httpx2.AsyncClient
) -> Any:
    """``transport``, and ``http`` closed after it (the SDK leaves a client it was given open)."""
    async with http, transport as streams:
        yield streams


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return _quote(f"{type(exc).__name__}: {text}" if str(exc) else text)


def _quote(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_QUOTE else line[: MAX_QUOTE - 3] + "..."


def _stop_words(stopped: bool | None) -> str:
    return {
        True: "the server stopped it",
        False: "the server did NOT stop it",
        None: "the stop was not confirmed",
    }[stopped]


def _check_seconds(what: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or value > threading.TIMEOUT_MAX
    ):
        raise ValueError(f"{what} must be a finite number of seconds >= 0, not {value!r}")
