"""Running one line at a time on a link: its frames shown, Ctrl+C turned into a cancel.

``TerminalSession.run(line)`` submits the line and follows its frames until
its ``complete``, which it returns. ``interrupt()`` is what Ctrl+C does while
a line runs (the caller wires it to SIGINT and to the Ctrl+C key): the first
sends ``cancel`` for that id; the second says the cancel is on its way; the
third leaves without waiting, by closing the connection (which cancels the
command on the server too). A ``confirm_required`` is shown as it is and put
to the ``Asker``; "no" sends a cancel for that id.

No Ctrl+C is lost, however early it comes: one pressed while the run frame
is still on its way (the id not yet the session's) is held and acted on the
moment ``submit`` returns, and one that came before ``run`` was even called
(between the Enter and the REPL's next step) is handed over with
``hold_interrupt``. The server reads a connection's frames in order, so a
``cancel`` sent after the ``run`` always finds its command, queued or not.

Event loop only: ``run`` and ``interrupt`` run on the loop that owns the link
(``interrupt`` from ``loop.add_signal_handler``, never from a raw signal
handler, since it sends frames).

Cancellation: cancelling the task that awaits ``run`` stops following the
command but sends nothing; the server keeps running it until this client
cancels it or closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from wirecut.client._link import CommandChannel, Link, LinkError
from wirecut.client._render import Renderer
from wirecut.record import CompleteFacts, Frame, LifecycleFacts, Reason, Status, UsageFacts

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "QUESTION",
    "Asker",
    "LineState",
    "TerminalSession",
    "exit_code",
]

#: ``wirecut console -c`` exit codes, by the command's status (docs/protocol.md).
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_TIMEOUT = 124
EXIT_CANCELLED = 130

#: The y/N question under a ``confirm_required`` message.
QUESTION = "go ahead?"

_EXIT_CODES = {"ok": EXIT_OK, "error": EXIT_ERROR, "timeout": EXIT_TIMEOUT}


def exit_code(status: object) -> int:
    """The exit code for a command that completed with ``status``."""
    if status == "cancelled":
        return EXIT_CANCELLED
    return _EXIT_CODES.get(str(status), EXIT_ERROR)


class LineState(enum.Enum):
    """Where the session is with its current line."""

    IDLE = "idle"  # no line: Ctrl+C is not the session's (the caller decides)
    SUBMITTING = "submitting"  # the run frame is on its way: Ctrl+C is held
    FOLLOWING = "following"  # the id is known: Ctrl+C acts on it at once


class Asker(Protocol):
    """Puts a yes/no question to the user."""

    async def ask(self, message: str) -> bool:
        """True only for an explicit yes; Ctrl+C, Ctrl+D and anything else are no."""
        ...

    @property
    def asking(self) -> bool:
        """True while the question is on the screen (``abort`` then ends it)."""
        ...

    def abort(self) -> None:
        """End the question on the screen with "no" (the command ended, or SIGINT came)."""
        ...


class TerminalSession:
    """Runs lines one at a time on ``link`` and shows them with ``renderer``. Event loop only.

    ``asker`` None: nobody to ask (stdin is not a terminal), so every
    ``confirm_required`` is declined with a note saying how to run it anyway.
    ``on_output`` sees every output frame's line and data (the REPL learns
    command names from ``help``).
    """

    def __init__(
        self,
        link: Link,
        renderer: Renderer,
        asker: Asker | None,
        *,
        on_output: Callable[[str, str], None] = lambda line, data: None,
    ) -> None:
        self.link = link
        self.renderer = renderer
        self.asker = asker
        self.on_output = on_output
        #: True once a third Ctrl+C closed the connection without waiting.
        self.abandoned = False
        self.state = LineState.IDLE
        self._current: CommandChannel | None = None
        #: Ctrl+C presses that came before the line's id was known.
        self._held = 0
        #: The open question's task (a ``confirm_required`` being asked).
        self._question: asyncio.Task[bool] | None = None
        self._interrupts = 0
        self._tasks: set[asyncio.Task[None]] = set()
        link.on_stray = self._stray

    async def run(self, line: str) -> CompleteFacts:
        """Submit ``line`` and show it until its ``complete``, whose record is returned.

        A run the server refused (an ``error`` frame instead of ``accepted``)
        returns a record of status "error" made here; a command left without
        waiting (the third Ctrl+C), one of status "cancelled" whose facts are
        unknown. Raises ``LinkError`` when the connection is lost first, or
        the server's ``complete`` is not one.
        """
        self._interrupts = 0
        self.state = LineState.SUBMITTING
        try:
            channel = await self.link.submit(line)
        except BaseException:
            self.state = LineState.IDLE
            self._held = 0
            raise
        self._current = channel
        self.state = LineState.FOLLOWING
        held, self._held = self._held, 0
        for _ in range(held):
            self.interrupt()
        try:
            return await self._follow(channel)
        finally:
            self._current = None
            self.state = LineState.IDLE
            self.renderer.finish()

    def hold_interrupt(self) -> None:
        """A Ctrl+C that came after the Enter but before ``run``: acted on once the id is known.

        The caller drops it with ``drop_held`` if no line follows (an empty line).
        """
        self._held += 1

    def drop_held(self) -> None:
        """Forget held Ctrl+C presses (the prompt is back: they belonged to no command)."""
        self._held = 0

    def interrupt(self) -> bool:
        """Ctrl+C: cancel the running line (see the module docstring); False if none runs.

        While the run frame is still on its way the press is held (True): it
        is acted on as soon as the id is known.
        """
        if self.state is LineState.IDLE:
            return False
        channel = self._current
        if channel is None:
            self._held += 1
            return True
        if self._question is not None:
            self._end_question()  # Answers "no", which cancels.
            return True
        self._interrupts += 1
        if channel.cancel_sent_at is None:
            self._cancel(channel)
        elif self._interrupts == 2:
            self.renderer.warn(
                "cancel sent; waiting for the server to report the unwind "
                "(Ctrl+C again leaves without waiting)"
            )
        else:
            self.abandoned = True
            self._spawn(self.link.aclose())
        return True

    # -- following one command -----------------------------------------------------------

    async def _follow(self, channel: CommandChannel) -> CompleteFacts:
        loop = asyncio.get_running_loop()
        submitted = loop.time()
        held: list[Frame] = []  # frames that came while a question was open
        next_frame: asyncio.Task[Frame] | None = None
        try:
            while True:
                if next_frame is None:
                    next_frame = loop.create_task(channel.next())
                waiting: set[asyncio.Future[Any]] = {next_frame}
                if self._question is not None:
                    waiting.add(self._question)
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                question = self._question
                if question is not None and question in done:
                    self._question = None
                    yes = not question.cancelled() and question.exception() is None
                    await self._answer(channel, yes and question.result())
                    for frame in held:
                        self._show(channel, frame)
                    held.clear()
                    continue
                if next_frame not in done:
                    continue
                try:
                    frame = next_frame.result()
                except LinkError as exc:
                    if self.abandoned:
                        self.renderer.warn(
                            "left without the server's report; closing the connection "
                            "cancelled the command on the server"
                        )
                        return _abandoned((loop.time() - submitted) * 1000)
                    raise LinkError(f"{exc} while `{channel.line}` ran") from None
                next_frame = None
                kind = frame.get("type")
                if question is not None:
                    if kind != "complete":
                        held.append(frame)
                        continue
                    # The command ended (its timeout, a shutdown) while the question was open.
                    await self._close_question()
                    for early in held:
                        self._show(channel, early)
                    held.clear()
                if kind == "confirm_required":
                    self._ask(channel, str(frame.get("message") or "confirm?"))
                    continue
                if kind == "complete":
                    facts = _complete_facts(frame, channel)
                    self.renderer.complete(facts)
                    return facts
                if kind == "error" and not channel.accepted:
                    refused = CompleteFacts.failed(str(frame.get("message")), elapsed_ms=0.0)
                    self.renderer.complete(refused)
                    return refused
                self._show(channel, frame)
        finally:
            if next_frame is not None and not next_frame.done():
                next_frame.cancel()
            await self._close_question()

    def _show(self, channel: CommandChannel, frame: Frame) -> None:
        kind = frame.get("type")
        if kind == "accepted" and frame.get("queued"):
            self.renderer.note("queued: every worker is busy; it starts when one is free")
        elif kind == "started":
            self.renderer.started(channel.line, asyncio.get_running_loop())
        elif kind == "output":
            data = str(frame.get("data", ""))
            self.renderer.output(str(frame.get("stream", "stdout")), data)
            self.on_output(channel.line, data)
        elif kind == "error":
            self.renderer.warn(f"server: {frame.get('message')}")

    def _stray(self, frame: Frame) -> None:
        if frame.get("type") != "error":
            return  # a pong, or a frame a newer server may add
        # An error about one of our commands that already completed (named in
        # "ref"; a server without "ref" kept it in "id") is our Ctrl+C or
        # answer crossing its complete on the wire: the command's end is on
        # the screen already, and the race is normal, not news. Any other
        # error is shown.
        about = frame.get("id") or frame.get("ref")
        if self.link.finished(about):
            return
        self.renderer.warn(f"server: {frame.get('message')}")

    def _ask(self, channel: CommandChannel, message: str) -> None:
        # The message may be a plan of many lines (a table): printed as it
        # is, and the question under it stays one short line.
        self.renderer.question(message)
        if self.asker is None:
            self.renderer.warn(
                "not confirmed: there is no terminal to ask on "
                "(add --yes to the command to run it without asking)"
            )
            self._cancel(channel)
            return
        self._question = asyncio.get_running_loop().create_task(self.asker.ask(QUESTION))

    def _end_question(self) -> None:
        """Make the open question end with "no", whether or not it is on the screen yet."""
        question = self._question
        if question is None or question.done():
            return
        assert self.asker is not None
        if self.asker.asking:
            self.asker.abort()
        else:
            question.cancel()  # Not started yet: it never shows.

    async def _close_question(self) -> None:
        question = self._question
        if question is None:
            return
        self._end_question()
        self._question = None
        # wait() rather than await: the question's own end (cancelled, "no") is not an error.
        await asyncio.wait({question})

    async def _answer(self, channel: CommandChannel, yes: bool) -> None:
        if yes:
            await self.link.confirm(channel.id)
            self.renderer.started(channel.line, asyncio.get_running_loop())
        else:
            self.renderer.note("not confirmed: cancelling")
            self._cancel(channel)

    def _cancel(self, channel: CommandChannel) -> None:
        channel.cancel_sent_at = asyncio.get_running_loop().time()
        self.renderer.cancelling()
        self._spawn(self.link.cancel(channel.id))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        async def quietly() -> None:
            # A lost connection is reported by the link's reader, once.
            with contextlib.suppress(LinkError):
                await work

        task = asyncio.get_running_loop().create_task(quietly())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _complete_facts(frame: Frame, channel: CommandChannel) -> CompleteFacts:
    """The record of a ``complete`` frame; ``LinkError`` (one line) if it is not one."""
    try:
        return CompleteFacts.from_wire(frame)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise LinkError(
            f"the server's complete for `{channel.line}` is not one ({type(exc).__name__}: {exc})"
        ) from None


def _abandoned(elapsed_ms: float) -> CompleteFacts:
    """A command this client left without waiting: cancelled by its user; nothing else is known."""
    return CompleteFacts(
        Status.CANCELLED,
        None,
        elapsed_ms,
        Reason.USER,
        UsageFacts(None, None, None),
        LifecycleFacts.unknown(),
    )
