"""One ``/api/console`` WebSocket connection: frames in, the runner's news out.

A ``Connection`` is the ``CommandSink`` of its commands. The runner calls it on
the event loop; frames go out through one queue and one sender task, so they
leave in the order they were decided (``accepted`` before ``started`` before
``output`` before ``complete``). Closing the connection, cleanly or not,
cancels each of its commands with reason "disconnect"; their ``complete``
frames then have nowhere to go and are dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from starlette.websockets import WebSocket

from wirecut import __version__
from wirecut.console.commands import Session, Stream
from wirecut.console.runner import CommandRecord, CommandState, CompleteFacts, Runner
from wirecut.console.server._frames import Cancel, Confirm, FrameError, Ping, Run, parse_frame

__all__ = ["MAX_LIVE_COMMANDS", "PROMPT", "Connection"]

_log = logging.getLogger("wirecut.console")

PROMPT = "wirecut> "
#: Commands one connection may have accepted and not completed at once.
MAX_LIVE_COMMANDS = 256


class Connection:
    """The server side of one console connection. Event loop only."""

    def __init__(self, websocket: WebSocket, runner: Runner) -> None:
        self.websocket = websocket
        self.runner = runner
        self.session = Session(jobs=self._jobs_threadsafe)
        self._commands: dict[str, CommandRecord] = {}  # live ones, by the client's id
        self._outbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._sender: asyncio.Task[None] | None = None
        self.closed = False

    async def serve(self) -> None:
        """Run the connection until the client leaves; then cancel what it left running."""
        self._sender = asyncio.get_running_loop().create_task(self._send_loop())
        self.send({"type": "ready", "version": __version__, "prompt": PROMPT})
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:
                    self.error("binary frames are not supported: send JSON text frames")
                    continue
                self.handle(text)
        finally:
            self.closed = True
            for command in list(self._commands.values()):
                self.runner.cancel(command, "disconnect")
            self._outbox.put_nowait(None)

    async def drain(self) -> None:
        """Wait until every frame queued so far was sent, then stop the sender.

        Bound it from outside (``asyncio.timeout``): a client that stopped
        reading would hold it.
        """
        self._outbox.put_nowait(None)
        if self._sender is not None:
            await asyncio.shield(self._sender)

    # -- frames in -------------------------------------------------------------------

    def handle(self, text: str) -> None:
        try:
            frame = parse_frame(text)
        except FrameError as exc:
            self.error(str(exc), exc.id)
            return
        if isinstance(frame, Ping):
            self.send({"type": "pong"})
        elif isinstance(frame, Run):
            self._run(frame)
        elif isinstance(frame, Cancel):
            self._cancel(frame)
        elif isinstance(frame, Confirm):
            self._confirm(frame)

    def _run(self, frame: Run) -> None:
        id = frame.id if frame.id is not None else self.runner.new_id()
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
        self.send({"type": "accepted", "id": id, "queued": queued})

    def _cancel(self, frame: Cancel) -> None:
        if frame.id is None:
            for command in list(self._commands.values()):
                self.runner.cancel(command, "user")
            return
        found = self._commands.get(frame.id)
        if found is None:
            self.error(f"no live command with id {frame.id!r}", frame.id)
            return
        self.runner.cancel(found, "user")

    def _confirm(self, frame: Confirm) -> None:
        command = self._commands.get(frame.id)
        if command is None:
            self.error(f"no live command with id {frame.id!r}", frame.id)
        elif not self.runner.confirm(command):
            self.error(f"command {frame.id!r} is not waiting for a confirmation", frame.id)

    # -- CommandSink (the runner's news) --------------------------------------------------

    def started(self, command: CommandRecord) -> None:
        self.send({"type": "started", "id": command.id})

    def output(self, command: CommandRecord, stream: Stream, data: str) -> None:
        self.send({"type": "output", "id": command.id, "stream": stream, "data": data})

    def confirm_required(self, command: CommandRecord, message: str) -> None:
        self.send({"type": "confirm_required", "id": command.id, "message": message})

    def complete(self, command: CommandRecord, facts: CompleteFacts) -> None:
        if self._commands.get(command.id) is command:
            del self._commands[command.id]
        self.send({"type": "complete", "id": command.id, **facts.to_wire()})

    # -- frames out ----------------------------------------------------------------------

    def error(self, message: str, id: str | None = None) -> None:
        self.send({"type": "error", "id": id, "message": message})

    def send(self, frame: dict[str, Any]) -> None:
        if not self.closed:
            self._outbox.put_nowait(frame)

    async def _send_loop(self) -> None:
        while True:
            frame = await self._outbox.get()
            if frame is None:
                return
            try:
                await self.websocket.send_text(json.dumps(frame))
            except Exception:  # The client left: the receive side sees it and cleans up.
                _log.debug("dropping a frame for a closed connection", exc_info=True)
                return

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
