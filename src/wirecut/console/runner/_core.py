"""``RunnerCore``: what every runner of console commands shares, wherever the work runs.

httpx's ``BaseClient`` under ``Client`` and ``AsyncClient`` is the model: the
contract (``_contract.Runner``) is kept here once, and what differs, where a
command's work runs, is a ``Placement``: this machine's worker threads
(``_runner.ThreadPlacement``) or a cluster's command hosts
(``wirecut.console.cluster``). The core owns, for every placement:

- the records (``CommandRecord``) from ``submit`` to their one ``complete``, the
  lifecycle events the core itself fires (CANCEL, DROP, REJECT), and the
  ids of runs that came without one;
- the cancel: first reason wins; the placement cuts at once and says whether
  the work never ran (then DROP, and the command completes ``started: false``);
- the timeout, armed when the work started;
- the driver task of each command, which awaits the placement's ``settle``
  (the unwind rule lives there) and sends the ``complete`` it returns, once,
  with the output flushed before it and dropped after it;
- the observer (metrics) and the shutdown.

Everything here runs on the event loop the core was started on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, Self, TypeVar

from wirecut.console._limits import RunnerLimits
from wirecut.console.commands import (
    Command,
    CommandContext,
    CommandError,
    CommandSet,
    Session,
)
from wirecut.console.runner._contract import CommandSink, RunnerObserver
from wirecut.console.runner._lifecycle import CommandEvent, CommandLifecycle, CommandState
from wirecut.console.runner._output import OutputBuffer, OutputFlusher, call_soon
from wirecut.record import CompleteFacts, LifecycleFacts, Reason

__all__ = [
    "Accepted",
    "CommandRecord",
    "Placement",
    "Reporter",
    "RunnerCore",
    "RunnerLimits",
    "Work",
    "call_soon",
]

_log = logging.getLogger("wirecut.console")

#: What a command runs: a parsed line (the command and its words), or a
#: callable run under the command's scope (a cluster host's model request).
Work = tuple[Command, list[str]] | Callable[[CommandContext], Any]


@dataclass(frozen=True)
class Accepted:
    """What the core accepted for a placement: the command, and where its news goes."""

    id: str
    line: str
    work: Work
    session: Session
    sink: CommandSink
    #: Seconds of running time (the run frame's ``timeout``, capped by the runner's).
    timeout: float


@dataclass(eq=False, kw_only=True)
class CommandRecord:
    """The core's record of one accepted command (read it; only runners change it).

    A placement extends it with what its own work needs (``LocalCommand``,
    ``RemoteCommand``).
    """

    id: str
    line: str
    session: Session
    sink: CommandSink
    lifecycle: CommandLifecycle
    timeout: float
    placement: Placement[Any] | None = None
    accepted_at: float = field(default_factory=time.monotonic)
    output: OutputBuffer | None = None
    #: The first reason the runner cancelled it with (None: it was not cancelled).
    reason: Reason | None = None
    cancelled_at: float | None = None
    #: When its complete was decided (``time.monotonic()``).
    completed_at: float | None = None
    # Set on the loop when there is news for the driver: a cancel, or the work's end.
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    timeout_handle: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, accepted: Accepted, placement: Placement[Any] | None, **fields: Any) -> Self:
        """The record of ``accepted`` (a subclass passes its own ``fields``)."""
        return cls(
            id=accepted.id,
            line=accepted.line,
            session=accepted.session,
            sink=accepted.sink,
            lifecycle=CommandLifecycle(accepted.id),
            timeout=accepted.timeout,
            placement=placement,
            **fields,
        )

    @property
    def state(self) -> CommandState:
        return self.lifecycle.state

    @property
    def elapsed_ms(self) -> float:
        return (time.monotonic() - self.accepted_at) * 1000


class Reporter(Protocol):
    """What a placement tells its runner about a command's work; on the event loop."""

    def started(self, command: CommandRecord) -> None:
        """The work began (the ``started`` frame; the timeout starts now)."""

    def confirm_required(self, command: CommandRecord, message: str) -> None:
        """The work asks the client to confirm."""


#: The record a placement keeps of each command it runs.
R = TypeVar("R", bound=CommandRecord)


class Placement(Protocol[R]):
    """Where commands' work runs, and the record (``R``) it keeps of each. Event loop only."""

    def record(self, accepted: Accepted) -> R:
        """The record of a command accepted for this placement (not launched yet)."""

    def launch(self, command: R) -> None:
        """Start (or queue) the work of ``command``."""

    def cut(self, command: R, reason: Reason) -> None:
        """Cut the work's wires now (sockets, processes, a control message); nothing else.

        The first half of a cancel, and the only one on the hot path: a burst
        runs it for every command before any ``cancel``. Never blocks.
        """

    def cancel(self, command: R, reason: Reason) -> bool:
        """The rest of a cut command's cancel, never blocking; True if it never ran nor will."""

    def confirm(self, command: R) -> bool:
        """Pass on the client's confirmation; False if the work is not asking."""

    async def settle(self, command: R) -> CompleteFacts:
        """Wait until the work ended (by itself, or cut, within the unwind bound); its facts."""


class RunnerCore:
    """The ``Runner`` contract over one or more placements. Use from the event loop only.

    A subclass says where a line runs (``_route``) and adds its placements'
    health, saturation, start and stop. ``start()`` binds the core to the
    running loop; ``shutdown()`` cancels every command and returns once each
    has its ``complete``.
    """

    def __init__(
        self,
        commands: CommandSet,
        limits: RunnerLimits,
        *,
        observer: RunnerObserver | None = None,
    ) -> None:
        self.commands = commands
        self.limits = limits
        self.observer: RunnerObserver = observer or _NoObserver()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flusher: OutputFlusher | None = None  # made by start(), on the loop
        # Commands whose complete was not sent yet.
        self._commands: set[CommandRecord] = set()
        self._drivers: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._closing = False

    # -- for subclasses -------------------------------------------------------------------

    def _route(self, line: str) -> tuple[Placement[Any], Work]:
        """Where ``line`` runs and what it runs; ``CommandError`` if it does not parse."""
        raise NotImplementedError

    def _call_placement(self) -> Placement[Any]:
        """The placement of ``submit_call``'s callables."""
        raise NotImplementedError

    def _start_placements(self, loop: asyncio.AbstractEventLoop) -> None:
        raise NotImplementedError

    async def _stop_placements(self) -> None:
        raise NotImplementedError

    # -- the contract (event loop) ---------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the runner was started on."""
        if self._loop is None:
            raise RuntimeError(f"{type(self).__name__}.start() was not called from the event loop")
        return self._loop

    def start(self) -> None:
        """Bind to the running event loop (call from it, before the first submit)."""
        self._loop = asyncio.get_running_loop()
        self._flusher = OutputFlusher(self._loop)
        self._start_placements(self._loop)

    def new_id(self) -> str:
        """An id for a run frame that came without one."""
        return f"s{next(self._ids)}"

    def submit(
        self,
        id: str,
        line: str,
        session: Session,
        sink: CommandSink,
        *,
        timeout: float | None = None,
    ) -> CommandRecord:
        """Accept ``line`` as command ``id``; its news goes to ``sink``.

        ``timeout`` (seconds of running time) is capped by the command
        timeout. A line that does not parse is accepted too and completes at
        once with status "error" and its usage in ``error``.
        """
        self._check_open()
        limit = self._limit(timeout)
        try:
            placement, work = self._route(line)
        except CommandError as exc:
            return self._reject(id, line, session, sink, limit, str(exc))
        return self._accept(placement.record(Accepted(id, line, work, session, sink, limit)))

    def submit_call(
        self,
        id: str,
        fn: Callable[[CommandContext], Any],
        session: Session,
        sink: CommandSink,
        *,
        timeout: float | None = None,
        label: str = "",
    ) -> CommandRecord:
        """Accept ``fn(ctx)`` as command ``id``: a callable run like a command, under its scope.

        ``label`` stands for the line in ``jobs`` and logs. The value ``fn``
        returns is kept on the record (``LocalCommand.result``).
        """
        self._check_open()
        accepted = Accepted(id, label, fn, session, sink, self._limit(timeout))
        return self._accept(self._call_placement().record(accepted))

    def cancel(self, command: CommandRecord, reason: str) -> bool:
        """Cancel ``command`` with ``reason``; False if it was cancelled or decided already.

        The first reason wins. Never blocks: the placement's cut is shutdowns,
        signals or one control message, and the wait for the work happens in
        the command's driver task.
        """
        why = Reason(reason)
        if not self._claim(command, why):
            return False
        try:
            _placement(command).cut(command, why)
        finally:
            self._after_cut(command, why)
        return True

    def cancel_all(self, commands: Iterable[CommandRecord], reason: str) -> int:
        """Cancel each of ``commands`` with ``reason`` in one pass; how many this cancelled.

        Every cut comes first, then the bookkeeping of each (its lifecycle,
        its escalation timer, a queued one dropped, its driver woken): the
        last command's provider sees its close after every cut, not after
        every whole cancel.
        """
        why = Reason(reason)
        commands = list(commands)
        claimed: list[CommandRecord] = []
        failed: BaseException | None = None
        try:
            for command in commands:
                if self._claim(command, why):
                    claimed.append(command)
                    try:
                        _placement(command).cut(command, why)
                    except Exception as exc:
                        # One placement's failure (a host gone) cancels
                        # the rest all the same; the first one is raised.
                        failed = failed or exc
        finally:
            # Even if a cut raised: every claimed command gets its driver woken.
            for command in claimed:
                self._after_cut(command, why)
        if failed is not None:
            raise failed
        return len(claimed)

    def _claim(self, command: CommandRecord, why: Reason) -> bool:
        """Take ``command`` for this cancel; False if cancelled or decided already."""
        if command.reason is not None or command.state is CommandState.DONE:
            return False
        command.reason = why
        command.cancelled_at = time.monotonic()
        return True

    def _after_cut(self, command: CommandRecord, why: Reason) -> None:
        command.lifecycle.fire(CommandEvent.CANCEL)
        if _placement(command).cancel(command, why):
            command.lifecycle.fire(CommandEvent.DROP)
        command.wake.set()

    def confirm(self, command: CommandRecord) -> bool:
        """The client confirmed; False if the command is not waiting for a confirmation."""
        if command.placement is None or command.state is not CommandState.RUNNING:
            return False
        return command.placement.confirm(command)

    def live(self, session: Session | None = None) -> list[CommandRecord]:
        """Commands not yet completed (of ``session``, if given), oldest first."""
        found = [
            c
            for c in self._commands
            if c.state is not CommandState.DONE and (session is None or c.session is session)
        ]
        return sorted(found, key=lambda c: c.accepted_at)

    async def shutdown(self, reason: str = "shutdown") -> None:
        """Cancel every command with ``reason``, wait for each ``complete``, stop the placements."""
        self._closing = True
        self.cancel_all(self.live(), reason)
        if self._drivers:
            await asyncio.wait(set(self._drivers))
        await self._stop_placements()

    # -- Reporter (placements call these on the loop) ----------------------------------------

    def started(self, command: CommandRecord) -> None:
        if command.state is CommandState.DONE:
            return
        command.sink.started(command)
        if command.state is CommandState.RUNNING:
            command.timeout_handle = self.loop.call_later(
                command.timeout, self.cancel, command, Reason.TIMEOUT
            )

    def confirm_required(self, command: CommandRecord, message: str) -> None:
        if command.state is CommandState.RUNNING:
            if command.output is not None:
                # What the work wrote before it asked is still being coalesced:
                # it goes first, or the question would overtake it.
                command.output.flush()
            command.sink.confirm_required(command, message)

    # -- accepting and completing ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._loop is None:
            raise RuntimeError(f"{type(self).__name__}.start() was not called from the event loop")
        if self._closing:
            raise RuntimeError("the console is shutting down")

    def _limit(self, timeout: float | None) -> float:
        limit = self.limits.command_timeout
        return limit if timeout is None else min(timeout, limit)

    def _with_output(self, command: CommandRecord) -> CommandRecord:
        sink = command.sink
        command.output = OutputBuffer(
            self.loop,
            lambda stream, data: sink.output(command, stream, data),
            on_dropped=self.observer.output_dropped,
            flusher=self._flusher,
        )
        self._commands.add(command)
        return command

    def _accept(self, command: CommandRecord) -> CommandRecord:
        self._with_output(command)
        assert command.placement is not None
        command.placement.launch(command)
        task = self.loop.create_task(self._drive(command))
        self._drivers.add(task)
        task.add_done_callback(self._drivers.discard)
        return command

    def _reject(
        self, id: str, line: str, session: Session, sink: CommandSink, limit: float, message: str
    ) -> CommandRecord:
        # The one record with no placement: nothing will run it.
        command = CommandRecord(
            id=id,
            line=line,
            session=session,
            sink=sink,
            lifecycle=CommandLifecycle(id),
            timeout=limit,
        )
        self._with_output(command)
        command.lifecycle.fire(CommandEvent.REJECT)
        facts = CompleteFacts.failed(message, elapsed_ms=0.0)
        self.loop.call_soon(lambda: self._complete(command, facts.replace(elapsed_ms=_ms(command))))
        return command

    async def _drive(self, command: CommandRecord) -> None:
        assert command.placement is not None
        try:
            facts = await command.placement.settle(command)
        except Exception as exc:  # A bug in a placement must still end the command, once.
            _log.exception("command %s: its driver failed", command.id)
            if command.state is CommandState.DONE:
                return  # Its complete was decided already.
            if command.state is not CommandState.UNWINDING:
                command.lifecycle.fire(CommandEvent.CANCEL)
            command.lifecycle.fire(CommandEvent.UNWIND_EXPIRED)
            facts = CompleteFacts.failed(
                f"{type(exc).__name__}: {exc}",
                elapsed_ms=_ms(command),
                reason=command.reason,
                lifecycle=LifecycleFacts.unknown(),
            )
        self._complete(command, facts)

    def _complete(self, command: CommandRecord, facts: CompleteFacts) -> None:
        """Send the one ``complete`` of ``command``; output after it is dropped."""
        command.completed_at = time.monotonic()
        if command.timeout_handle is not None:
            command.timeout_handle.cancel()
        if command.output is not None:
            command.output.close()  # Sends what is left; drops anything later.
            # Closed, it is of no more use; its emit names this record (a cycle).
            command.output = None
        self._commands.discard(command)
        command.sink.complete(command, facts)
        to_complete = None
        if command.cancelled_at is not None:
            to_complete = (command.completed_at - command.cancelled_at) * 1000
        self.observer.completed(facts, to_complete)


class _NoObserver:
    def completed(self, facts: CompleteFacts, cancel_to_complete_ms: float | None) -> None:
        pass

    def output_dropped(self, characters: int) -> None:
        pass


def _placement(command: CommandRecord) -> Placement[Any]:
    assert command.placement is not None  # a rejected line is DONE already
    return command.placement


def _ms(command: CommandRecord) -> float:
    return round(command.elapsed_ms, 3)
