"""``RemoteJob``: one job on a command host, seen from the serve process; and its ``Outcome``.

A job is sent with ``CommandHost.run`` (a Ray streaming generator); a task
reads the stream and hands on its news (``started``, output, ``confirm``)
as it arrives, and keeps the last item, the receipt: the host runner's
``complete`` facts. ``cancel`` goes through the host's control group
(``HostPool.cancel``), never through ``ray.cancel`` on a running job.

``settle(deadline)`` is the unwind: it waits for the receipt until the
deadline (the unwind bound plus the control round trip). If the stream
broke it asks the host for the receipt directly. If no receipt came, or the
receipt says the host's worker is still running, or the host is dead, it
kills the host and asks that node's warden whether the process is gone: the
``Outcome`` then says ``exited`` True (confirmed), False (seen running) or
None (nobody could tell), never True on a guess.

``remote_facts`` turns an outcome into the command's ``CompleteFacts``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayError, TaskCancelledError

from wirecut.console.cluster._host import HostReceipt
from wirecut.console.cluster._pool import Host, HostPool, HostState
from wirecut.console.commands import Stream
from wirecut.record import (
    CompleteFacts,
    Ending,
    LifecycleFacts,
    Reason,
    Status,
    TimelineStep,
    UsageFacts,
    decide,
    make_timeline,
)

__all__ = ["Outcome", "RemoteJob", "remote_facts"]

#: Between two tries to reach a host whose stream of a job broke, in seconds.
RECOVER_POLL = 0.2


@dataclass
class Outcome:
    """How a remote job ended, as far as the serve process could confirm."""

    #: The host's receipt of the job (None: none came).
    receipt: HostReceipt | None = None
    #: When the receipt arrived here (``time.monotonic()``).
    receipt_at: float | None = None
    #: The job had not reached the host when cancelled: tombstoned, it never ran.
    dropped: bool = False
    #: The job never started on the host (per its receipt, or dropped); None: unknown.
    started: bool | None = None
    #: The host was lost (Ray says it died, or it never answered) before a receipt came.
    lost: bool = False
    #: When its host was killed here (None: it was not).
    killed_at: float | None = None
    #: After a kill: the warden saw the process gone (True), running (False), or could not tell.
    exited: bool | None = None
    exited_at: float | None = None
    node: str | None = None
    node_ip: str | None = None


class RemoteJob:
    """One job on one host. Event loop only.

    ``on_started``, ``on_output(stream, data)`` and ``on_confirm(message)``
    get the job's news as it streams in; ``on_news()`` is called whenever
    something changed that a driver waits for (a receipt, a broken stream, a
    dead host, a cancel's answer).
    """

    def __init__(
        self,
        pool: HostPool,
        host: Host,
        id: str,
        line: str,
        *,
        history: list[dict[str, Any]] | None = None,
        payload: Any = None,
        on_started: Callable[[], None] = lambda: None,
        on_output: Callable[[Stream, str], None] = lambda stream, data: None,
        on_confirm: Callable[[str], None] = lambda message: None,
        on_news: Callable[[], None] = lambda: None,
    ) -> None:
        self.pool = pool
        self.host = host
        self.id = id
        self.line = line
        self.history = history
        self.payload = payload
        self.on_started = on_started
        self.on_output = on_output
        self.on_confirm = on_confirm
        self.on_news = on_news
        self.started = False
        self.receipt: HostReceipt | None = None
        self.receipt_at: float | None = None
        self.dropped: HostReceipt | None = None
        #: Why the stream of the job ended without its receipt.
        self.broken: BaseException | None = None
        self.host_dead = False
        self.cancel_reason: str | None = None
        self._gen: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._event = asyncio.Event()
        self._ended = False

    # -- sending ------------------------------------------------------------------------

    def start(self) -> None:
        """Send the job to its host; its news arrives from now on."""
        self.host.jobs.add(self)
        try:
            self._gen = self.host.actor.run.remote(self.id, self.line, self.history, self.payload)
        except RayError as exc:
            self._break(exc)
            return
        self._reader = asyncio.get_running_loop().create_task(self._read())

    def cancel(self, reason: str) -> None:
        """Cancel the job on its host with ``reason`` (the first reason is the one sent)."""
        if self.cancel_reason is not None or self._ended:
            return
        self.cancel_reason = reason
        if self.host.state is HostState.GONE:
            self.host_dead = True
            self._news()
            return
        self.pool.cancel(self.host, self, reason)

    # -- news ---------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            async for ref in self._gen:
                for item in await ref:
                    self._dispatch(item)
                if self.receipt is not None:
                    return
            self._break(RuntimeError("the host's stream ended without a receipt"))
        except TaskCancelledError:
            pass  # We dropped it from Ray's queue after the host tombstoned it.
        except RayError as exc:
            self._break(exc)

    def _dispatch(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "started":
            self.started = True
            self.on_started()
        elif kind == "output":
            self.on_output(item[1], item[2])
        elif kind == "confirm":
            self.on_confirm(item[1])
        elif kind == "complete":
            self._set_receipt(item[1])

    def _set_receipt(self, receipt: HostReceipt) -> None:
        if self.receipt is None:
            self.receipt = receipt
            self.receipt_at = time.monotonic()
            self._news()

    def _break(self, exc: BaseException) -> None:
        if self.broken is None:
            self.broken = exc
        if isinstance(exc, ActorDiedError):
            self.host_dead = True
        self._news()

    def on_cancel_answer(self, kind: str, receipt: Any) -> None:
        """The host's answer to our cancel (``HostPool``)."""
        if kind == "dropped":
            self.dropped = receipt
            # It waits in Ray's queue of the actor, if anywhere: take it out,
            # so that it does not hold a slot when it comes up (it would
            # only yield its tombstone receipt).
            with contextlib.suppress(Exception):
                ray.cancel(self._gen)
            if self._reader is not None:
                self._reader.cancel()
        elif kind == "done":
            self._set_receipt(receipt)
        self._news()

    def on_control_error(self, exc: BaseException) -> None:
        """A control call for this job failed (``HostPool``)."""
        if isinstance(exc, ActorDiedError):
            self.host_dead = True
        self._news()

    def on_host_gone(self) -> None:
        self.host_dead = True
        self._news()

    def _news(self) -> None:
        self._event.set()
        self.on_news()

    # -- the unwind ---------------------------------------------------------------------

    async def settle(self, deadline: float) -> Outcome:
        """Wait for the receipt until ``deadline``; past it, kill the host and ask its warden.

        Call once the job was cancelled (or its stream broke). Returns what
        could be confirmed; the job is then over for this serve process.
        """
        recovery: asyncio.Task[None] | None = None
        try:
            while self.receipt is None and self.dropped is None and not self.host_dead:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if self.broken is not None and recovery is None:
                    recovery = asyncio.get_running_loop().create_task(self._recover(deadline))
                self._event.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._event.wait(), remaining)
        finally:
            if recovery is not None:
                recovery.cancel()
        outcome = self.outcome()
        receipt = self.receipt
        leaked = receipt is not None and receipt.facts.lifecycle.worker_exited is not True
        if (receipt is None and self.dropped is None) or leaked:
            outcome.killed_at = time.monotonic()
            outcome.exited = await self.pool.kill(self.host)
            outcome.exited_at = time.monotonic()
        self.end()
        return outcome

    async def _recover(self, deadline: float) -> None:
        # The stream broke but the host may be alive (Ray called it
        # "temporarily unavailable"): ask it for the receipt directly.
        reason = self.cancel_reason or "lost"
        while time.monotonic() < deadline and self.receipt is None and self.dropped is None:
            remaining = deadline - time.monotonic()
            try:
                answers = await asyncio.wait_for(
                    self.host.actor.cancel.remote([(self.id, reason)]), remaining
                )
                kind, receipt = answers[0]
                if kind != "cancelling":
                    self.on_cancel_answer(kind, receipt)
                    return
                found = await asyncio.wait_for(
                    self.host.actor.receipt.remote(self.id, min(remaining, 1.0)), remaining + 1
                )
                if found is not None:
                    self._set_receipt(found)
                    return
            except ActorDiedError:
                self.on_host_gone()
                return
            except (RayError, TimeoutError):
                await asyncio.sleep(RECOVER_POLL)

    def outcome(self) -> Outcome:
        """What is known now (without killing anything)."""
        receipt = self.receipt if self.receipt is not None else self.dropped
        outcome = Outcome(
            receipt=receipt,
            receipt_at=self.receipt_at,
            dropped=self.dropped is not None and self.receipt is None,
            lost=receipt is None and (self.host_dead or self.broken is not None),
            node=self.host.node_id,
            node_ip=self.host.node_ip,
        )
        if receipt is not None:
            outcome.started = bool(receipt.facts.lifecycle.started)
        elif self.started:
            outcome.started = True
        return outcome

    def end(self) -> None:
        """The job is over for this serve process: it no longer counts on its host."""
        self._ended = True
        self.host.jobs.discard(self)
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()


def remote_facts(
    outcome: Outcome,
    *,
    reason: Reason | None,
    cancelled_at: float | None,
    elapsed_ms: float,
) -> CompleteFacts:
    """The ``complete`` of a remote command whose job ended as ``outcome``.

    ``reason`` is the serve process's cancel (None: it did not cancel the
    command); ``cancelled_at`` when it did (``time.monotonic()``). The status
    follows how the job ended on its host (``decide``): a job the host saw
    return is ``ok`` with the cancel as ``late_cancel``. The
    host's steps are placed on the command's timeline at the latest time the
    receipt allows (its arrival minus the host's own cancel-to-complete
    time), so a step is never shown earlier than it can have happened.
    """
    receipt = outcome.receipt
    remote = receipt.facts if receipt is not None else None
    error: str | None = None
    late: Reason | None = None
    if outcome.lost:
        status, reason = Status.ERROR, Reason.LOST
        error = f"the command host on node {outcome.node_ip or outcome.node} was lost"
    elif remote is not None and (reason is None or reason is not Reason.LOST):
        if reason is None:
            status, error, reason = remote.status, remote.error, remote.reason
            late = remote.late_cancel
        else:
            status, reason, late = decide(
                _ending(remote),
                reason,
                committed=bool(remote.lifecycle.commits),
                commit_open=remote.lifecycle.commit_open,
            )
            error = remote.error if status is Status.ERROR else None
    else:
        assert reason is not None
        status = reason.status
        if reason is Reason.LOST:
            error = f"the stream from the command host on node {outcome.node_ip} broke"
    life = remote.lifecycle if remote is not None else LifecycleFacts.unknown()
    worker_exited = life.worker_exited
    open_requests = life.open_requests
    open_threads = life.open_threads
    force_killed = None
    if outcome.killed_at is not None:
        force_killed = outcome.exited is True
        worker_exited = outcome.exited
        if outcome.exited:
            open_requests = 0  # Its sockets went with the process.
            open_threads = None
    steps = None
    if cancelled_at is not None:
        steps = _timeline(outcome, cancelled_at)
    elif remote is not None:
        steps = life.timeline  # The host ended it by itself.
    lifecycle = LifecycleFacts(
        worker_exited=worker_exited,
        open_requests=open_requests,
        open_processes=life.open_processes,
        started=outcome.started,
        timeline=steps,
        open_threads=open_threads,
        node=outcome.node,
        node_ip=outcome.node_ip,
        force_killed=force_killed,
        commits=life.commits,
        commit_open=life.commit_open,
    )
    if remote is not None:
        usage = remote.usage
    elif outcome.dropped:
        usage = UsageFacts()
    else:
        usage = UsageFacts(None, None, None)  # Its host is gone: nobody can count.
    return CompleteFacts(status, error, elapsed_ms, reason, usage, lifecycle, late_cancel=late)


def _ending(facts: CompleteFacts) -> Ending:
    """How the job ended on its host, read from the host's ``complete``."""
    if facts.status is Status.OK:
        return Ending.RETURNED
    if facts.status is Status.ERROR and facts.reason is None:
        return Ending.FAILED
    return Ending.CUT


def _timeline(outcome: Outcome, cancelled_at: float) -> tuple[TimelineStep, ...]:
    steps: list[tuple[str, float]] = [("cancel_requested", 0.0)]
    receipt = outcome.receipt
    remote_steps = receipt.facts.lifecycle.timeline if receipt is not None else None
    to_complete = receipt.host.get("cancel_to_complete_ms") if receipt is not None else None
    if remote_steps and outcome.receipt_at is not None and to_complete is not None:
        base = max(0.0, (outcome.receipt_at - cancelled_at) * 1000 - float(to_complete))
        for step in remote_steps:
            name = "host_cancelled" if step.event == "cancel_requested" else step.event
            steps.append((name, base + step.ms))
    if outcome.killed_at is not None:
        steps.append(("host_killed", (outcome.killed_at - cancelled_at) * 1000))
        if outcome.exited and outcome.exited_at is not None:
            steps.append(("worker_exited", (outcome.exited_at - cancelled_at) * 1000))
    return make_timeline(steps)
