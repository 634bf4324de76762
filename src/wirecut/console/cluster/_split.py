"""Split commands: the store stays here, the model request goes to a command host.

``curator run --consolidate`` reads the notes, asks the model for a plan,
validates it and applies it in one transaction. With a cluster, the command
runs on the serve process's local ``CommandRunner`` exactly as without one
(the same ``curator_run``, ``curate``, ``make_plan``, ``validate_plan`` and
``apply_plan``), except that the chat client it is given, ``model_client``,
sends its one model request to a host: the plan is made there (the host's
``ChatClient`` streams it from the provider under a scope of the host's) and
comes back as the ``ChatResult``, to be parsed, validated and applied here.
No curator code is repeated, and no SQLite file is touched off this machine.
``SplitPlacement`` is the local thread placement with that one difference,
and with the host's facts merged into the ``complete`` it settles.

The cut. While the request is out, an ``Interruptible`` is registered with
the bound scope (the agent turn's): the local cancel calls its
``interrupt``, which sends the cancel to the host. The local worker then
waits for the host's receipt (or, past the bound, for the kill and its
confirmation) before it returns, so the local ``complete`` comes after the
remote unwind. ``SplitSink`` merges the host's facts into that ``complete``:
``node``, the host's steps on the timeline, open requests, and
``worker_exited`` False or None if the host's was; a lost host makes it
``error``/``lost``.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import wirecut.scope as ws
from wirecut.console.cluster._host import MODEL_REQUEST
from wirecut.console.cluster._pool import HostPool
from wirecut.console.cluster._remote import Outcome, RemoteJob, remote_facts
from wirecut.console.commands import Stream
from wirecut.console.runner import LocalCommand, Placement, ThreadPlacement
from wirecut.console.runner._core import Accepted
from wirecut.provider import ChatResult, ProviderError
from wirecut.record import CompleteFacts, Reason, Status, make_timeline
from wirecut.scope import Interrupted, InterruptScope, current_scope

__all__ = ["RemoteBounds", "SplitCommands", "SplitPlacement", "merge"]

#: Beyond its own bounds, how long a local worker waits for a model request's coroutine.
SAFETY_MARGIN = 30.0
#: How long a model request waits for a command host to be ready.
HOST_WAIT = 60.0


@dataclass(frozen=True)
class RemoteBounds:
    """How long the serve process waits for a host: its unwind bound plus the round trip."""

    unwind_timeout: float
    rpc_grace: float
    command_timeout: float


@dataclass(eq=False)
class _Split:
    """One split command: its local record and what its model requests came to."""

    id: str
    outcomes: list[tuple[Outcome, float | None]] = field(default_factory=list)
    jobs: list[RemoteJob] = field(default_factory=list)
    reason: Reason | None = None
    cancelled_at: float | None = None


class SplitCommands:
    """The split commands of one serve process, and the chat client their model requests use.

    ``track`` runs on the event loop; ``client.chat`` on the local runner's
    worker threads; the rest on the event loop given to ``start``.
    """

    def __init__(self, pool: HostPool, bounds: RemoteBounds) -> None:
        self._pool = pool
        self._bounds = bounds
        self._loop: asyncio.AbstractEventLoop | None = None
        # Guards ``_by_scope``: worker threads look their command up in it.
        self._lock = threading.Lock()
        self._by_scope: weakref.WeakKeyDictionary[InterruptScope, _Split] = (
            weakref.WeakKeyDictionary()
        )
        self._serial = itertools.count(1)
        #: The chat client of the split commands: its requests run on a host.
        self.client = ModelClient(self)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop the model requests are made on."""
        self._loop = loop

    def track(self, command: LocalCommand) -> _Split:
        split = _Split(id=command.id)
        with self._lock:
            self._by_scope[command.scope] = split
        return split

    def forget(self, command: LocalCommand) -> None:
        """``command`` completed: a request its worker makes from now on is refused.

        Explicitly, not by the weak key alone: a split's jobs hold the worker's
        token callback, which reaches the scope, so the entry kept its key alive.
        """
        with self._lock:
            self._by_scope.pop(command.scope, None)

    def find(self) -> _Split | None:
        """The split command whose scope is bound in this thread (walking up from a child scope)."""
        scope = current_scope()
        with self._lock:
            while scope is not None:
                found = self._by_scope.get(scope)
                if found is not None:
                    return found
                scope = scope.parent
        return None

    # -- on the event loop ------------------------------------------------------------

    def cancel(self, split: _Split, reason: Reason) -> None:
        if split.reason is None:
            split.reason = reason
            split.cancelled_at = time.monotonic()
        for job in split.jobs:
            job.cancel(reason)

    async def request(
        self,
        split: _Split,
        messages: list[dict[str, Any]],
        params: dict[str, Any],
        on_token: Callable[[str], None] | None,
    ) -> Outcome:
        """Make one model request on a host; return its outcome once it is settled."""
        pool = self._pool
        host = pool.pick()
        deadline = time.monotonic() + HOST_WAIT
        while host is None and split.reason is None and time.monotonic() < deadline:
            pool.changed.clear()
            try:
                await asyncio.wait_for(pool.changed.wait(), 1.0)
            except TimeoutError:
                pass
            host = pool.pick()
        if host is None:
            outcome = Outcome(dropped=split.reason is not None, started=False)
            split.outcomes.append((outcome, split.cancelled_at))
            return outcome
        news = asyncio.Event()

        def on_output(stream: Stream, data: str) -> None:
            if stream == "token" and on_token is not None:
                on_token(data)

        job = RemoteJob(
            pool,
            host,
            f"{pool.serve_id}.{split.id}.m{next(self._serial)}",
            MODEL_REQUEST,
            payload=(messages, params),
            on_output=on_output,
            on_news=news.set,
        )
        split.jobs.append(job)
        job.start()
        if split.reason is not None:
            job.cancel(split.reason)
        while split.reason is None:
            if job.receipt is not None:
                job.end()
                outcome = job.outcome()
                split.outcomes.append((outcome, None))
                return outcome
            if job.broken is not None or job.host_dead:
                self.cancel(split, Reason.LOST)
                break
            news.clear()
            await news.wait()
        assert split.cancelled_at is not None
        bounds = self._bounds
        outcome = await job.settle(split.cancelled_at + bounds.unwind_timeout + bounds.rpc_grace)
        split.outcomes.append((outcome, split.cancelled_at))
        return outcome

    # -- on a worker thread -----------------------------------------------------------

    def chat(
        self,
        messages: list[dict[str, Any]],
        params: dict[str, Any],
        on_token: Callable[[str], None] | None,
    ) -> ChatResult:
        """``ModelClient.chat``: one request on a host, for the split command bound here."""
        split = self.find()
        loop = self._loop
        if split is None or loop is None:
            raise ProviderError("this request has no cluster command to run under")
        ws.check()
        with ws.register(_RemoteCut(self, split, loop)):
            # Run on the loop in a context of its own. In this thread's, the
            # command's scope is bound, and every timer the request sets (a
            # cancelled one too) would hold the scope until the timer's time.
            future = contextvars.Context().run(
                asyncio.run_coroutine_threadsafe,
                self.request(split, messages, params, on_token),
                loop,
            )
            bounds = self._bounds
            outcome = future.result(
                bounds.command_timeout + bounds.unwind_timeout + bounds.rpc_grace + SAFETY_MARGIN
            )
        receipt = outcome.receipt
        result = receipt.result if receipt is not None else None
        if isinstance(result, ChatResult):
            return result
        if split.reason is not None and split.reason is not Reason.LOST:
            raise Interrupted(split.reason)
        if outcome.lost or split.reason is Reason.LOST:
            raise ProviderError(
                f"the command host on node {outcome.node_ip or outcome.node} was lost"
            )
        if receipt is not None and receipt.facts.error:
            raise ProviderError(receipt.facts.error)
        raise ProviderError("the command host answered without a reply")


class _RemoteCut:
    """Registered with the bound scope while a model request is out: a cut cancels it."""

    def __init__(self, splits: SplitCommands, split: _Split, loop: asyncio.AbstractEventLoop):
        self._splits = splits
        self._split = split
        self._loop = loop

    def interrupt(self, reason: str) -> None:
        # Quick and safe from any thread: the cancel itself is sent on the loop.
        try:
            why = Reason(reason)
        except ValueError:
            why = Reason.USER  # A scope's own reason ("cancelled"): a cut like a user's.
        try:
            self._loop.call_soon_threadsafe(self._splits.cancel, self._split, why)
        except RuntimeError:
            pass  # The loop is closed: the serve process is going, and the lease ends the job.


class ModelClient:
    """A ``ChatClient`` stand-in whose ``chat`` is made on a command host.

    ``chat`` is called on a local worker thread, under the command's scope.
    """

    def __init__(self, splits: SplitCommands) -> None:
        self._splits = splits

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        stream: bool = True,
        on_token: Callable[[str], None] | None = None,
        **params: Any,
    ) -> ChatResult:
        """One chat request on a host; the same contract as ``ChatClient.chat``.

        Cancellation: a cancel of the bound scope cancels the request on the
        host; this returns once the host's receipt came (a ``ChatResult``
        with ``interrupted=True`` if the request had been sent), or the host
        was killed or lost (``Interrupted``), within the cluster's bounds.
        """
        return self._splits.chat(messages, {"tools": tools, "stream": stream, **params}, on_token)


class SplitPlacement(Placement[LocalCommand]):
    """The local thread placement, for a split command: the host's facts merged at the end."""

    def __init__(self, threads: ThreadPlacement, splits: SplitCommands) -> None:
        self._threads = threads
        self._splits = splits
        self._by_command: weakref.WeakKeyDictionary[LocalCommand, _Split] = (
            weakref.WeakKeyDictionary()
        )

    def record(self, accepted: Accepted) -> LocalCommand:
        command = self._threads.record(accepted)
        command.placement = self
        self._by_command[command] = self._splits.track(command)
        return command

    def launch(self, command: LocalCommand) -> None:
        self._threads.launch(command)

    def cut(self, command: LocalCommand, reason: Reason) -> None:
        self._threads.cut(command, reason)

    def cancel(self, command: LocalCommand, reason: Reason) -> bool:
        return self._threads.cancel(command, reason)

    def confirm(self, command: LocalCommand) -> bool:
        return self._threads.confirm(command)

    async def settle(self, command: LocalCommand) -> CompleteFacts:
        try:
            facts = await self._threads.settle(command)
        finally:
            split = self._by_command.pop(command, None)
            self._splits.forget(command)
        if split is None or not split.outcomes:
            return facts
        return merge(facts, split.outcomes, command.scope.cancelled_at)


def merge(
    facts: CompleteFacts,
    outcomes: list[tuple[Outcome, float | None]],
    local_cancelled_at: float | None,
) -> CompleteFacts:
    """The local ``complete`` of a split command with its model requests' host facts folded in."""
    life = facts.lifecycle
    steps = [(step.event, step.ms) for step in life.timeline or ()]
    status, reason, error = facts.status, facts.reason, facts.error
    worker_exited, open_requests = life.worker_exited, life.open_requests
    open_processes, force_killed = life.open_processes, life.force_killed
    node = node_ip = None
    for outcome, cancelled_at in outcomes:
        remote = remote_facts(
            outcome, reason=reason, cancelled_at=cancelled_at, elapsed_ms=0.0
        ).lifecycle
        if outcome.lost:
            status, reason = Status.ERROR, Reason.LOST
            error = error or f"the command host on node {outcome.node_ip or outcome.node} was lost"
        worker_exited = _all(worker_exited, remote.worker_exited)
        open_requests = _sum(open_requests, remote.open_requests)
        open_processes = _sum(open_processes, remote.open_processes)
        node, node_ip = remote.node, remote.node_ip
        if remote.force_killed is not None:
            force_killed = remote.force_killed
        if local_cancelled_at is not None and cancelled_at is not None:
            shift = (cancelled_at - local_cancelled_at) * 1000
            for step in remote.timeline or ():
                if step.event == "cancel_requested":
                    continue  # The local command's own, at 0.
                # The local worker's exit comes from the local runner.
                event = "host_worker_exited" if step.event == "worker_exited" else step.event
                steps.append((event, step.ms + shift))
    lifecycle = life.__class__(
        worker_exited=worker_exited,
        open_requests=open_requests,
        open_processes=open_processes,
        started=life.started,
        timeline=None if life.timeline is None else make_timeline(steps),
        open_threads=life.open_threads,
        node=node,
        node_ip=node_ip,
        force_killed=force_killed,
    )
    late = facts.late_cancel if status is not Status.ERROR or reason is not Reason.LOST else None
    return facts.replace(
        status=status, reason=reason, error=error, lifecycle=lifecycle, late_cancel=late
    )


def _all(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _sum(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b
