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

Every loopback server is started by the probe, belongs to its command, and is
stopped when the command ends, cut or not: its threads are joined (with a
bound, and a straggler is reported on ``stderr``) and its sockets closed.
Its threads are plain threads, not registered with the command's scope, so
the scope's ledger and timeline show only the client side that the probe
measures. A cut reaches the command as ``Interrupted``, which the probe lets
propagate for the runner to report.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

import wirecut.http
import wirecut.scope as ws
from wirecut.agent import AIAgent, ConversationStatus, delegate_tool
from wirecut.console.commands._context import CommandContext, CommandError, UsageError
from wirecut.console.commands._registry import command
from wirecut.provider import ChatClient, ChatResult, ProviderError
from wirecut.scope import Interrupted

__all__ = ["POINTS", "FullListener", "ProbeServer", "probe", "server_hook"]

#: Seconds between two chunks of the endless stream: slow enough to watch.
TOKEN_INTERVAL = 0.1
#: How long stopping a probe's server waits for all of its threads to end.
JOIN_BOUND = 5.0
#: How long after a cut the probe waits to see its server notice the close.
CLOSE_BOUND = 1.0
#: The longest the nested-thread probe is blocked in C in one join, so
#: that an escalation can land between two joins.
NESTED_JOIN_SLICE = 0.1
#: How long a filler connect may take before its SYN counts as dropped.
FILL_WAIT = 0.25
#: The most filler connections a backlog gets before we give up filling it.
MAX_FILLERS = 64
#: The read timeout of the probe's chat requests: a day, i.e. until cut.
REQUEST_TIMEOUT = 24 * 3600.0
#: The largest request head the probe's servers read.
MAX_HEAD = 64 * 1024

_CUT_HINT = "cancel to see where the cut lands"
_serial = itertools.count(1)


class ProbeServer:
    """A loopback HTTP server that one probe starts, owns and stops.

    Raw sockets, an accept thread and a thread per connection, all named
    ``wirecut-probe-<point>-...``. With ``answer=False`` it reads each request
    and never answers (``ttfb``). With ``answer=True`` it is a minimal
    OpenAI-compatible ``/chat/completions``: a request that offers a
    ``delegate`` tool and carries no tool result yet gets a streamed call to
    ``delegate``; any other gets an SSE stream of chunks, one every
    ``interval`` seconds, without end.

    The records (``requests``, ``exchanges``, ``open_exchanges``,
    ``peer_closes``, ``chunks_sent``) are guarded by a Condition that every
    change notifies: ``wait_for()`` waits on it with a bound. An *exchange* is
    a request the server holds unanswered or streams to; ``peer_closes`` holds
    the ``time.monotonic()`` of each exchange whose client closed it (not the
    server's own stop). Created and stopped by the command's worker thread.
    """

    def __init__(self, point: str, *, answer: bool, interval: float = TOKEN_INTERVAL) -> None:
        self.point = point
        self.answer = answer
        self.interval = interval
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        # Guards the records, the connection list and the socket states: a
        # socket is shut down (by stop) and closed (by its owner thread) only
        # under it, so a shutdown never reaches a closed fd (docs/architecture.md, fact 3).
        self._cond = threading.Condition()
        self.requests: list[dict[str, Any]] = []
        self.exchanges = 0
        self.open_exchanges = 0
        self.peer_closes: list[float] = []
        self.chunks_sent = 0
        self._stopping = False
        self._listener_open = True
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(
            target=self._accept_loop, name=f"wirecut-probe-{point}-accept", daemon=True
        )
        self._accepter.start()

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` holds (checked under the lock); False after ``timeout``."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def stop(self, bound: float = JOIN_BOUND) -> list[str]:
        """Stop accepting, wake and join every thread, close every socket.

        Returns the names of the threads still running after ``bound``
        seconds (their sockets stay open: only their owner closes them).
        Idempotent.
        """
        deadline = time.monotonic() + bound
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            if self._listener_open:
                _shutdown(self._listener)  # wakes accept() (Linux)
        self._accepter.join(max(0.0, deadline - time.monotonic()))
        # The accept thread is over (or stuck): no connection is added after this.
        with self._cond:
            for conn in self._conns:
                _shutdown(conn)  # wakes recv(); the peer sees the close
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in [self._accepter, *threads] if t.is_alive()]

    # -- serving (the server's own threads) -----------------------------------------

    def _accept_loop(self) -> None:
        try:
            while True:
                try:
                    conn, _ = self._listener.accept()
                except OSError:
                    return
                with self._cond:
                    if self._stopping:
                        conn.close()
                        return
                    self._conns.append(conn)
                    thread = threading.Thread(
                        target=self._serve,
                        args=(conn,),
                        name=f"wirecut-probe-{self.point}-conn{len(self._threads)}",
                        daemon=True,
                    )
                    self._threads.append(thread)
                thread.start()
        finally:
            with self._cond:
                self._listener_open = False
                self._listener.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                body = self._read_request(conn)
                if body is None:
                    return
                with self._cond:
                    self.requests.append(body)
                    self._cond.notify_all()
                if not self.answer:
                    self._exchange(conn, self._hold)
                    return
                if not _wants_delegate(body):
                    self._exchange(conn, self._stream)
                    return
                if not _send(conn, _DELEGATE_RESPONSE):
                    return
        finally:
            with self._cond:
                self._conns.remove(conn)
                conn.close()

    def _read_request(self, conn: socket.socket) -> dict[str, Any] | None:
        """The JSON body of the next request ({} if it has none), or None once closed."""
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            data = _recv(conn)
            if not data or len(buffer) > MAX_HEAD:
                return None
            buffer += data
        head, _, body = buffer.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip() or b"0")
        while len(body) < length:
            data = _recv(conn)
            if not data:
                return None
            body += data
        try:
            parsed = json.loads(body[:length] or b"{}")
        except ValueError:
            parsed = {}
        return parsed if isinstance(parsed, dict) else {}

    def _exchange(self, conn: socket.socket, serve: Callable[[socket.socket], None]) -> None:
        with self._cond:
            self.exchanges += 1
            self.open_exchanges += 1
            self._cond.notify_all()
        try:
            serve(conn)
        finally:
            with self._cond:
                self.open_exchanges -= 1
                if not self._stopping:
                    self.peer_closes.append(time.monotonic())
                self._cond.notify_all()

    def _hold(self, conn: socket.socket) -> None:
        # Never answer; return when the client (or stop) closes the connection.
        while _recv(conn):
            pass

    def _stream(self, conn: socket.socket) -> None:
        if not _send(conn, _STREAM_HEAD):
            return
        # Wait for the client between chunks, so that its close is seen at
        # once, not at the next write.
        conn.settimeout(self.interval)
        while True:
            try:
                data = conn.recv(65536)
            except TimeoutError:
                if not _send(conn, _TOKEN_CHUNK):
                    return
                with self._cond:
                    self.chunks_sent += 1
                    self._cond.notify_all()
                continue
            except OSError:
                return
            if not data:
                return


class FullListener:
    """A loopback listener that never accepts, its backlog filled: a connect to it blocks.

    The filler connections complete into the accept queue until one is not
    completed within ``FILL_WAIT`` (the kernel dropped its SYN: the queue is
    full); that one is closed, so that the probe's connect is the only one
    waiting. Made and closed by the command's worker thread; no threads.
    """

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=0)
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self._fillers: list[socket.socket] = []
        try:
            self._fill()
        except BaseException:
            self.close()
            raise

    def _fill(self) -> None:
        for _ in range(MAX_FILLERS):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(FILL_WAIT)
            try:
                sock.connect(("127.0.0.1", self.port))
            except TimeoutError:
                sock.close()
                return
            except BaseException:
                sock.close()
                raise
            self._fillers.append(sock)
        raise CommandError(
            f"probe connect: the backlog of a loopback listener took {MAX_FILLERS} connections"
            " and was still not full"
        )

    def close(self) -> None:
        """Close the fillers and the listener (a connect still waiting is then refused)."""
        for sock in self._fillers:
            sock.close()
        self._fillers.clear()
        self._listener.close()


#: Called with each loopback server or listener a probe starts, once it
#: listens, on the command's thread. None by default; tests set it to watch
#: the server side.
server_hook: Callable[[ProbeServer | FullListener], None] | None = None


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


def _connect(ctx: CommandContext) -> None:
    with contextlib.ExitStack() as stack:
        listener = FullListener()
        stack.callback(listener.close)
        _announce(listener)
        http = stack.enter_context(wirecut.http.client(timeout=None))
        ctx.write(
            f"probe connect: connecting to 127.0.0.1:{listener.port}, a listener whose backlog"
            f" is full; {_CUT_HINT}\n"
        )
        while True:
            try:
                response = http.get(listener.url)
            except httpx.ConnectTimeout:
                continue  # The connect bound passed before any cancel: connect again.
            except httpx.HTTPError as exc:
                raise CommandError(f"probe connect: {type(exc).__name__}: {exc}") from exc
            raise CommandError(
                f"probe connect: got HTTP {response.status_code} from a listener that never accepts"
            )


def _ttfb(ctx: CommandContext) -> None:
    with contextlib.ExitStack() as stack:
        server = _start_server(stack, ctx, "ttfb", answer=False)
        client = _ProbeClient(ctx, server.url)
        stack.callback(client.close)
        ctx.write(
            f"probe ttfb: waiting for the response headers from 127.0.0.1:{server.port}, which"
            f" reads the request and never answers; {_CUT_HINT}\n"
        )
        result = _chat(ctx, server, client, stream=False)
        raise CommandError(
            f"probe ttfb: got an answer ({result.finish_reason}) from a silent server"
        )


def _stream(ctx: CommandContext) -> None:
    with contextlib.ExitStack() as stack:
        server = _start_server(stack, ctx, "stream", answer=True)
        client = _ProbeClient(ctx, server.url)
        stack.callback(client.close)
        ctx.write(f"probe stream: reading a stream from 127.0.0.1:{server.port}; {_CUT_HINT}\n")
        result = _chat(ctx, server, client, stream=True)
        raise CommandError(f"probe stream: the endless stream ended ({result.finish_reason})")


def _chat(
    ctx: CommandContext, server: ProbeServer, client: _ProbeClient, *, stream: bool
) -> ChatResult:
    """One chat request to the probe's server; raises ``Interrupted`` once it was cut."""
    messages = [{"role": "user", "content": "probe"}]
    try:
        result = client.chat(messages, stream=stream)
    except ProviderError as exc:
        raise CommandError(f"probe {server.point}: {exc}") from exc
    finally:
        _report_close(ctx, server, client)
    if result.interrupted:
        raise Interrupted(result.reason or ctx.scope.reason or "cancelled")
    return result


def _subprocess(ctx: CommandContext) -> None:
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


def _sleep(ctx: CommandContext) -> None:
    ctx.write(f"probe sleep: in scope.sleep(3600); {_CUT_HINT}\n")
    while True:
        ctx.scope.sleep(3600)


def _python_loop(ctx: CommandContext) -> None:
    ctx.write(
        "probe python-loop: spinning in pure Python with no cooperative point; only the"
        " escalation of a cancel (Interrupted raised in this thread) ends it\n"
    )
    n = 0
    while True:  # No call inside: nothing here checks the scope.
        n += 1


def _nested_thread(ctx: CommandContext) -> None:
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


def _child_agent(ctx: CommandContext) -> None:
    with contextlib.ExitStack() as stack:
        server = _start_server(stack, ctx, "child-agent", answer=True)
        client = _ProbeClient(ctx, server.url)
        stack.callback(client.close)
        parent = AIAgent(client, tools=[delegate_tool(lambda: AIAgent(client))], max_iterations=2)
        ctx.write(
            f"probe child-agent: an agent delegates to a child agent whose stream from"
            f" 127.0.0.1:{server.port} never ends; {_CUT_HINT}\n"
        )
        try:
            outcome = parent.run_conversation("Hand the task to a helper.")
        finally:
            _report_close(ctx, server, client)
        if outcome.status is ConversationStatus.INTERRUPTED:
            raise Interrupted(outcome.reason or ctx.scope.reason or "cancelled")
        raise CommandError(
            f"probe child-agent: the agent ended with {outcome.status}: {outcome.reason}"
        )


_POINTS: dict[str, Callable[[CommandContext], None]] = {
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

_USAGE = "probe connect|ttfb|stream|subprocess|sleep|python-loop|nested-thread|child-agent"


@command(
    "probe",
    usage=_USAGE,
    summary="block at one point until cancelled, to see where a cut lands and how fast",
)
def probe(ctx: CommandContext, args: list[str]) -> None:
    """Block at the point ``args[0]`` until the command's scope is cancelled.

    Runs on the command's worker thread with ``ctx.scope`` bound. Raises
    ``UsageError`` for anything but one known point, before it starts anything.

    Cancellation: the cut ends the block with ``Interrupted``, which
    propagates; ``python-loop`` ends only by the runner's escalation. Every
    loopback server, client, process and thread the probe started is stopped
    before it returns, cut or not.
    """
    if len(args) != 1 or args[0] not in _POINTS:
        what = f"unknown point {args[0]!r}" if len(args) == 1 else "probe takes one POINT"
        raise UsageError(f"{what}: one of {', '.join(POINTS)}; usage: {_USAGE}")
    _POINTS[args[0]](ctx)


# -- helpers ------------------------------------------------------------------------------


def _announce(server: ProbeServer | FullListener) -> None:
    hook = server_hook
    if hook is not None:
        hook(server)


def _start_server(
    stack: contextlib.ExitStack, ctx: CommandContext, point: str, *, answer: bool
) -> ProbeServer:
    server = ProbeServer(point, answer=answer)
    stack.callback(_stop_server, ctx, server)
    _announce(server)
    return server


def _stop_server(ctx: CommandContext, server: ProbeServer) -> None:
    stuck = server.stop()
    if stuck:
        ctx.write(
            f"probe {server.point}: server threads still running after {JOIN_BOUND:g} s:"
            f" {', '.join(stuck)}\n",
            "stderr",
        )


def _report_close(ctx: CommandContext, server: ProbeServer, client: _ProbeClient) -> None:
    """After a cut of a request the server had, say when the server saw the client close."""
    cancelled_at = ctx.scope.cancelled_at
    if cancelled_at is None or not server.exchanges:
        return
    # After streamed tokens, start the line on a line of its own.
    newline = "\n" if client.streamed else ""
    head = f"{newline}probe {server.point}: the server"
    if not server.wait_for(lambda: server.open_exchanges == 0, CLOSE_BOUND):
        ctx.write(
            f"{head} still had the request open {CLOSE_BOUND:g} s after the cancel\n", "stderr"
        )
    elif server.peer_closes:
        ms = (server.peer_closes[-1] - cancelled_at) * 1000
        ctx.write(f"{head} saw the close {ms:.1f} ms after the cancel\n")


def _wants_delegate(body: dict[str, Any]) -> bool:
    """A request that offers ``delegate`` and has no tool result yet: the parent's first turn."""
    tools = body.get("tools") or []
    offers = any(
        isinstance(t, dict) and (t.get("function") or {}).get("name") == "delegate" for t in tools
    )
    messages = body.get("messages") or []
    answered = any(isinstance(m, dict) and m.get("role") == "tool" for m in messages)
    return offers and not answered


def _recv(conn: socket.socket) -> bytes:
    try:
        return conn.recv(65536)
    except OSError:
        return b""


def _send(conn: socket.socket, data: bytes) -> bool:
    try:
        conn.sendall(data)
    except OSError:
        return False
    return True


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    event = f"data: {data}\n\n".encode()
    return f"{len(event):x}\r\n".encode() + event + b"\r\n"  # one HTTP chunk


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "probe",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "probe",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
)
_TOKEN_CHUNK = _sse(_chunk({"content": "tick "}))
_DELEGATE_CALL = {
    "index": 0,
    "id": "call_probe",
    "type": "function",
    "function": {
        "name": "delegate",
        "arguments": json.dumps({"task": "Stream an answer that never ends."}),
    },
}
_DELEGATE_RESPONSE = (
    _STREAM_HEAD
    + _sse(_chunk({"role": "assistant", "content": None, "tool_calls": [_DELEGATE_CALL]}))
    + _sse(_chunk({}, "tool_calls"))
    + _sse("[DONE]")
    + b"0\r\n\r\n"
)
