"""One ``/api/console`` WebSocket connection: frames in, the runner's news out.

A ``Connection`` is the ``CommandSink`` of its commands. The runner calls it on
the event loop; frames go out through one queue and one sender task, so they
leave in the order they were decided (``accepted`` before ``started`` before
``output`` before ``complete``). Closing the connection, cleanly or not,
cancels each of its commands with reason "disconnect"; their ``complete``
frames then have nowhere to go and are dropped.

The queue is bounded in bytes (``max_outbox``): a client that sends and never
reads (a ping flood, a thousand ``memory list``) made the server hold every
answer, hundreds of MiB. Past the bound, while the socket's transport is
paused (the client took nothing of what was written lately), the connection
is closed with code 4429 and its commands are cancelled with reason
"disconnect", as if it had left. While the transport is writable, what is
queued goes at the sender's next turn however much it is: a burst of output
coalesced into one large frame, and the frames right behind it, are no slow
reader (a client reading at full speed was closed for one). The close frame
waits at most ``close_timeout`` for room in the socket, then the transport is
cut (a client that does not read would not see it anyway). Its commands are
not slowed down instead: a worker that blocks on a client's socket holds a
worker of every other client too.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from starlette.websockets import WebSocket

from wirecut import __version__, record
from wirecut.console.commands import Session, Stream
from wirecut.console.runner import CommandRecord, CommandState, Runner
from wirecut.record import CompleteFacts
from wirecut.serving import TRANSPORT_EXTENSION

__all__ = ["FRAME_OVERHEAD", "MAX_LIVE_COMMANDS", "PROMPT", "Connection"]

_log = logging.getLogger("wirecut.console")

PROMPT = record.DEFAULT_PROMPT
#: Commands one connection may have accepted and not completed at once.
MAX_LIVE_COMMANDS = 256
#: What a queued frame costs besides its characters (the str object, the queue slot).
FRAME_OVERHEAD = 64


class Connection:
    """The server side of one console connection. Event loop only."""

    def __init__(
        self,
        websocket: WebSocket,
        runner: Runner,
        *,
        max_outbox: int = 4 * 1024 * 1024,
        close_timeout: float = 5.0,
        on_slow_reader: Callable[[], None] = lambda: None,
    ) -> None:
        self.websocket = websocket
        self.runner = runner
        self.session = Session(jobs=self._jobs_threadsafe)
        self.max_outbox = max_outbox
        self.close_timeout = close_timeout
        self._on_slow_reader = on_slow_reader
        self._commands: dict[str, CommandRecord] = {}  # live ones, by the client's id
        self._outbox: asyncio.Queue[str | None] = asyncio.Queue()
        #: Bytes of the frames queued and not yet sent (each counted with FRAME_OVERHEAD).
        self.outbox_bytes = 0
        self._loop = asyncio.get_running_loop()
        self._sender: asyncio.Task[None] | None = None
        self._closer: asyncio.Task[None] | None = None
        self.closed = False
        #: True once the connection was closed for not reading (4429).
        self.slow_reader = False

    async def serve(self) -> None:
        """Run the connection until the client leaves; then cancel what it left running."""
        self._sender = asyncio.get_running_loop().create_task(self._send_loop())
        self.send(record.ready_frame(__version__, PROMPT))
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:
                    self.error("binary frames are not supported: send JSON text frames")
                    continue
                try:
                    self.handle(text)
                except Exception:
                    # A bug of ours must not take the connection and its
                    # commands down with it: the client hears of it, and the log.
                    _log.exception("handling a frame failed")
                    self.error("the server failed to handle this frame (see its log)")
        finally:
            self.closed = True
            self.runner.cancel_all(self._commands.values(), "disconnect")
            self._outbox.put_nowait(None)
            if self._closer is not None:
                await asyncio.shield(self._closer)

    async def drain(self) -> None:
        """Wait until every frame queued so far was sent, then stop the sender.

        Bound it from outside (``asyncio.timeout``): a client that stopped
        reading would hold it.
        """
        self._outbox.put_nowait(None)
        if self._sender is not None:
            # wait(), not the task itself: a sender cancelled for a slow
            # reader must not cancel the drain of every other connection.
            await asyncio.wait({self._sender})

    # -- frames in -------------------------------------------------------------------

    def handle(self, text: str) -> None:
        try:
            frame = record.parse_frame(text)
        except record.FrameError as exc:
            # A run frame's error is its refusal and carries its id; an id of
            # a cancel or confirm is named only while live (after its
            # complete, nothing more carries it).
            if exc.id is not None and exc.kind != "run" and exc.id not in self._commands:
                self._not_live(str(exc), exc.id)
            else:
                self.error(str(exc), exc.id)
            return
        if isinstance(frame, record.PingFrame):
            self.send(record.pong_frame())
        elif isinstance(frame, record.RunFrame):
            self._run(frame)
        elif isinstance(frame, record.CancelFrame):
            self._cancel(frame)
        elif isinstance(frame, record.ConfirmFrame):
            self._confirm(frame)

    def _run(self, frame: record.RunFrame) -> None:
        if frame.id is not None:
            id = frame.id
        else:
            id = self.runner.new_id()
            while id in self._commands:  # the client chose it: take the next one
                id = self.runner.new_id()
        if id in self._commands:
            self.error(f"id {id!r} is already live on this connection", id)
            return
        if len(self._commands) >= MAX_LIVE_COMMANDS:
            self.error(
                f"too many live commands on this connection (at most {MAX_LIVE_COMMANDS})", id
            )
            return
        queued = self.runner.saturated
        try:
            command = self.runner.submit(id, frame.line, self.session, self, timeout=frame.timeout)
        except RuntimeError as exc:  # shutting down
            self.error(str(exc), id)
            return
        self._commands[id] = command
        self.send(record.accepted_frame(id, queued))

    def _cancel(self, frame: record.CancelFrame) -> None:
        if frame.id is None:
            self.runner.cancel_all(self._commands.values(), "user")
            return
        found = self._commands.get(frame.id)
        if found is None:
            self._not_live(f"no live command with id {frame.id!r}", frame.id)
            return
        self.runner.cancel(found, "user")

    def _confirm(self, frame: record.ConfirmFrame) -> None:
        command = self._commands.get(frame.id)
        if command is None:
            self._not_live(f"no live command with id {frame.id!r}", frame.id)
        elif not self.runner.confirm(command):
            self.error(f"command {frame.id!r} is not waiting for a confirmation", frame.id)

    # -- CommandSink (the runner's news) --------------------------------------------------

    def started(self, command: CommandRecord) -> None:
        self.send(record.started_frame(command.id))

    def output(self, command: CommandRecord, stream: Stream, data: str) -> None:
        self.send(record.output_frame(command.id, stream, data))

    def confirm_required(self, command: CommandRecord, message: str) -> None:
        self.send(record.confirm_required_frame(command.id, message))

    def complete(self, command: CommandRecord, facts: CompleteFacts) -> None:
        if self._commands.get(command.id) is command:
            del self._commands[command.id]
        self.send(record.complete_frame(command.id, facts))

    # -- frames out ----------------------------------------------------------------------

    def error(self, message: str, id: str | None = None) -> None:
        self.send(record.error_frame(message, id))

    def _not_live(self, message: str, id: str) -> None:
        # `complete` is the last frame for an id: an error about an id that
        # is not live (completed, or never run) carries "id": null, and the
        # id in its message and in "ref" (docs/protocol.md).
        if repr(id) not in message:
            message = f"{message} (id {id!r} is not live)"
        self.send(record.error_frame(message, ref=id))

    def send(self, frame: dict[str, Any]) -> None:
        if self.closed:
            return
        text = json.dumps(frame)
        cost = len(text) + FRAME_OVERHEAD
        # A frame alone always goes (one large output is not a slow reader),
        # and so does any while the client is taking what was written.
        if (
            self.outbox_bytes
            and self.outbox_bytes + cost > self.max_outbox
            and not self._transport_writable()
        ):
            self._slow_reader()
            return
        self.outbox_bytes += cost
        self._outbox.put_nowait(text)

    def _transport_writable(self) -> bool:
        """True while the socket's transport takes writes (the client reads); False if unknown."""
        extension = self.websocket.scope.get("extensions", {}).get(TRANSPORT_EXTENSION)
        writable = None if extension is None else extension.get("writable")
        return bool(writable()) if writable is not None else False

    def _slow_reader(self) -> None:
        """The client let more than ``max_outbox`` bytes wait: close 4429, as if it had left."""
        self.closed = True
        self.slow_reader = True
        self._on_slow_reader()
        _log.warning(
            "closing a console connection that does not read its frames "
            "(%d bytes waiting, at most %d)",
            self.outbox_bytes,
            self.max_outbox,
        )
        self._closer = self._loop.create_task(self._close_slow_reader())

    async def _close_slow_reader(self) -> None:
        # Called back from the runner (output, complete): cancel from a task of its own.
        self.runner.cancel_all(self._commands.values(), "disconnect")
        if self._sender is not None:
            self._sender.cancel()
        while not self._outbox.empty():  # what waited is dropped with the connection
            self._outbox.get_nowait()
        self.outbox_bytes = 0
        try:
            async with asyncio.timeout(self.close_timeout):
                await self.websocket.close(
                    record.CLOSE_SLOW_READER,
                    f"this client did not read its frames (more than {self.max_outbox} bytes "
                    "waited); its commands were cancelled",
                )
            return
        except TimeoutError:
            pass  # No room for even the close frame: the client reads nothing.
        except Exception:  # It left meanwhile.
            _log.debug("closing a slow reader failed", exc_info=True)
            return
        extension = self.websocket.scope.get("extensions", {}).get(TRANSPORT_EXTENSION)
        if extension is not None:
            extension["abort"]()

    async def _send_loop(self) -> None:
        while True:
            text = await self._outbox.get()
            if text is None:
                return
            try:
                await self.websocket.send_text(text)
            except Exception:  # The client left: the receive side sees it and cleans up.
                _log.debug("dropping a frame for a closed connection", exc_info=True)
                return
            finally:
                self.outbox_bytes = max(0, self.outbox_bytes - len(text) - FRAME_OVERHEAD)

    def _jobs_threadsafe(self) -> list[tuple[str, str, str, float]]:
        # Called by the `jobs` command on a worker thread: read on the loop.
        future = asyncio.run_coroutine_threadsafe(self._jobs(), self._loop)
        return future.result(timeout=5)

    async def _jobs(self) -> list[tuple[str, str, str, float]]:
        return [
            (c.id, c.line, _job_state(c), c.elapsed_ms)
            for c in sorted(self._commands.values(), key=lambda c: c.accepted_at)
        ]


def _job_state(command: CommandRecord) -> str:
    state = command.state
    if state is CommandState.QUEUED:
        return "queued"
    if state is CommandState.UNWINDING:
        return "cancelling"
    return "running"
