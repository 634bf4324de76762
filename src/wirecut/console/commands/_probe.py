"""``probe POINT``: block at one chosen point until the command is cut.

A diagnostic for a user's own deployment: each point is a place where a
command can be blocked when a cancel comes, made by the server itself on
loopback, so that the ``complete`` facts (timeline, ``worker_exited``, open
requests and processes) show where the cut reaches and how fast:

- ``connect``: a TCP connect through ``wirecut.http`` to a listener whose
  backlog is full (the kernel drops the SYN, so the connect really blocks);
- ``ttfb``: a ``ChatClient`` request to a server that accepts, reads the
  request and never answers (blocked waiting for the response headers);
- ``stream``: a ``ChatClient`` stream from a server that sends chat chunks
  slowly and forever (tokens go out as ``token`` output);
- ``subprocess``: ``scope.popen(["sleep", "3600"])`` and its wait;
- ``sleep``: ``scope.sleep()``;
- ``python-loop``: pure Python with no cooperative point, which only the
  runner's escalation (``Interrupted`` raised asynchronously) ends;
- ``nested-thread``: a thread started with ``scope.spawn()`` that blocks in
  ``scope.wait()``, and the command waiting for it;
- ``child-agent``: an ``AIAgent`` whose model (a loopback endpoint here)
  delegates to a child agent, whose stream never ends.

The servers are the simulator's loopback servers (``LoopbackServer``,
``FullBacklog``), the ones the tests script too; what they answer is here.
Every one is started by the probe, belongs to its command, and is stopped
when the command ends, cut or not: its threads are joined (with a bound, and
a straggler is reported on ``stderr``) and its sockets closed. Its threads
are plain threads, not registered with the command's scope, so the scope's
ledger and timeline show only the client side that the probe measures. A
cut reaches the command as ``Interrupted``, which the probe lets propagate
for the runner to report.

``probe`` is the console's command; ``probe_command(on_server=...)`` makes
one that shows each server it starts to a caller that watches the server
side (the tests).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx

import wirecut.http
import wirecut.scope as ws
from wirecut.agent import AIAgent, ConversationStatus, delegate_tool
from wirecut.console.commands._context import CommandContext, CommandError
from wirecut.console.commands._params import Args, Argument
from wirecut.console.commands._registry import Command, command
from wirecut.loopback import FullBacklog, LoopbackExchange, LoopbackRequest, LoopbackServer
from wirecut.provider import ChatClient, ChatResult, ProviderError
from wirecut.scope import Interrupted

__all__ = ["POINTS", "ServerObserver", "probe", "probe_command"]

#: Seconds between two chunks of the endless stream: slow enough to watch.
TOKEN_INTERVAL = 0.1
#: How long stopping a probe's server waits for all of its threads to end.
JOIN_BOUND = 5.0
#: How long after a cut the probe waits to see its server notice the close.
CLOSE_BOUND = 1.0
#: The longest the nested-thread probe is blocked in C in one join, so
#: that an escalation can land between two joins.
NESTED_JOIN_SLICE = 0.1
#: The read timeout of the probe's chat requests: a day, i.e. until cut.
REQUEST_TIMEOUT = 24 * 3600.0

#: Shown each loopback server or listener a probe starts, once it listens,
#: on the command's thread, before the probe uses it.
ServerObserver = Callable[[LoopbackServer | FullBacklog], None]

_CUT_HINT = "cancel to see where the cut lands"
_serial = itertools.count(1)


class _ProbeClient(ChatClient):
    """A ``ChatClient`` for the probe's own server that reports as the command.

    Every call's usage goes to ``ctx.add_usage`` (a cut call's too: ``chat()``
    returns what it received), and a call without ``on_token`` (a child
    agent's) streams its tokens to ``ctx.token``.
    """

    def __init__(self, ctx: CommandContext, base_url: str) -> None:
        super().__init__(base_url, model="probe", timeout=REQUEST_TIMEOUT, max_retries=0)
        self._ctx = ctx
        #: True once a token went out: a line written after it starts on a new line.
        self.streamed = False

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        stream: bool = True,
        on_token: Callable[[str], None] | None = None,
        **params: Any,
    ) -> ChatResult:
        sink = on_token or self._ctx.token

        def token(text: str) -> None:
            self.streamed = True
            sink(text)

        result = super().chat(messages, tools=tools, stream=stream, on_token=token, **params)
        self._ctx.add_usage(result.usage)
        return result


# -- the points -------------------------------------------------------------------------
# Each runs on the command's worker thread; ``announce`` is the command's
# ServerObserver (a point that starts no server has no use for it).


def _connect(ctx: CommandContext, announce: ServerObserver) -> None:
    with contextlib.ExitStack() as stack:
        backlog = stack.enter_context(FullBacklog())
        if not backlog.blocked:
            raise CommandError(
                "probe connect: could not fill the backlog of a loopback listener"
                " (every connect to it completed)"
            )
        announce(backlog)
        http = stack.enter_context(wirecut.http.client(timeout=None))
        ctx.write(
            f"probe connect: connecting to 127.0.0.1:{backlog.port}, a listener whose backlog"
            f" is full; {_CUT_HINT}\n"
        )
        while True:
            try:
                response = http.get(backlog.url)
            except httpx.ConnectTimeout:
                continue  # The connect bound passed before any cancel: connect again.
            except httpx.HTTPError as exc:
                raise CommandError(f"probe connect: {type(exc).__name__}: {exc}") from exc
            raise CommandError(
                f"probe connect: got HTTP {response.status_code} from a listener that never accepts"
            )


def _ttfb(ctx: CommandContext, announce: ServerObserver) -> None:
    with _serving(ctx, announce, "ttfb", _silent) as (server, client):
        ctx.write(
            f"probe ttfb: waiting for the response headers from 127.0.0.1:{server.port}, which"
            f" reads the request and never answers; {_CUT_HINT}\n"
        )
        result = _chat(ctx, "ttfb", server, client, stream=False)
    raise CommandError(f"probe ttfb: got an answer ({result.finish_reason}) from a silent server")


def _stream(ctx: CommandContext, announce: ServerObserver) -> None:
    with _serving(ctx, announce, "stream", _chat_completions) as (server, client):
        ctx.write(f"probe stream: reading a stream from 127.0.0.1:{server.port}; {_CUT_HINT}\n")
        result = _chat(ctx, "stream", server, client, stream=True)
    raise CommandError(f"probe stream: the endless stream ended ({result.finish_reason})")


def _chat(
    ctx: CommandContext, point: str, server: LoopbackServer, client: _ProbeClient, *, stream: bool
) -> ChatResult:
    """One chat request to the probe's server; raises ``Interrupted`` once it was cut."""
    messages = [{"role": "user", "content": "probe"}]
    try:
        result = client.chat(messages, stream=stream)
    except ProviderError as exc:
        raise CommandError(f"probe {point}: {exc}") from exc
    finally:
        _report_close(ctx, point, server, client)
    if result.interrupted:
        raise Interrupted(result.reason or ctx.scope.reason or "cancelled")
    return result


def _subprocess(ctx: CommandContext, announce: ServerObserver) -> None:
    argv = ["sleep", "3600"]
    while True:
        try:
            proc = ctx.scope.popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        except FileNotFoundError:
            raise CommandError("probe subprocess: there is no `sleep` program here") from None
        with proc:
            ctx.write(
                f"probe subprocess: waiting for `sleep 3600` (pid {proc.pid}, in its own process"
                f" group); {_CUT_HINT}\n"
            )
            code = proc.wait()
        ctx.scope.check()  # Killed by the cut: say so.
        if code != 0:
            raise CommandError(f"probe subprocess: `sleep 3600` ended with status {code}")


def _sleep(ctx: CommandContext, announce: ServerObserver) -> None:
    ctx.write(f"probe sleep: in scope.sleep(3600); {_CUT_HINT}\n")
    while True:
        ctx.scope.sleep(3600)


def _python_loop(ctx: CommandContext, announce: ServerObserver) -> None:
    ctx.write(
        "probe python-loop: spinning in pure Python with no cooperative point; only the"
        " escalation of a cancel (Interrupted raised in this thread) ends it\n"
    )
    n = 0
    while True:  # No call inside: nothing here checks the scope.
        n += 1


def _nested_thread(ctx: CommandContext, announce: ServerObserver) -> None:
    never = threading.Event()
    name = f"wirecut-probe-nested-thread-{next(_serial)}"
    future = ctx.scope.spawn(ws.wait, never, name=name)
    # spawn() started it: it is listed now, unless it already ended.
    thread = next((t for t in threading.enumerate() if t.name == name), None)
    ctx.write(
        f"probe nested-thread: waiting for thread {name}, which waits in scope.wait() for an"
        f" event that is never set; {_CUT_HINT}\n"
    )
    # Wait for the thread itself, not for the scope: the command ends only
    # once the cut has reached the nested thread and it has ended. Bounded
    # joins in a loop, so that the runner's escalation can still end this
    # wait if the cut never reaches the thread.
    while thread is not None and thread.is_alive():
        thread.join(NESTED_JOIN_SLICE)
    future.result()  # Raises what the thread raised: Interrupted, after a cut.
    raise CommandError(f"probe nested-thread: {name} returned by itself")


def _child_agent(ctx: CommandContext, announce: ServerObserver) -> None:
    with _serving(ctx, announce, "child-agent", _chat_completions) as (server, client):
        parent = AIAgent(client, tools=[delegate_tool(lambda: AIAgent(client))], max_iterations=2)
        ctx.write(
            f"probe child-agent: an agent delegates to a child agent whose stream from"
            f" 127.0.0.1:{server.port} never ends; {_CUT_HINT}\n"
        )
        try:
            outcome = parent.run_conversation("Hand the task to a helper.")
        finally:
            _report_close(ctx, "child-agent", server, client)
    if outcome.status is ConversationStatus.INTERRUPTED:
        raise Interrupted(outcome.reason or ctx.scope.reason or "cancelled")
    raise CommandError(
        f"probe child-agent: the agent ended with {outcome.status}: {outcome.reason}"
    )


_POINTS: dict[str, Callable[[CommandContext, ServerObserver], None]] = {
    "connect": _connect,
    "ttfb": _ttfb,
    "stream": _stream,
    "subprocess": _subprocess,
    "sleep": _sleep,
    "python-loop": _python_loop,
    "nested-thread": _nested_thread,
    "child-agent": _child_agent,
}
#: The points ``probe`` knows, in the order of its usage line.
POINTS = tuple(_POINTS)


def _tell_nobody(server: LoopbackServer | FullBacklog) -> None:
    pass


def probe_command(*, on_server: ServerObserver | None = None) -> Command:
    """The ``probe`` command, showing each server it starts to ``on_server``.

    ``on_server`` is called on the command's thread with each loopback server
    or listener, once it listens and before the probe uses it; the server is
    stopped (and its port closed) by the time the command returns.
    """
    announce = on_server or _tell_nobody

    @command(
        "probe",
        Argument("POINT", choices=POINTS, missing="probe takes one POINT"),
        summary="block at one point until cancelled, to see where a cut lands and how fast",
    )
    def probe(ctx: CommandContext, args: Args) -> None:
        """Block at the point ``args["point"]`` until the command's scope is cancelled.

        Runs on the command's worker thread with ``ctx.scope`` bound. Raises
        ``UsageError`` for anything but one known point, before it starts anything.

        Cancellation: the cut ends the block with ``Interrupted``, which
        propagates; ``python-loop`` ends only by the runner's escalation. Every
        loopback server, client, process and thread the probe started is stopped
        before it returns, cut or not.
        """
        _POINTS[args["point"]](ctx, announce)

    return probe


#: The console's ``probe``: it shows its servers to nobody.
probe = probe_command()


# -- the servers ------------------------------------------------------------------------


def _silent(exchange: LoopbackExchange) -> None:
    """``ttfb``'s server: read the request and never answer, until the client (or stop) closes."""
    exchange.hold(timeout=None)


def _chat_completions(exchange: LoopbackExchange) -> None:
    """``stream``'s and ``child-agent``'s server: a minimal OpenAI-compatible ``/chat/completions``.

    A request that offers a ``delegate`` tool and carries no tool result yet
    gets a streamed call to ``delegate``; any other an SSE stream of chunks,
    one every ``TOKEN_INTERVAL`` seconds, without end.
    """
    if _wants_delegate(exchange.request):
        exchange.sse([_DELEGATE_CHUNK, _chunk({}, "tool_calls")])
        return
    exchange.start_chunked()
    # Wait for the client between chunks, so that its close is seen at once,
    # not at the next write.
    while not exchange.await_close(TOKEN_INTERVAL):
        exchange.chunk(_TOKEN_EVENT)


@contextlib.contextmanager
def _serving(
    ctx: CommandContext,
    announce: ServerObserver,
    point: str,
    handler: Callable[[LoopbackExchange], None],
) -> Iterator[tuple[LoopbackServer, _ProbeClient]]:
    """A loopback server for ``point`` and a client of it; both closed on the way out."""
    with contextlib.ExitStack() as stack:
        server = LoopbackServer(handler, name=f"wirecut-probe-{point}")
        stack.callback(_stop_server, ctx, point, server)
        announce(server)
        client = _ProbeClient(ctx, f"{server.url}/v1")
        stack.callback(client.close)
        yield server, client


def _stop_server(ctx: CommandContext, point: str, server: LoopbackServer) -> None:
    stuck = server.stop(JOIN_BOUND)
    if stuck:
        ctx.write(
            f"probe {point}: server threads still running after {JOIN_BOUND:g} s:"
            f" {', '.join(stuck)}\n",
            "stderr",
        )


def _report_close(
    ctx: CommandContext, point: str, server: LoopbackServer, client: _ProbeClient
) -> None:
    """After a cut of a request the server had, say when the server saw the client close."""
    cancelled_at = ctx.scope.cancelled_at
    if cancelled_at is None or not server.requests:
        return
    # After streamed tokens, start the line on a line of its own.
    newline = "\n" if client.streamed else ""
    head = f"{newline}probe {point}: the server"
    if not server.wait_for(lambda: server.open_requests == 0, CLOSE_BOUND):
        ctx.write(
            f"{head} still had the request open {CLOSE_BOUND:g} s after the cancel\n", "stderr"
        )
        return
    closed_at = server.close_times.get(server.requests[-1].connection)
    if closed_at is not None:
        ms = (closed_at - cancelled_at) * 1000
        ctx.write(f"{head} saw the close {ms:.1f} ms after the cancel\n")


def _wants_delegate(request: LoopbackRequest) -> bool:
    """A request that offers ``delegate`` and has no tool result yet: the parent's first turn."""
    try:
        body = request.json()
    except ValueError:
        return False
    if not isinstance(body, dict):
        return False
    tools = body.get("tools") or []
    offers = any(
        isinstance(t, dict) and (t.get("function") or {}).get("name") == "delegate" for t in tools
    )
    messages = body.get("messages") or []
    answered = any(isinstance(m, dict) and m.get("role") == "tool" for m in messages)
    return offers and not answered


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "probe",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "probe",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


_TOKEN_EVENT = f"data: {json.dumps(_chunk({'content': 'tick '}))}\n\n".encode()
_DELEGATE_CALL = {
    "index": 0,
    "id": "call_probe",
    "type": "function",
    "function": {
        "name": "delegate",
        "arguments": json.dumps({"task": "Stream an answer that never ends."}),
    },
}
_DELEGATE_CHUNK = _chunk({"role": "assistant", "content": None, "tool_calls": [_DELEGATE_CALL]})
