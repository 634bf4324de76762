"""``CommandRunner``: console commands on this machine's worker threads, cancelled for real.

The runner is the core (``_core.RunnerCore``) with one placement,
``ThreadPlacement``: a bounded ``WorkerPool``, each command's
``concurrent.futures.Future`` and its ``InterruptScope``. It knows nothing
about WebSockets: a host (the console server) calls ``submit``, ``cancel``
and ``confirm`` from its event loop and gets everything back through a
``CommandSink``, also on the loop.

The unwind rule (docs/architecture.md, "The host"). On cancel, timeout,
disconnect or shutdown: ``scope.cancel(reason)``; if ``Future.cancel()`` is
True the command never ran and completes at once with ``started: false``;
otherwise the runner waits for the worker for at most ``unwind_timeout`` and
only then decides the ``complete``, with the facts read from the scope's
ledger at that moment. A worker still running then is reported
``worker_exited: false``, counted as leaked, and its thread is replaced in the
pool. The status follows how the worker ended (``wirecut.record.decide``): a command
that returned, or whose commit section passed, completes ``ok`` with the
cancel as ``late_cancel``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from wirecut.console.commands import (
    CommandContext,
    CommandError,
    CommandSet,
    Services,
    builtin_commands,
)
from wirecut.console.runner._contract import RunnerObserver
from wirecut.console.runner._core import (
    Accepted,
    CommandRecord,
    Placement,
    Reporter,
    RunnerCore,
    RunnerLimits,
    Work,
    call_soon,
)
from wirecut.console.runner._lifecycle import CommandEvent, CommandState
from wirecut.console.runner._output import LoopInbox, bind_output
from wirecut.console.runner._pool import WorkerPool
from wirecut.provider import ProviderError, Usage
from wirecut.record import (
    CompleteFacts,
    Ending,
    LifecycleFacts,
    Reason,
    unwind_timeline,
    usage_facts,
)
from wirecut.scope import Interrupted, InterruptScope

__all__ = ["CommandRunner", "LocalCommand", "ThreadPlacement"]

_log = logging.getLogger("wirecut.console")


@dataclass(eq=False, kw_only=True)
class LocalCommand(CommandRecord):
    """A command whose work runs on a worker thread of this process."""

    work: Work
    scope: InterruptScope
    future: Future[None] | None = None
    #: True once the command's own code began (the ``started`` fact).
    ran: bool = False
    started_at: float | None = None
    worker: threading.Thread | None = None
    worker_exited_at: float | None = None
    leaked: bool = False
    usage: Usage = field(default_factory=Usage)
    usage_lock: threading.Lock = field(default_factory=threading.Lock)
    confirm_event: threading.Event | None = None
    #: What a callable's work returned (``submit_call``).
    result: Any = None


class ThreadPlacement(Placement[LocalCommand]):
    """Runs commands on a ``WorkerPool`` of this process, each under its own scope.

    ``services`` and ``commands`` are what every command's context gets;
    ``reporter`` (the runner) hears of starts and confirmations.
    Cancellation: see the module docstring.
    """

    def __init__(
        self,
        services: Services,
        commands: CommandSet,
        limits: RunnerLimits,
        reporter: Reporter,
    ) -> None:
        self.services = services
        self.commands = commands
        self.limits = limits
        self.pool = WorkerPool(limits.workers)
        self._reporter = reporter
        self._loop: asyncio.AbstractEventLoop | None = None
        # Commands whose worker may still run: completed leaked ones stay here
        # (they count in health) until their worker exits at last.
        self._live: set[LocalCommand] = set()
        # Workers that returned, with when: one loop wake-up for those of a burst.
        self._exits: LoopInbox[tuple[LocalCommand, float]] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._exits = LoopInbox(loop, self._on_workers_done)

    def stop(self) -> None:
        self.pool.shutdown()

    # -- Placement ----------------------------------------------------------------------

    def record(self, accepted: Accepted) -> LocalCommand:
        scope = InterruptScope(f"command-{accepted.id}")
        return LocalCommand.of(accepted, self, work=accepted.work, scope=scope)

    def launch(self, command: LocalCommand) -> None:
        assert command.output is not None
        bind_output(command.scope, command.output)
        self._live.add(command)
        command.future = self.pool.submit(self._work, command)
        command.future.add_done_callback(lambda _: self._worker_done(command))

    def cut(self, command: LocalCommand, reason: Reason) -> None:
        command.scope.cancel(reason)

    def cancel(self, command: LocalCommand, reason: Reason) -> bool:
        assert command.future is not None
        # Cut already: this call only schedules the escalation.
        command.scope.cancel(reason, escalate_after=self.limits.escalation)
        return command.future.cancel()

    def confirm(self, command: LocalCommand) -> bool:
        event = command.confirm_event
        if event is None or event.is_set():
            return False
        event.set()
        return True

    async def settle(self, command: LocalCommand) -> CompleteFacts:
        assert command.future is not None
        await command.wake.wait()
        unwind = self.limits.unwind_timeout
        if command.reason is None:
            # It ran to its end by itself. If it left something running (a
            # spawned thread, a process), cut that: nothing of a finished
            # command runs on, and its timeline shows the cut.
            if any(command.scope.live().values()):
                command.scope.cancel("finished", escalate_after=self.limits.escalation)
                await _wait_quiescent(command, time.monotonic() + unwind)
            command.lifecycle.fire(CommandEvent.FINISH)
            return self._facts(command)
        if command.state is CommandState.DONE:  # Dropped while queued: it never ran.
            self._live.discard(command)
            return CompleteFacts.unstarted(command.reason, elapsed_ms=command.elapsed_ms)
        assert command.scope.cancelled_at is not None
        deadline = command.scope.cancelled_at + unwind
        if command.worker_exited_at is None:
            # The bound is one timer that wakes the driver as the worker's exit
            # does: a wait_for per wake-up cost a task and a timer each, 64 of
            # them on the event loop in a burst of cancels.
            expired = False

            def expire() -> None:
                nonlocal expired
                expired = True
                command.wake.set()

            bound = asyncio.get_running_loop().call_later(
                max(0.0, deadline - time.monotonic()), expire
            )
            try:
                while command.worker_exited_at is None and not expired:
                    command.wake.clear()
                    await command.wake.wait()
            finally:
                bound.cancel()
        if command.worker_exited_at is None:
            command.lifecycle.fire(CommandEvent.UNWIND_EXPIRED)
            command.leaked = True
            if command.worker is not None:
                self.pool.retire(command.worker)
            _log.warning("command %s: worker still running after the unwind bound", command.id)
        else:
            await _wait_quiescent(command, deadline)
            command.lifecycle.fire(CommandEvent.FINISH)
        return self._facts(command)

    # -- the facts ------------------------------------------------------------------------

    def _facts(self, command: LocalCommand) -> CompleteFacts:
        """The ``complete`` of a command whose worker ended (or passed the unwind bound)."""
        scope = command.scope
        counts = scope.live()
        exited = command.worker_exited_at is not None
        if not command.leaked:
            self._live.discard(command)
        ran_and_exited = command.worker_exited_at if command.ran else None
        steps = unwind_timeline(scope, ran_and_exited)
        lifecycle = LifecycleFacts(
            worker_exited=exited,
            open_requests=counts["sockets"],
            open_processes=counts["processes"],
            started=command.ran,
            timeline=steps,
            open_threads=counts["threads"] if command.leaked else None,
            commits=scope.commits,
            commit_open=scope.commit_open,
        )
        ending, error = _ending(command)
        if exited:
            # Read: let go of it. Its exception's traceback holds the frames
            # the worker unwound through, one of which holds this record: a
            # cycle that only the collector frees, 100 objects a command,
            # whose full collections were tens of ms in the middle of bursts.
            command.future = None
        with command.usage_lock:
            usage = usage_facts(command.usage)
        return CompleteFacts.ended(
            ending,
            command.reason,
            error=error,
            elapsed_ms=command.elapsed_ms,
            usage=usage,
            lifecycle=lifecycle,
        )

    # -- health ---------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """The protocol's ``/api/health`` body for this process's threads."""
        sockets = processes = 0
        for command in list(self._live):
            counts = command.scope.live()
            sockets += counts["sockets"]
            processes += counts["processes"]
        return {
            "status": "ok",
            "workers": {
                "max": self.pool.workers,
                "busy": self.pool.busy,
                "queued": self.pool.queued,
                "leaked": sum(1 for c in self._live if c.leaked),
            },
            "requests": {"open": sockets},
            "processes": {"open": processes},
        }

    # -- worker side ------------------------------------------------------------------------

    def _work(self, command: LocalCommand) -> None:
        """Runs on a pool thread: the command under its scope, bound here (scope.run)."""
        command.worker = threading.current_thread()
        command.lifecycle.fire(CommandEvent.START)
        output = command.output
        assert output is not None
        context = CommandContext(
            id=command.id,
            line=command.line,
            scope=command.scope,
            session=command.session,
            services=self.services,
            commands=self.commands,
            output=output.write,
            confirm=lambda message: self._ask_confirm(command, message),
            add_usage=lambda usage: _add_usage(command, usage),
        )
        work = command.work

        def body() -> None:
            command.ran = True
            command.started_at = time.monotonic()
            self._call_soon(self._reporter.started, command)
            if callable(work):
                command.result = work(context)
            else:
                found, args = work
                found(context, args)

        command.scope.run(body)

    def _ask_confirm(self, command: LocalCommand, message: str) -> bool:
        event = threading.Event()
        command.confirm_event = event
        self._call_soon(self._reporter.confirm_required, command, message)
        command.scope.wait(event)  # A cancel or the timeout ends it with Interrupted.
        return True

    def _worker_done(self, command: LocalCommand) -> None:
        # The future's done callback: on the worker thread, or on the loop for
        # a future cancelled while queued.
        assert self._exits is not None
        self._exits.put((command, time.monotonic()))

    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        call_soon(self._loop, fn, *args)

    def _on_workers_done(self, exits: list[tuple[LocalCommand, float]]) -> None:
        for command, exited in exits:
            try:
                self._on_worker_done(command, exited)
            except Exception:  # A bug here must not keep the batch's others from their end.
                _log.exception("command %s: handling its worker's exit failed", command.id)

    def _on_worker_done(self, command: LocalCommand, exited: float) -> None:
        assert command.future is not None
        if not command.future.cancelled():
            command.worker_exited_at = exited
        if command.leaked:
            # Its complete went out long ago; now it is really gone.
            command.leaked = False
            self._live.discard(command)
            _log.warning("command %s: the leaked worker exited at last", command.id)
            return
        command.wake.set()


class CommandRunner(RunnerCore):
    """Runs one server's commands on this machine. Use from the event loop thread only.

    ``commands`` (default: ``builtin_commands()``) are the lines it accepts;
    ``limits`` its pool size and bounds. ``start()`` binds it to the running
    loop; ``shutdown()`` cancels every command with reason "shutdown" and
    returns when each has its ``complete`` (within the unwind bound).

    Cancellation: see the module docstring.
    """

    def __init__(
        self,
        services: Services,
        *,
        commands: CommandSet | None = None,
        limits: RunnerLimits | None = None,
        observer: RunnerObserver | None = None,
    ) -> None:
        super().__init__(
            commands if commands is not None else builtin_commands(),
            limits if limits is not None else RunnerLimits(),
            observer=observer,
        )
        self.services = services
        self.threads = ThreadPlacement(services, self.commands, self.limits, self)

    @property
    def pool(self) -> WorkerPool:
        return self.threads.pool

    @property
    def saturated(self) -> bool:
        """True when a command submitted now would wait for a worker."""
        return self.pool.saturated

    def health(self) -> dict[str, Any]:
        """The ``/api/health`` body (protocol)."""
        return self.threads.health()

    def _route(self, line: str) -> tuple[ThreadPlacement, Work]:
        return self.threads, self.commands.parse(line)

    def _call_placement(self) -> ThreadPlacement:
        return self.threads

    def _start_placements(self, loop: asyncio.AbstractEventLoop) -> None:
        self.threads.start(loop)

    async def _stop_placements(self) -> None:
        self.threads.stop()


async def _wait_quiescent(command: LocalCommand, deadline: float) -> None:
    # The worker returned; a process it started may still be in its kill
    # grace (it counts until its group is dead). Wait for that, bounded.
    if any(command.scope.live().values()):
        remaining = max(0.0, deadline - time.monotonic())
        await asyncio.to_thread(command.scope.wait_quiescent, remaining)


def _ending(command: LocalCommand) -> tuple[Ending, str | None]:
    """How the worker ended, and the error to report if that is the status."""
    future = command.future
    if command.worker_exited_at is None or future is None or future.cancelled():
        return Ending.CUT, None
    exc = future.exception()
    if exc is None:
        return Ending.RETURNED, None
    if isinstance(exc, Interrupted):
        # With no cancel of the runner's: a scope of its own cut it.
        return Ending.CUT, str(exc)
    if isinstance(exc, CommandError | ProviderError):
        return Ending.FAILED, str(exc)
    _log.error("command %s failed", command.id, exc_info=exc)
    return Ending.FAILED, f"{type(exc).__name__}: {exc}"


def _add_usage(command: LocalCommand, part: Usage) -> None:
    with command.usage_lock:
        command.usage.add(part)  # An unknown count stays unknown (null on the wire).
