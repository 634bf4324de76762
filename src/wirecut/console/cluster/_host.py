"""The remote half: ``CommandHost`` runs console commands on one node, ``NodeWarden`` vouches.

``HostPool`` makes them Ray actors (``ray.remote(CommandHost).options(...)``).
Everything here runs in a Ray worker process on some node of the cluster,
never in the serve process.

``CommandHost`` is the local runner, moved: it owns a ``CommandRunner`` (the
same registry, ``CommandContext``, lifecycle table, unwind bound, ledger and
output coalescing as ``wirecut serve`` without ``--ray``) on an event loop of
its own, in a thread of the actor. Its Ray methods are in two concurrency
groups of a threaded actor:

- ``commands`` (``slots`` threads): ``run``, a streaming generator per
  command that yields batches of the command's news (``started``, output,
  ``confirm``) and, last, its ``complete`` facts: the *receipt*;
- ``control`` (always free threads): ``cancel``, ``confirm``, ``receipt``,
  ``renew``, ``where``. A control call never waits behind a busy command,
  which is why the cancel path does not depend on Ray's own ``ray.cancel``
  (that cannot interrupt a thread blocked in ``recv``; see docs/cluster.md).

Cancels come first by the host's cancel line (``_line``), a socket of its
own that a thread of the host reads, and by the ``cancel`` control call
when there is no line; both end in ``_cancel``.

The lease. The serve process calls ``renew`` every second or so. If no renew
came for ``lease_seconds`` (the serve process was killed, or cut off), the
host cancels every command with reason "shutdown" (its scope cuts the
provider sockets and kills process groups, as a local cancel does), waits
for their ``complete`` within the unwind bound, and then ends its own actor.
Hosts are detached actors, so this orderly path is what runs, rather than
Ray killing the process under the commands (which would orphan their
process groups).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import ray

from wirecut.console.cluster._line import CancelLine, LineRequest
from wirecut.console.commands import CommandContext, Services, Session, Stream
from wirecut.console.runner import (
    CommandRecord,
    CommandRunner,
    LocalCommand,
    RunnerLimits,
    route_stdio,
)
from wirecut.provider import ProviderSpec
from wirecut.record import CompleteFacts, Reason
from wirecut.scope import proc_stat

__all__ = [
    "MODEL_REQUEST",
    "CommandHost",
    "HostConfig",
    "HostIdentity",
    "HostReceipt",
    "NodeWarden",
]

_log = logging.getLogger("wirecut.cluster")

#: The label (in ``jobs`` and logs) of the job that makes one model request
#: for a command whose store stays in the serve process (``curator run
#: --consolidate``). It is sent as a callable, not a line: no user line runs it.
MODEL_REQUEST = "(model request)"
#: How long a finished job's receipt is kept for a late ``receipt`` call.
RECEIPT_KEEP = 256
#: How long a tombstone (a job cancelled before it reached the host) is kept.
TOMBSTONE_SECONDS = 600.0
#: How long a command's output after its first may wait for more before it is
#: sent, in seconds: at most ten Ray objects a second for a streaming command.
#: At 25 ms, 64 streams at 50 tokens/s cost the serve process 0.6 of a CPU.
OUTPUT_GATHER = 0.1
#: How long an ending host waits for its job streams to hand over their receipts.
RECEIPT_GRACE = 2.0
#: How long it then lets Ray deliver what the streams yielded last. A
#: generator runs on past its last ``yield`` before that object reached its
#: owner, Ray says nothing when it has, and a kill in between loses the
#: receipt (seen on a loaded machine).
RECEIPT_FLUSH = 1.0
#: How often the lease watchdog looks at the clock, in seconds.
LEASE_TICK = 0.1


@dataclass(frozen=True)
class HostConfig:
    """What a command host needs to know; sent once, when Ray creates the actor.

    ``limits`` are the host runner's: ``workers`` is how many commands it runs
    at once (its ``commands`` concurrency group), and ``command_timeout`` only
    a backstop for a command the serve process forgot (that process decides
    the timeouts). ``line_token``, when set, opens the host's cancel line: the
    serve process's connection sends it first.
    """

    provider: ProviderSpec
    limits: RunnerLimits
    lease_seconds: float
    line_token: str | None = field(default=None, repr=False)

    @property
    def slots(self) -> int:
        return self.limits.workers


@dataclass(frozen=True)
class HostIdentity:
    """Where a host runs: enough for a warden on that node to tell if the process is gone."""

    node_id: str
    node_ip: str
    pid: int
    #: The process's start time in clock ticks since boot (/proc/PID/stat,
    #: field 22): a pid reused by another process has another start time.
    start_ticks: int | None
    #: The port of its cancel line on ``node_ip``; None when it has none.
    line_port: int | None = None


def _where() -> tuple[str, str]:
    context = ray.get_runtime_context()
    node_id = context.get_node_id()
    ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return node_id, ip


class NodeWarden:
    """One per node: answers, from that node, whether a process there is gone.

    ``ray.kill`` reports an actor dead while its process may still run
    (measured: 3 of 3 tries), so the serve process says "force-killed" only
    once the warden of the host's node saw the process gone. Its methods run
    one at a time in the actor's thread; each is a few syscalls.
    """

    def where(self) -> str:
        return _where()[0]

    def gone(self, pid: int, start_ticks: int | None) -> bool:
        """True if process ``pid`` (started at ``start_ticks``) no longer runs on this node.

        A zombie counts as gone: it runs nothing and holds no socket. A pid
        now used by a process with another start time counts as gone too.
        """
        stat = proc_stat(pid)
        if stat is None or stat.state in ("Z", "X"):
            return True
        return start_ticks is not None and stat.start_ticks != start_ticks


@dataclass(frozen=True)
class HostReceipt:
    """The last item of a job's stream: how it ended on the host (sent through Ray as is).

    ``facts`` are the host runner's ``complete`` of the job; ``host`` says
    where it ran (node, node_ip, pid) and, for a cancelled job, the host's own
    ``cancel_to_complete_ms``; ``chat_history`` is the session's history when
    the job changed it; ``result`` what a model request's callable returned.
    """

    facts: CompleteFacts
    host: dict[str, Any]
    chat_history: list[dict[str, Any]] | None = None
    result: Any = None

    @classmethod
    def unstarted(cls, identity: HostIdentity, reason: Reason) -> HostReceipt:
        """A job that never ran here (tombstoned, or refused after the lease ended)."""
        return cls(CompleteFacts.unstarted(reason, elapsed_ms=0.0), _where_ran(identity))

    @classmethod
    def failed(cls, identity: HostIdentity, message: str) -> HostReceipt:
        """A job this host could not take."""
        return cls(CompleteFacts.failed(message, elapsed_ms=0.0), _where_ran(identity))


def _where_ran(identity: HostIdentity) -> dict[str, Any]:
    return {"node": identity.node_id, "node_ip": identity.node_ip, "pid": identity.pid}


@dataclass(eq=False)
class _Job:
    """One command on this host, from ``run`` until its receipt was yielded."""

    id: str
    news: queue.SimpleQueue[tuple[Any, ...]] = field(default_factory=queue.SimpleQueue)
    record: LocalCommand | None = None
    session: Session | None = None
    history_sent: list[dict[str, Any]] = field(default_factory=list)
    receipt: HostReceipt | None = None
    done: threading.Event = field(default_factory=threading.Event)


class _JobSink:
    """The remote ``CommandSink`` of one job: its news goes to the job's queue (host loop)."""

    def __init__(self, host: CommandHost, job: _Job) -> None:
        self._host = host
        self._job = job

    def started(self, command: CommandRecord) -> None:
        self._job.news.put(("started",))

    def output(self, command: CommandRecord, stream: Stream, data: str) -> None:
        self._job.news.put(("output", stream, data))

    def confirm_required(self, command: CommandRecord, message: str) -> None:
        self._job.news.put(("confirm", message))

    def complete(self, command: CommandRecord, facts: CompleteFacts) -> None:
        self._host._finish(self._job, facts)


def gathered(
    news: queue.SimpleQueue[tuple[Any, ...]], gather: float
) -> Iterator[list[tuple[Any, ...]]]:
    """``news`` as batches, each one item of a job's Ray stream, the last ending with its receipt.

    Output after a command's first waits up to ``gather`` seconds for more,
    so that a streaming command sends a few Ray objects a second, not one per
    token (each costs the serve process about a quarter of a millisecond);
    the first output goes at once, so its first token is not held. Anything
    else goes at once with what is already there.
    """
    wait = 0.0
    while True:
        batch = [news.get()]
        if batch[0][0] == "output":
            deadline = time.monotonic() + wait
            wait = gather
            with contextlib.suppress(queue.Empty):
                while batch[-1][0] == "output":
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    batch.append(news.get(timeout=remaining))
        with contextlib.suppress(queue.Empty):
            while batch[-1][0] != "complete":
                batch.append(news.get_nowait())
        yield batch
        if batch[-1][0] == "complete":
            return


def _model_request(
    messages: list[dict[str, Any]], params: dict[str, Any], ctx: CommandContext
) -> Any:
    """One ``ChatClient.chat`` for a command whose other steps run in the serve process.

    The messages and parameters came with the job; the reply (a
    ``ChatResult``, also a cut one) is returned, and goes back in the receipt.
    """
    params = dict(params)
    stream = bool(params.pop("stream", True))
    result = ctx.services.chat_client().chat(
        messages, stream=stream, on_token=ctx.token if stream else None, **params
    )
    ctx.add_usage(result.usage)
    return result


class CommandHost:
    """Runs console commands for one serve process on one node (a threaded Ray actor).

    Methods are called by Ray from the threads of their concurrency group;
    each says which. The command runner itself runs on the host's own event
    loop thread, and commands on its worker threads.
    """

    def __init__(self, config: HostConfig) -> None:
        self.config = config
        node_id, ip = _where()
        pid = os.getpid()
        stat = proc_stat(pid)
        self._line: CancelLine | None = None
        if config.line_token is not None:
            try:
                self._line = CancelLine(ip, config.line_token, self._cancel_by_line)
            except OSError as exc:  # the cancels then come by the control call
                _log.warning("cannot open a cancel line on %s: %s", ip, exc)
        self.identity = HostIdentity(
            node_id,
            ip,
            pid,
            None if stat is None else stat.start_ticks,
            None if self._line is None else self._line.port,
        )
        client = config.provider.client()
        # The note store stays with the serve process: no command here touches it.
        services = Services.of(None, config.provider, lambda: client)
        self._runner = CommandRunner(services, limits=config.limits)
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name="wirecut-host-loop", daemon=True
        )
        self._loop_thread.start()
        asyncio.run_coroutine_threadsafe(_start(self._runner), self._loop).result(10)
        # print() in a command reaches that command's output, as in `wirecut serve`.
        self._stdio = route_stdio()
        self._stdio.__enter__()
        # Guards the jobs, the receipts, the tombstones and the lease state.
        self._lock = threading.Lock()
        # Job streams not yet over; the lease's end waits (bounded) for them
        # to hand over their receipts before this actor ends.
        self._streams = 0
        self._streams_done = threading.Condition(self._lock)
        self._jobs: dict[str, _Job] = {}
        self._receipts: OrderedDict[str, HostReceipt] = OrderedDict()
        self._tombstones: dict[str, float] = {}
        self._last_renew = time.monotonic()
        self._expired = False
        self._watchdog = threading.Thread(
            target=self._watch_lease, name="wirecut-host-lease", daemon=True
        )
        self._watchdog.start()

    # -- commands group ---------------------------------------------------------------

    @ray.method(concurrency_group="commands", num_returns="streaming")
    def run(
        self,
        job_id: str,
        line: str,
        history: list[dict[str, Any]] | None = None,
        payload: Any = None,
    ) -> Iterator[list[tuple[Any, ...]]]:
        """(``commands`` group, streaming) Run ``line`` as job ``job_id``; yield its news.

        Each item is a batch (a list) of what happened since the last one:
        ``("started",)``, ``("output", stream, data)``, ``("confirm",
        message)``, and last ``("complete", facts)``, the receipt. A job
        cancelled before it got here (a tombstone) yields its receipt at once,
        with ``started: false``, and never runs.

        Cancellation: through ``cancel`` (control group); ``ray.cancel`` is
        not used on a running job.
        """
        job = _Job(job_id)
        refused: HostReceipt | None = None
        with self._lock:
            self._streams += 1
            if job_id in self._tombstones or self._expired:
                why = Reason.SHUTDOWN if self._expired else Reason.USER
                refused = HostReceipt.unstarted(self.identity, why)
            else:
                self._jobs[job_id] = job
                # Under the lock: a cancel that sees the job queues its call after this one.
                self._loop.call_soon_threadsafe(self._submit, job, line, history or [], payload)
        try:
            if refused is not None:
                yield [("complete", refused)]
                return
            yield from gathered(job.news, OUTPUT_GATHER)
        finally:
            with self._lock:
                self._streams -= 1
                self._streams_done.notify_all()

    def _submit(self, job: _Job, line: str, history: list[dict[str, Any]], payload: Any) -> None:
        # On the host loop.
        job.session = Session(chat_history=[dict(m) for m in history])
        job.history_sent = [dict(m) for m in history]
        sink = _JobSink(self, job)
        try:
            if payload is None:
                record = self._runner.submit(job.id, line, job.session, sink)
            else:
                messages, params = payload
                work = functools.partial(_model_request, messages, params)
                record = self._runner.submit_call(
                    job.id, work, job.session, sink, label=MODEL_REQUEST
                )
        except Exception as exc:  # the runner is shutting down (lease expired)
            self._settle(job, HostReceipt.failed(self.identity, str(exc)))
            return
        assert isinstance(record, LocalCommand)
        job.record = record

    def _finish(self, job: _Job, facts: CompleteFacts) -> None:
        # On the host loop: the job's one complete, from its runner.
        record = job.record
        host = _where_ran(self.identity)
        if record is not None and record.completed_at is not None:
            cancelled_at = record.scope.cancelled_at
            if cancelled_at is not None:
                host["cancel_to_complete_ms"] = (record.completed_at - cancelled_at) * 1000
        history = None
        if job.session is not None and job.session.chat_history != job.history_sent:
            history = job.session.chat_history
        result = record.result if record is not None else None
        self._settle(job, HostReceipt(facts, host, history, result))

    def _settle(self, job: _Job, receipt: HostReceipt) -> None:
        with self._lock:
            job.receipt = receipt
            self._jobs.pop(job.id, None)
            self._receipts[job.id] = receipt
            while len(self._receipts) > RECEIPT_KEEP:
                self._receipts.popitem(last=False)
        job.done.set()
        job.news.put(("complete", receipt))

    # -- control group ----------------------------------------------------------------

    @ray.method(concurrency_group="control")
    def cancel(self, requests: list[tuple[str, str]]) -> list[tuple[str, Any]]:
        """(``control`` group) Cancel each ``(job_id, reason)``; one answer per request.

        Answers: ``("cancelling", None)`` (the job's scope was cancelled: its
        receipt follows on its stream, within the unwind bound);
        ``("dropped", receipt)`` (the job had not reached this host: it is
        tombstoned and will never run); ``("done", receipt)`` (it had
        finished). Never blocks on a command.
        """
        return self._cancel(requests)

    def _cancel_by_line(self, requests: list[LineRequest]) -> list[str]:
        # On the line's thread.
        return [kind for kind, _ in self._cancel(requests)]

    def _cancel(self, requests: list[tuple[str, str]]) -> list[tuple[str, Any]]:
        """Cancel each ``(job_id, reason)`` (the answers of ``cancel``), from any thread."""
        answers: list[tuple[str, Any]] = []
        found: list[tuple[_Job, str]] = []
        cut: list[tuple[LocalCommand, str]] = []
        now = time.monotonic()
        with self._lock:
            self._prune_tombstones(now)
            for job_id, reason in requests:
                job = self._jobs.get(job_id)
                if job is not None:
                    found.append((job, reason))
                    if job.record is not None:
                        cut.append((job.record, reason))
                    answers.append(("cancelling", None))
                elif job_id in self._receipts:
                    answers.append(("done", self._receipts[job_id]))
                else:
                    self._tombstones[job_id] = now
                    dropped = HostReceipt.unstarted(self.identity, Reason(reason))
                    answers.append(("dropped", dropped))
            if found:
                # The runner's cancels first, on its loop, in one wake-up:
                # queued ahead of the workers' ends, so that it knows each end
                # is a cut (and, under the lock, after the submit of every job
                # found). One callback for the batch, not one each: each
                # wake-up is a write that lets go of the GIL, and on a host
                # busy with its streams every one costs a turn to get it back.
                self._loop.call_soon_threadsafe(self._cancel_on_loop, found)
        # Then the cuts themselves, from this thread at once (the scope is
        # thread-safe): the host loop may be busy.
        for record, reason in cut:
            record.scope.cancel(reason)
        return answers

    def _cancel_on_loop(self, found: list[tuple[_Job, str]]) -> None:
        for job, reason in found:
            if job.record is not None:
                # Each on its own, as when each was a callback of its own: a
                # cancel that raised must not leave the rest of the batch.
                try:
                    self._runner.cancel(job.record, reason)
                except Exception:
                    _log.exception("cancelling job %s on the host's runner failed", job.id)

    @ray.method(concurrency_group="control")
    def confirm(self, job_id: str) -> bool:
        """(``control`` group) The client confirmed job ``job_id``; False if it was not asking."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            return False

        async def on_loop() -> bool:
            return job.record is not None and self._runner.confirm(job.record)

        return asyncio.run_coroutine_threadsafe(on_loop(), self._loop).result(5)

    @ray.method(concurrency_group="control")
    def receipt(self, job_id: str, timeout: float) -> HostReceipt | None:
        """(``control`` group) The receipt of ``job_id``, waiting up to ``timeout`` seconds.

        For a serve process whose stream of the job broke: None if the job
        is unknown here or has not completed within ``timeout``.
        """
        with self._lock:
            found = self._receipts.get(job_id)
            job = self._jobs.get(job_id)
        if found is not None or job is None:
            return found
        job.done.wait(timeout)
        return job.receipt

    @ray.method(concurrency_group="control")
    def renew(self) -> dict[str, Any]:
        """(``control`` group) Renew the lease; returns this host's counts for health."""
        with self._lock:
            self._last_renew = time.monotonic()
            running = len(self._jobs)

        async def on_loop() -> dict[str, Any]:
            return self._runner.health()

        health = asyncio.run_coroutine_threadsafe(on_loop(), self._loop).result(5)
        health["jobs"] = running
        return health

    @ray.method(concurrency_group="control")
    def where(self) -> HostIdentity:
        """(``control`` group) Where this host runs."""
        return self.identity

    # -- the lease --------------------------------------------------------------------

    def _watch_lease(self) -> None:
        while True:
            time.sleep(LEASE_TICK)
            with self._lock:
                expired = time.monotonic() - self._last_renew > self.config.lease_seconds
                if expired:
                    self._expired = True
            if expired:
                break
        _log.warning("lease expired: cancelling every command (reason shutdown)")
        future = asyncio.run_coroutine_threadsafe(self._runner.shutdown("shutdown"), self._loop)
        with contextlib.suppress(Exception):
            future.result(self.config.limits.unwind_timeout + 5)
        self._exit()

    def _exit(self) -> None:
        # The commands are done (or past their bound). Their streams hand
        # over the receipts first (bounded), in case the serve process is
        # only slow; then end this actor, so that a detached host does not
        # outlive the serve process that owned it.
        with self._streams_done:
            self._streams_done.wait_for(lambda: self._streams == 0, RECEIPT_GRACE)
        time.sleep(RECEIPT_FLUSH)
        with contextlib.suppress(Exception):
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
        time.sleep(5)
        os._exit(0)  # ray.kill did not end us: do it ourselves.

    def _prune_tombstones(self, now: float) -> None:
        # Called with the lock held.
        stale = [j for j, at in self._tombstones.items() if now - at > TOMBSTONE_SECONDS]
        for job_id in stale:
            del self._tombstones[job_id]


async def _start(runner: CommandRunner) -> None:
    # Not a method: Ray makes an actor with any ``async def`` method an asyncio
    # actor, whose sync methods then run on its event loops, one at a time.
    runner.start()
