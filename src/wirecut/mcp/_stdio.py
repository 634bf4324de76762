"""The stdio transport of ``McpClient``: the server's process started by ``scope.popen``.

The SDK's own ``stdio_client`` starts the server with ``anyio.open_process``,
which no scope knows of. Here the process is a ``ScopedPopen`` of the client's
scope: its own process group, counted by the scope's ledger, killed with
everything it started when the client closes (or by the reaper, if this
process dies first). The pipes are read and written on the client's asyncio
loop; what comes out of stdout is held to MCP's rules, and the first breach
ends the connection with a reason (``Breach``) that the client reports.

Used on the client's event loop only.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage
from mcp_types import jsonrpc_message_adapter
from pydantic import ValidationError

from wirecut.scope import InterruptScope, ScopedPopen

__all__ = ["Breach", "StdioStreams", "scoped_stdio"]

#: How long a server has to exit by itself once its stdin is closed (the
#: lifecycle's shutdown) before its process group is killed.
EXIT_GRACE = 2.0
#: How long the kill of a server that did not exit may take (SIGTERM, then
#: SIGKILL after the scope's grace, then the reap).
KILL_BOUND = 5.0
#: How many of the server's last stderr lines are kept for an error message.
STDERR_LINES = 20
#: The longest stderr line kept.
STDERR_LINE_CHARS = 400

StdioStreams = tuple[
    MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]
]


@dataclass
class Breach:
    """Why the connection ended, as far as the transport knows (read on the loop)."""

    #: What was wrong, one line; None while nothing was.
    problem: str | None = None
    #: The server's process id, once it started.
    pid: int | None = None
    #: The server's exit code once it exited.
    exit_code: int | None = None
    #: The last lines the server wrote to stderr.
    stderr: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=STDERR_LINES)
    )
    #: Set once the server's stdout ended (it exited, or broke a rule).
    ended: anyio.Event = field(default_factory=anyio.Event)

    def note(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem


@contextlib.asynccontextmanager
async def scoped_stdio(
    argv: Sequence[str],
    *,
    scope: InterruptScope,
    env: Mapping[str, str] | None,
    cwd: str | None,
    max_message_bytes: int,
    breach: Breach,
) -> AsyncIterator[StdioStreams]:
    """Start ``argv`` under ``scope`` and yield the SDK's (read, write) streams to it.

    The environment is the SDK's safe default (``PATH``, ``HOME`` ...) and
    ``env`` over it, as the SDK's ``stdio_client`` does. Raises ``OSError``
    when the process cannot start.

    Cancellation: leaving closes the server's stdin, gives it ``EXIT_GRACE``
    seconds to exit, then cancels ``scope`` (SIGTERM to the group, SIGKILL
    after the grace) and reaps it; every wait is bounded and shielded.
    """
    loop = asyncio.get_running_loop()
    popen: ScopedPopen = scope.popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**get_default_environment(), **(env or {})},
        cwd=cwd,
    )
    breach.pid = popen.pid
    assert popen.stdin is not None
    assert popen.stdout is not None
    assert popen.stderr is not None
    transports: list[asyncio.BaseTransport] = []
    try:
        # One byte over the bound, so that a message of exactly the bound
        # (and its newline) still fits.
        stdout = asyncio.StreamReader(limit=max_message_bytes + 1)
        stdout_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stdout), popen.stdout
        )
        transports.append(stdout_transport)
        stderr = asyncio.StreamReader(limit=1 << 16)
        stderr_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stderr), popen.stderr
        )
        transports.append(stderr_transport)
        # A StreamReaderProtocol is the documented way to get drain() on a pipe.
        write_transport, write_protocol = await loop.connect_write_pipe(
            lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), popen.stdin
        )
        transports.append(write_transport)
        stdin = asyncio.StreamWriter(write_transport, write_protocol, None, loop)
    except BaseException:
        for transport in transports:
            transport.close()
        await _stop(popen, scope, breach)
        raise

    read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_stdout() -> None:
        try:
            await _read_messages()
        finally:
            breach.ended.set()

    async def _read_messages() -> None:
        async with read_send:
            while True:
                try:
                    line = await stdout.readuntil(b"\n")
                except asyncio.IncompleteReadError as eof:
                    if eof.partial.strip():
                        breach.note(f"wrote an unfinished line on stdout: {_sample(eof.partial)}")
                    return
                except asyncio.LimitOverrunError:
                    breach.note(f"sent a message over {max_message_bytes} bytes")
                    return
                if not line.strip():
                    continue
                try:
                    message = jsonrpc_message_adapter.validate_json(line, by_name=False)
                except (ValidationError, ValueError):
                    breach.note(f"wrote something that is not MCP on stdout: {_sample(line)}")
                    return
                try:
                    await read_send.send(SessionMessage(message))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return

    async def read_stderr() -> None:
        while True:
            try:
                line = await stderr.readline()
            except ValueError:  # A line over the reader's limit: keep going past it.
                continue
            if not line:
                return
            text = line.decode(errors="replace").rstrip()
            if text:
                breach.stderr.append(text[:STDERR_LINE_CHARS])

    async def write_stdin() -> None:
        try:
            async with write_receive:
                async for message in write_receive:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    stdin.write(data.encode() + b"\n")
                    await stdin.drain()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            breach.note("stopped reading its stdin")
            await read_send.aclose()  # Pending requests end instead of waiting forever.

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read_stdout)
            tasks.start_soon(read_stderr)
            tasks.start_soon(write_stdin)
            try:
                yield read_receive, write_send
            finally:
                tasks.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            stdin.close()  # The lifecycle's shutdown: the server sees EOF on stdin.
            await _stop(popen, scope, breach)
            for transport in transports:
                transport.close()
            await read_receive.aclose()
            await write_send.aclose()


async def _stop(popen: ScopedPopen, scope: InterruptScope, breach: Breach) -> None:
    """Let the server exit within the grace, then kill its group; reap it (bounded)."""
    try:
        # A ScopedPopen's wait ends its registration and kills what is left
        # of its group once the leader exited.
        await anyio.to_thread.run_sync(popen.wait, EXIT_GRACE)
    except subprocess.TimeoutExpired:
        scope.cancel("closed")  # SIGTERM to its group, SIGKILL after the grace.
        await anyio.to_thread.run_sync(scope.wait_quiescent, KILL_BOUND)
        with contextlib.suppress(subprocess.TimeoutExpired):
            await anyio.to_thread.run_sync(popen.wait, KILL_BOUND)
    breach.exit_code = popen.returncode


def _sample(data: bytes) -> str:
    text = data.decode(errors="replace").strip()
    return repr(text[:80] + ("..." if len(text) > 80 else ""))
