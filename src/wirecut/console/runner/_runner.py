"""``CommandRunner``: runs console commands on a bounded pool and cancels them for real.

The runner owns the worker threads, each command's ``concurrent.futures.Future``
and its ``InterruptScope``; it knows nothing about WebSockets. A host (the
console server) calls ``submit``, ``cancel`` and ``confirm`` from its event
loop and gets everything back through a ``CommandSink``, also on the loop:
``started``, ``output``, ``confirm_required`` and exactly one ``complete``.

The unwind rule (docs/architecture.md, "The host"). On cancel, timeout, disconnect or
shutdown: ``scope.cancel(reason)``; if ``Future.cancel()`` is True the command
never ran and completes at once with ``started: false``; otherwise the runner
waits for the worker for at most ``unwind_timeout`` and only then decides the
``complete``, with the facts read from the scope's ledger at that moment. A
worker still running then is reported ``worker_exited: false``, counted as
leaked, and its thread is replaced in the pool.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from wirecut.console.commands import (
    Command,
    CommandContext,
    CommandError,
    Services,
    Session,
    Stream,
    parse,
)
from wirecut.console.runner._contract import CommandSink, RunnerObserver
from wirecut.console.runner._lifecycle import CommandEvent, CommandLifecycle, CommandState
from wirecut.console.runner._output import OutputBuffer, bind_output
from wirecut.console.runner._pool import WorkerPool
from wirecut.provider import ProviderError, Usage
from wirecut.scope import Interrupted, InterruptScope

__all__ = ["CommandRunner", "RunningCommand"]

_log = logging.getLogger("wirecut.console")

#: The ``reason`` values of the protocol, and the status each ends a command with.
STATUS_BY_REASON = {
    "user": "cancelled",
    "timeout": "timeout",
    "disconnect": "cancelled",
    "shutdown": "cancelled",
    "lost": "error",
}


class _NoObserver:
    def completed(self, facts: dict[str, Any], cancel_to_complete_ms: float | None) -> None:
        pass

    def output_dropped(self, characters: int) -> None:
        pass


@dataclass(eq=False)
class RunningCommand:
    """The runner's record of one accepted command (read it; only the runner changes it)."""

    id: str
    line: str
    session: Session
    sink: CommandSink
    scope: InterruptScope
    lifecycle: CommandLifecycle
    timeout: float
    accepted_at: float = field(default_factory=time.monotonic)
    future: Future[None] | None = None
    output: OutputBuffer | None = None
    #: The first reason the runner cancelled it with (None: it ran to its end).
    reason: str | None = None
    #: True once the command's own code began (the ``started`` fact).
    ran: bool = False
    started_at: float | None = None
    worker: threading.Thread | None = None
    worker_exited_at: float | None = None
    #: When its complete was decided (``time.monotonic()``).
    completed_at: float | None = None
    leaked: bool = False
    usage: Usage = field(default_factory=Usage)
    usage_lock: threading.Lock = field(default_factory=threading.Lock)
    confirm_event: threading.Event | None = None
    # Set on the loop when there is news for the driver: a cancel, or the worker's end.
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    timeout_handle: asyncio.TimerHandle | None = None

    @property
    def state(self) -> CommandState:
        return self.lifecycle.state

    @property
    def elapsed_ms(self) -> float:
        return (time.monotonic() - self.accepted_at) * 1000


class CommandRunner:
    """Runs commands for one server. Use from the event loop thread only.

    ``start()`` binds it to the running loop; ``shutdown()`` cancels every
    command with reason "shutdown" and returns when each has its ``complete``
    (within the unwind bound).

    Cancellation: see the module docstring. ``escalate_after`` (seconds after
    the cancel) is when a worker that has not returned gets ``Interrupted``
    raised asynchronously in its thread: the last resort for pure-Python code
    that never reaches a cooperative point.
    """

    def __init__(
        self,
        services: Services,
        *,
        workers: int = 4,
        command_timeout: float = 60.0,
        unwind_timeout: float = 10.0,
        escalate_after: float | None = None,
        observer: RunnerObserver | None = None,
    ) -> None:
        for name, value in (
            ("command_timeout", command_timeout),
            ("unwind_timeout", unwind_timeout),
        ):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number of seconds > 0, not {value!r}")
        self.services = services
        self.pool = WorkerPool(workers)
        self.command_timeout = command_timeout
        self.unwind_timeout = unwind_timeout
        self.escalate_after = (
            min(1.0, unwind_timeout / 2) if escalate_after is None else escalate_after
        )
        self.observer: RunnerObserver = observer or _NoObserver()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Commands whose complete was not sent yet, or whose worker still runs.
        self._commands: set[RunningCommand] = set()
        self._drivers: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._closing = False

    # -- host side (event loop) -----------------------------------------------------

    def start(self) -> None:
        """Bind to the running event loop (call from it, before the first submit)."""
        self._loop = asyncio.get_running_loop()

    def new_id(self) -> str:
        """An id for a run frame that came without one."""
        return f"s{next(self._ids)}"

    @property
    def saturated(self) -> bool:
        """True when a command submitted now would wait for a worker."""
        return self.pool.saturated

    def submit(
        self,
        id: str,
        line: str,
        session: Session,
        sink: CommandSink,
        *,
        timeout: float | None = None,
    ) -> RunningCommand:
        """Accept ``line`` as command ``id``; it runs when a worker is free.

        ``timeout`` (seconds of running time) is capped by ``command_timeout``.
        A line that does not parse is accepted too and completes at once with
        status "error" and the usage in ``error``.
        """
        loop = self._require_loop()
        if self._closing:
            raise RuntimeError("the console is shutting down")
        limit = self.command_timeout if timeout is None else min(timeout, self.command_timeout)
        command = RunningCommand(
            id=id,
            line=line,
            session=session,
            sink=sink,
            scope=InterruptScope(f"command-{id}"),
            lifecycle=CommandLifecycle(id),
            timeout=limit,
        )
        command.output = OutputBuffer(
            loop,
            lambda stream, data: sink.output(command, stream, data),
            on_dropped=self.observer.output_dropped,
        )
        bind_output(command.scope, command.output)
        self._commands.add(command)
        try:
            found, args = parse(line)
        except CommandError as exc:
            command.lifecycle.fire(CommandEvent.REJECT)
            loop.call_soon(self._complete, command, "error", str(exc))
            return command
        command.future = self.pool.submit(self._work, command, found, args)
        command.future.add_done_callback(lambda _: self._worker_done(command))
        self._spawn_driver(command)
        return command

    def cancel(self, command: RunningCommand, reason: str) -> bool:
        """Cancel ``command`` with ``reason``; False if it was cancelled or decided already.

        The first reason wins. Never blocks: the scope's cuts are shutdowns
        and signals, and the wait for the worker happens in the driver task.
        """
        if command.reason is not None or command.state is CommandState.DONE:
            return False
        command.reason = reason
        command.lifecycle.fire(CommandEvent.CANCEL)
        command.scope.cancel(reason, escalate_after=self.escalate_after)
        assert command.future is not None  # a parse failure is DONE already
        if command.future.cancel():
            command.lifecycle.fire(CommandEvent.DROP)
        command.wake.set()
        return True

    def confirm(self, command: RunningCommand) -> bool:
        """The client confirmed; False if the command is not waiting for a confirmation."""
        event = command.confirm_event
        if event is None or event.is_set() or command.state is not CommandState.RUNNING:
            return False
        event.set()
        return True

    def live(self, session: Session | None = None) -> list[RunningCommand]:
        """Commands not yet completed (of ``session``, if given), oldest first."""
        found = [
            c
            for c in self._commands
            if c.state is not CommandState.DONE and (session is None or c.session is session)
        ]
        return sorted(found, key=lambda c: c.accepted_at)

    def health(self) -> dict[str, Any]:
        """The ``/api/health`` body (protocol)."""
        sockets = processes = 0
        for command in list(self._commands):
            counts = command.scope.live()
            sockets += counts["sockets"]
            processes += counts["processes"]
        return {
            "status": "ok",
            "workers": {
                "max": self.pool.workers,
                "busy": self.pool.busy,
                "queued": self.pool.queued,
                "leaked": sum(1 for c in self._commands if c.leaked),
            },
            "requests": {"open": sockets},
            "processes": {"open": processes},
        }

    async def shutdown(self, reason: str = "shutdown") -> None:
        """Cancel every command with ``reason`` and wait for their ``complete``; stop the pool."""
        self._closing = True
        for command in self.live():
            self.cancel(command, reason)
        if self._drivers:
            await asyncio.wait(set(self._drivers))
        self.pool.shutdown()

    # -- the driver (event loop) ------------------------------------------------------

    def _spawn_driver(self, command: RunningCommand) -> None:
        task = asyncio.get_running_loop().create_task(self._drive(command))
        self._drivers.add(task)
        task.add_done_callback(self._drivers.discard)

    async def _drive(self, command: RunningCommand) -> None:
        assert command.future is not None
        await command.wake.wait()
        if command.reason is None:
            # It ran to its end by itself. If it left something running (a
            # spawned thread, a process), cut that: nothing of a finished
            # command runs on.
            if any(command.scope.live().values()):
                command.scope.cancel("finished", escalate_after=self.escalate_after)
                await self._wait_quiescent(command, time.monotonic() + self.unwind_timeout)
            command.lifecycle.fire(CommandEvent.FINISH)
            self._complete(command, *self._outcome(command))
            return
        if command.state is CommandState.DONE:  # Dropped while queued: it never ran.
            self._complete(command, STATUS_BY_REASON.get(command.reason, "cancelled"))
            return
        assert command.scope.cancelled_at is not None
        deadline = command.scope.cancelled_at + self.unwind_timeout
        while command.worker_exited_at is None and time.monotonic() < deadline:
            command.wake.clear()
            try:
                await asyncio.wait_for(command.wake.wait(), deadline - time.monotonic())
            except TimeoutError:
                break
        if command.worker_exited_at is None:
            command.lifecycle.fire(CommandEvent.UNWIND_EXPIRED)
            command.leaked = True
            if command.worker is not None:
                self.pool.retire(command.worker)
            _log.warning("command %s: worker still running after the unwind bound", command.id)
        else:
            await self._wait_quiescent(command, deadline)
            command.lifecycle.fire(CommandEvent.FINISH)
        self._complete(command, STATUS_BY_REASON.get(command.reason, "cancelled"))

    async def _wait_quiescent(self, command: RunningCommand, deadline: float) -> None:
        # The worker returned; a process it started may still be in its kill
        # grace (it counts until its group is dead). Wait for that, bounded.
        if any(command.scope.live().values()):
            remaining = max(0.0, deadline - time.monotonic())
            await asyncio.to_thread(command.scope.wait_quiescent, remaining)

    def _outcome(self, command: RunningCommand) -> tuple[str, str | None]:
        """Status and error of a command that ended by itself."""
        assert command.future is not None
        exc = command.future.exception()
        if exc is None:
            return "ok", None
        if isinstance(exc, CommandError | ProviderError | Interrupted):
            # Interrupted here: cut by a scope of its own, not by the runner.
            return "error", str(exc)
        _log.error("command %s failed", command.id, exc_info=exc)
        return "error", f"{type(exc).__name__}: {exc}"

    def _complete(self, command: RunningCommand, status: str, error: str | None = None) -> None:
        """Decide and send the one ``complete`` of ``command``."""
        command.completed_at = time.monotonic()
        if command.timeout_handle is not None:
            command.timeout_handle.cancel()
        if command.output is not None:
            command.output.close()  # Sends what is left; drops anything later.
        facts = self._facts(command, status, error)
        if not command.leaked:  # A leaked one stays counted until its worker exits.
            self._commands.discard(command)
        command.sink.complete(command, facts)
        cancelled_at = command.scope.cancelled_at
        to_complete = None
        if command.reason is not None and cancelled_at is not None:
            to_complete = (command.completed_at - cancelled_at) * 1000
        self.observer.completed(facts, to_complete)

    def _facts(self, command: RunningCommand, status: str, error: str | None) -> dict[str, Any]:
        scope = command.scope
        counts = scope.live()
        started = command.ran
        worker_exited = command.worker_exited_at is not None or command.future is None
        if command.future is not None and command.future.cancelled():
            worker_exited = True  # Dropped while queued: no worker ran it.
        lifecycle: dict[str, Any] = {
            "worker_exited": worker_exited,
            "open_requests": counts["sockets"],
            "open_processes": counts["processes"],
            "started": started,
        }
        if command.reason is not None and scope.cancelled_at is not None:
            timeline: list[dict[str, Any]] = [
                {"event": str(event), "ms": round(ms, 3)} for event, ms in scope.timeline
            ]
            if command.worker_exited_at is not None and started:
                exited_ms = (command.worker_exited_at - scope.cancelled_at) * 1000
                timeline.append({"event": "worker_exited", "ms": round(max(exited_ms, 0.0), 3)})
                timeline.sort(key=lambda step: float(step["ms"]))
            lifecycle["timeline"] = timeline
        if command.leaked:
            lifecycle["open_threads"] = counts["threads"]
        with command.usage_lock:
            usage = {
                "prompt_tokens": command.usage.prompt_tokens,
                "completion_tokens": command.usage.completion_tokens,
                "requests": command.usage.requests,
            }
        return {
            "status": status,
            "error": error,
            "elapsed_ms": round(command.elapsed_ms, 3),
            "reason": command.reason,
            "usage": usage,
            "lifecycle": lifecycle,
        }

    # -- worker side ------------------------------------------------------------------

    def _work(self, command: RunningCommand, found: Command, args: list[str]) -> None:
        """Runs on a pool thread: the command under its scope, bound here (scope.run)."""
        command.worker = threading.current_thread()
        command.lifecycle.fire(CommandEvent.START)
        context = CommandContext(
            id=command.id,
            line=command.line,
            scope=command.scope,
            session=command.session,
            services=self.services,
            output=self._writer(command),
            confirm=lambda message: self._ask_confirm(command, message),
            add_usage=lambda usage: _add_usage(command, usage),
        )

        def body() -> None:
            command.ran = True
            command.started_at = time.monotonic()
            self._call_soon(self._on_started, command)
            found.fn(context, args)

        command.scope.run(body)

    def _writer(self, command: RunningCommand) -> Callable[[Stream, str], None]:
        output = command.output
        assert output is not None

        def write(stream: Stream, data: str) -> None:
            output.write(stream, data)

        return write

    def _ask_confirm(self, command: RunningCommand, message: str) -> bool:
        event = threading.Event()
        command.confirm_event = event
        self._call_soon(self._on_confirm_required, command, message)
        command.scope.wait(event)  # A cancel or the timeout ends it with Interrupted.
        return True

    def _worker_done(self, command: RunningCommand) -> None:
        # The future's done callback: on the worker thread, or on the loop for
        # a future cancelled while queued.
        exited = time.monotonic()
        self._call_soon(self._on_worker_done, command, exited)

    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._require_loop()
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass  # The loop is closed: the server is gone.

    # -- news from the worker, on the loop ----------------------------------------------

    def _on_started(self, command: RunningCommand) -> None:
        if command.state is CommandState.DONE:
            return
        command.sink.started(command)
        if command.state is CommandState.RUNNING:
            command.timeout_handle = self._require_loop().call_later(
                command.timeout, self.cancel, command, "timeout"
            )

    def _on_confirm_required(self, command: RunningCommand, message: str) -> None:
        if command.state is CommandState.RUNNING:
            command.sink.confirm_required(command, message)

    def _on_worker_done(self, command: RunningCommand, exited: float) -> None:
        assert command.future is not None
        if not command.future.cancelled():
            command.worker_exited_at = exited
        if command.leaked:
            # Its complete went out long ago; now it is really gone.
            command.leaked = False
            self._commands.discard(command)
            _log.warning("command %s: the leaked worker exited at last", command.id)
            return
        command.wake.set()

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("CommandRunner.start() was not called from the event loop")
        return self._loop


def _add_usage(command: RunningCommand, part: Usage) -> None:
    with command.usage_lock:
        command.usage.add(part)  # An unknown count stays unknown (null on the wire).
