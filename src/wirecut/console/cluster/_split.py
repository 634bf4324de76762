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
import itertools
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import wirecut.scope as ws
from wirecut.console.cluster._host import MODEL_REQUEST
from wirecut.console.cluster._remote import Outcome, RemoteJob, facts
from wirecut.console.commands import Session, Stream
from wirecut.console.runner import CommandRecord, CommandSink, RunningCommand
from wirecut.provider import ChatResult, ProviderError
from wirecut.scope import Interrupted, InterruptScope, current_scope

if TYPE_CHECKING:
    from wirecut.console.cluster._runner import ClusterRunner

__all__ = ["SplitCommands"]

#: Beyond its own bounds, how long a local worker waits for a model request's coroutine.
SAFETY_MARGIN = 30.0


@dataclass(eq=False)
class _Split:
    """One split command: its local record and what its model requests came to."""

    id: str
    scope: InterruptScope
    outcomes: list[tuple[Outcome, float | None]] = field(default_factory=list)
    jobs: list[RemoteJob] = field(default_factory=list)
    reason: str | None = None
    cancelled_at: float | None = None


class SplitCommands:
    """The split commands of one ``ClusterRunner``.

    ``submit`` runs on the event loop; ``model_client().chat`` on the local
    runner's worker threads; the rest on the event loop.
    """

    def __init__(self, runner: ClusterRunner) -> None:
        self._runner = runner
        # Guards ``_by_scope``: worker threads look their command up in it.
        self._lock = threading.Lock()
        self._by_scope: weakref.WeakKeyDictionary[InterruptScope, _Split] = (
            weakref.WeakKeyDictionary()
        )
        self._client = _ModelClient(self)
        self._serial = itertools.count(1)

    def model_client(self) -> Any:
        """The chat client of the local runner's commands: its requests run on a host."""
        return self._client

    def submit(
        self, id: str, line: str, session: Session, sink: CommandSink, *, timeout: float | None
    ) -> RunningCommand:
        holder: list[_Split] = []
        record = self._runner.local.submit(
            id,
            line,
            session,
            SplitSink(sink, lambda: holder[0] if holder else None),
            timeout=timeout,
        )
        split = _Split(id=id, scope=record.scope)
        holder.append(split)
        with self._lock:
            self._by_scope[record.scope] = split
        return record

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

    def cancel(self, split: _Split, reason: str) -> None:
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
        runner = self._runner
        pool = runner.pool
        host = pool.pick()
        deadline = time.monotonic() + 60.0
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
                self.cancel(split, "lost")
                break
            news.clear()
            await news.wait()
        assert split.cancelled_at is not None
        outcome = await job.settle(split.cancelled_at + runner.unwind_timeout + runner.rpc_grace)
        split.outcomes.append((outcome, split.cancelled_at))
        return outcome


class _RemoteCut:
    """Registered with the bound scope while a model request is out: a cut cancels it."""

    def __init__(self, splits: SplitCommands, split: _Split, loop: asyncio.AbstractEventLoop):
        self._splits = splits
        self._split = split
        self._loop = loop

    def interrupt(self, reason: str) -> None:
        # Quick and safe from any thread: the cancel itself is sent on the loop.
        try:
            self._loop.call_soon_threadsafe(self._splits.cancel, self._split, reason)
        except RuntimeError:
            pass  # The loop is closed: the serve process is going, and the lease ends the job.


class _ModelClient:
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
        splits = self._splits
        split = splits.find()
        if split is None:
            raise ProviderError("this request has no cluster command to run under")
        runner = splits._runner
        loop = runner._require_loop()
        ws.check()
        with ws.register(_RemoteCut(splits, split, loop)):
            future = asyncio.run_coroutine_threadsafe(
                splits.request(
                    split, messages, {"tools": tools, "stream": stream, **params}, on_token
                ),
                loop,
            )
            bound = runner.unwind_timeout + runner.rpc_grace + SAFETY_MARGIN
            outcome = future.result(runner.command_timeout + bound)
        receipt = outcome.receipt
        result = receipt.get("result") if receipt is not None else None
        if isinstance(result, ChatResult):
            return result
        if split.reason is not None and split.reason != "lost":
            raise Interrupted(split.reason)
        if outcome.lost or split.reason == "lost":
            raise ProviderError(
                f"the command host on node {outcome.node_ip or outcome.node} was lost"
            )
        if receipt is not None and receipt.get("error"):
            raise ProviderError(str(receipt["error"]))
        raise ProviderError("the command host answered without a reply")


class SplitSink:
    """The ``CommandSink`` of a split command: the host's facts merged into its ``complete``."""

    def __init__(self, sink: CommandSink, split: Callable[[], _Split | None]) -> None:
        self._sink = sink
        self._split = split

    def started(self, command: CommandRecord) -> None:
        self._sink.started(command)

    def output(self, command: CommandRecord, stream: Stream, data: str) -> None:
        self._sink.output(command, stream, data)

    def confirm_required(self, command: CommandRecord, message: str) -> None:
        self._sink.confirm_required(command, message)

    def complete(self, command: CommandRecord, result: dict[str, Any]) -> None:
        split = self._split()
        if split is not None and split.outcomes:
            assert isinstance(command, RunningCommand)
            merge(result, split.outcomes, command.scope.cancelled_at)
        # ``result`` is changed in place: the runner hands the same dict to its
        # observer (the metrics) right after this.
        self._sink.complete(command, result)


def merge(
    result: dict[str, Any],
    outcomes: list[tuple[Outcome, float | None]],
    local_cancelled_at: float | None,
) -> None:
    """Fold the host facts of a split command's model requests into its local ``complete``."""
    lifecycle = result["lifecycle"]
    steps: list[dict[str, Any]] = list(lifecycle.get("timeline") or [])
    for outcome, cancelled_at in outcomes:
        remote = facts(
            outcome,
            reason=result["reason"],
            cancelled_at=cancelled_at,
            elapsed_ms=0.0,
        )["lifecycle"]
        if outcome.lost:
            result["status"], result["reason"] = "error", "lost"
            result["error"] = result["error"] or (
                f"the command host on node {outcome.node_ip or outcome.node} was lost"
            )
        lifecycle["worker_exited"] = _all(lifecycle["worker_exited"], remote["worker_exited"])
        for key in ("open_requests", "open_processes"):
            lifecycle[key] = _sum(lifecycle[key], remote[key])
        lifecycle["node"], lifecycle["node_ip"] = remote["node"], remote["node_ip"]
        if "force_killed" in remote:
            lifecycle["force_killed"] = remote["force_killed"]
        if local_cancelled_at is not None and cancelled_at is not None:
            shift = (cancelled_at - local_cancelled_at) * 1000
            for step in remote.get("timeline") or ():
                event = step["event"]
                if event == "cancel_requested":
                    continue  # The local command's own, at 0.
                if event == "worker_exited":
                    event = "host_worker_exited"  # The local worker's comes from the local runner.
                steps.append({"event": event, "ms": round(step["ms"] + shift, 3)})
    if "timeline" in lifecycle:
        lifecycle["timeline"] = sorted(steps, key=lambda step: float(step["ms"]))


def _all(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _sum(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b
