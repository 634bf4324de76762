"""``ClusterRunner``: the ``Runner`` contract with the commands on a Ray cluster.

The console, its WebSocket, each command's lifecycle (the table in
``wirecut.console.runner._lifecycle``) and its one ``complete`` stay in the
serve process, on its event loop; what runs where:

- on a command host (``_host``, one per node): the commands that need
  neither the note store nor the connection's ``jobs`` list: ``chat``,
  ``sleep``, ``probe`` and any command registered later. The host runs each
  under a fresh scope on a thread of its own ``CommandRunner`` and streams
  its news back; the ``complete`` here carries the host's facts
  (``lifecycle.node`` names the node);
- in this process, on a local ``CommandRunner``: ``help``, ``jobs``,
  ``memory ...``, ``curator status`` and ``curator run`` without
  ``--consolidate``: the store is one machine's SQLite file;
- split: ``curator run --consolidate`` runs here, and only its model
  request goes to a host (``_split``): the plan is made there and comes
  back; it is validated and applied here, in the store's one transaction.

The unwind of a remote command. Cancel, timeout, disconnect and shutdown
send ``scope.cancel(reason)`` to the host through its control group; the
host's runner waits (within the unwind bound) for the worker to return and
the ledger to drain, and its receipt ends the stream. The serve process
waits for that receipt until the unwind bound plus ``rpc_grace``. If it does
not come, or it says the worker is still running, or the host died, the host
is killed and its node's warden asked: ``worker_exited`` is True only when
the warden saw the process gone, None when nobody could tell. A command
whose host was lost before its receipt completes ``error`` with reason
``lost`` (also when a cancel came first: its unwind was not confirmed), never
``cancelled``.

A command waits in Ray's queue of its host's actor when every slot is
taken; a cancel then tombstones it on the host (it will never run) and takes
it out of Ray's queue: ``started: false``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import ray
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from wirecut.console.cluster._host import HostConfig
from wirecut.console.cluster._pool import KILL_CONFIRM, Host, HostPool
from wirecut.console.cluster._remote import Outcome, RemoteJob, facts
from wirecut.console.cluster._split import SplitCommands
from wirecut.console.commands import CommandError, Services, Session, Stream, parse
from wirecut.console.runner import (
    CommandEvent,
    CommandLifecycle,
    CommandRunner,
    CommandSink,
    CommandState,
    OutputBuffer,
    RunnerObserver,
    RunningCommand,
)

__all__ = ["LEASE_SECONDS", "ClusterCommand", "ClusterRunner", "ProviderSpec", "placement"]

_log = logging.getLogger("wirecut.cluster")

#: A host whose serve process did not renew its lease for this long cancels its commands.
LEASE_SECONDS = 5.0
#: Beyond the unwind bound: the round trip of a cancel and its receipt.
RPC_GRACE = 2.0
#: How long a command waits for a command host to be ready before it fails.
HOST_WAIT = 60.0
#: Commands that need the store or the connection: they run in the serve process.
LOCAL_COMMANDS = ("help", "jobs", "memory", "curator")


class _NoObserver:
    def completed(self, facts: dict[str, Any], cancel_to_complete_ms: float | None) -> None:
        pass

    def output_dropped(self, characters: int) -> None:
        pass


@dataclass(frozen=True)
class ProviderSpec:
    """The provider the hosts talk to: it must be reachable from every node."""

    base_url: str
    api_key: str | None = None
    model: str | None = None
    label: str = ""
    max_tokens: int = 256


def placement(line: str) -> str:
    """Where ``line`` runs: "local", "split" (store here, model request remote) or "remote".

    A line that does not parse runs "local": the local runner rejects it
    with its usage, as without a cluster.
    """
    try:
        found, args = parse(line)
    except CommandError:
        return "local"
    if found.name == "curator run" and "--consolidate" in args:
        return "split"
    if found.name.split(" ")[0] in LOCAL_COMMANDS:
        return "local"
    return "remote"


@dataclass(eq=False)
class ClusterCommand:
    """The record of a command that runs on a host (read it; only the runner changes it)."""

    id: str
    line: str
    session: Session
    sink: CommandSink
    lifecycle: CommandLifecycle
    timeout: float
    accepted_at: float = field(default_factory=time.monotonic)
    output: OutputBuffer | None = None
    job: RemoteJob | None = None
    #: The first reason the runner cancelled it with (None: it ran to its end).
    reason: str | None = None
    cancelled_at: float | None = None
    completed_at: float | None = None
    confirm_pending: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    timeout_handle: asyncio.TimerHandle | None = None

    @property
    def state(self) -> CommandState:
        return self.lifecycle.state

    @property
    def elapsed_ms(self) -> float:
        return (time.monotonic() - self.accepted_at) * 1000


class ClusterRunner:
    """Runs a console's commands on a Ray cluster. Use from the event loop thread only.

    Ray must be initialised in this process (``connect``). ``start()``
    (on the loop) creates a ``CommandHost`` with ``workers`` slots on every
    alive node (``nodes``: only these node ids); commands sent before a host
    is ready wait for one. ``shutdown()`` ends every command, remote and
    local, with its ``complete``, then kills the hosts.

    Cancellation: see the module docstring. ``unwind_timeout`` is the
    hosts' bound; the serve process adds ``rpc_grace`` for the round trip,
    and the local runner (split and local commands) allows for both plus the
    kill's confirmation.
    """

    def __init__(
        self,
        services: Services,
        provider: ProviderSpec,
        *,
        workers: int = 4,
        command_timeout: float = 60.0,
        unwind_timeout: float = 10.0,
        escalate_after: float | None = None,
        observer: RunnerObserver | None = None,
        registry: CollectorRegistry | None = None,
        lease_seconds: float = LEASE_SECONDS,
        nodes: Iterable[str] | None = None,
        rpc_grace: float = RPC_GRACE,
    ) -> None:
        for name, value in (
            ("command_timeout", command_timeout),
            ("unwind_timeout", unwind_timeout),
            ("lease_seconds", lease_seconds),
        ):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number of seconds > 0, not {value!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, not {workers!r}")
        if not ray.is_initialized():
            raise RuntimeError("Ray is not initialised in this process: call connect() first")
        self.services = services
        self.command_timeout = command_timeout
        self.unwind_timeout = unwind_timeout
        self.rpc_grace = rpc_grace
        self.observer: RunnerObserver = observer or _NoObserver()
        self.split = SplitCommands(self)
        # The local runner: its bound covers a split command's remote unwind
        # (the host's bound, the round trip, the kill's confirmation).
        self.local = CommandRunner(
            Services(
                store=services.store,
                chat_client=self.split.model_client,
                model=services.model,
                provider_label=services.provider_label,
                max_tokens=services.max_tokens,
            ),
            workers=workers,
            command_timeout=command_timeout,
            unwind_timeout=unwind_timeout + rpc_grace + KILL_CONFIRM + 1.0,
            escalate_after=escalate_after,
            observer=self.observer,
        )
        self.pool = HostPool(
            HostConfig(
                base_url=provider.base_url,
                api_key=provider.api_key,
                model=provider.model,
                provider_label=provider.label,
                max_tokens=provider.max_tokens,
                slots=workers,
                unwind_timeout=unwind_timeout,
                escalate_after=escalate_after,
                command_timeout=command_timeout + unwind_timeout,
                lease_seconds=lease_seconds,
            ),
            nodes=nodes,
            on_host_gone=self._host_gone,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._commands: set[ClusterCommand] = set()
        self._drivers: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._jobs = itertools.count(1)
        self._closing = False
        if registry is not None:
            registry.register(_NodeCollector(self))

    # -- the Runner contract (event loop) -----------------------------------------------

    def start(self) -> None:
        """Bind to the running loop and start the hosts (call from the loop, before submit)."""
        self._loop = asyncio.get_running_loop()
        self.local.start()
        self.pool.start()

    def new_id(self) -> str:
        return f"s{next(self._ids)}"

    @property
    def saturated(self) -> bool:
        """True when a remote command sent now would wait (in Ray's queue, or for a host)."""
        return self.pool.saturated

    def submit(
        self,
        id: str,
        line: str,
        session: Session,
        sink: CommandSink,
        *,
        timeout: float | None = None,
    ) -> ClusterCommand | RunningCommand:
        """Accept ``line`` as command ``id``: on a host, here, or split (see the module)."""
        loop = self._require_loop()
        if self._closing:
            raise RuntimeError("the console is shutting down")
        where = placement(line)
        if where == "local":
            return self.local.submit(id, line, session, sink, timeout=timeout)
        if where == "split":
            return self.split.submit(id, line, session, sink, timeout=timeout)
        limit = self.command_timeout if timeout is None else min(timeout, self.command_timeout)
        command = ClusterCommand(
            id=id,
            line=line,
            session=session,
            sink=sink,
            lifecycle=CommandLifecycle(id),
            timeout=limit,
        )
        command.output = OutputBuffer(
            loop,
            lambda stream, data: sink.output(command, stream, data),
            on_dropped=self.observer.output_dropped,
        )
        self._commands.add(command)
        task = loop.create_task(self._drive(command))
        self._drivers.add(task)
        task.add_done_callback(self._drivers.discard)
        return command

    def cancel(self, command: Any, reason: str) -> bool:
        """Cancel with ``reason`` (first reason wins); False if cancelled or decided already.

        Never blocks: the host's cancel is one control call, sent at the end
        of this turn of the loop together with the others of the turn.
        """
        if isinstance(command, RunningCommand):
            return self.local.cancel(command, reason)
        assert isinstance(command, ClusterCommand)
        if command.reason is not None or command.state is CommandState.DONE:
            return False
        command.reason = reason
        command.cancelled_at = time.monotonic()
        command.lifecycle.fire(CommandEvent.CANCEL)
        if command.job is None:
            command.lifecycle.fire(CommandEvent.DROP)  # Not sent to any host yet.
        else:
            command.job.cancel(reason)
        command.wake.set()
        return True

    def confirm(self, command: Any) -> bool:
        if isinstance(command, RunningCommand):
            return self.local.confirm(command)
        assert isinstance(command, ClusterCommand)
        job = command.job
        if not command.confirm_pending or command.state is not CommandState.RUNNING or job is None:
            return False
        command.confirm_pending = False
        job.host.actor.confirm.remote(job.id)
        return True

    def health(self) -> dict[str, Any]:
        """The ``/api/health`` body: the protocol's totals over this process and every node.

        ``nodes`` (added) has the same counts per node id, "local" for this
        process's own threads, with each node's address and whether it is alive.
        """
        local = self.local.health()
        nodes: dict[str, Any] = {
            "local": {
                "ip": None,
                "alive": True,
                "workers": dict(local["workers"]),
                "requests": dict(local["requests"]),
                "processes": dict(local["processes"]),
            }
        }
        remote = self.pool.by_node()
        # Commands waiting for a host to be ready wait here, not in Ray.
        waiting = sum(
            1 for c in self._commands if c.job is None and c.state is not CommandState.DONE
        )
        nodes["local"]["workers"]["queued"] += waiting
        nodes.update(remote)
        totals = {"max": 0, "busy": 0, "queued": 0, "leaked": 0}
        requests = processes = 0
        for entry in nodes.values():
            for key in totals:
                totals[key] += entry["workers"][key]
            requests += entry["requests"]["open"]
            processes += entry["processes"]["open"]
        return {
            "status": "ok",
            "workers": totals,
            "requests": {"open": requests},
            "processes": {"open": processes},
            "nodes": nodes,
        }

    async def shutdown(self, reason: str = "shutdown") -> None:
        """Cancel every command with ``reason``, wait for each ``complete``, then kill the hosts."""
        self._closing = True
        for command in list(self._commands):
            self.cancel(command, reason)
        waits: list[Any] = [self.local.shutdown(reason)]
        if self._drivers:
            waits.append(asyncio.wait(set(self._drivers)))
        await asyncio.gather(*waits)
        await self.pool.shutdown()

    # -- the driver of a remote command (event loop) ------------------------------------------

    async def _drive(self, command: ClusterCommand) -> None:
        try:
            await self._run(command)
        except Exception as exc:  # A bug here must still end the command, once.
            _log.exception("command %s: the cluster driver failed", command.id)
            if command.state is not CommandState.DONE:
                if command.state is not CommandState.UNWINDING:
                    command.lifecycle.fire(CommandEvent.CANCEL)
                command.lifecycle.fire(CommandEvent.UNWIND_EXPIRED)
                self._send_complete(command, _failure(command, f"{type(exc).__name__}: {exc}"))

    async def _run(self, command: ClusterCommand) -> None:
        host = await self._place(command)
        if command.state is CommandState.DONE:  # Cancelled before it reached any host.
            self._send_complete(command, self._unsent_facts(command))
            return
        if host is None:
            command.lifecycle.fire(CommandEvent.REJECT)
            message = "no command host became ready on the cluster"
            self._send_complete(command, _failure(command, message))
            return
        job = RemoteJob(
            self.pool,
            host,
            f"{self.pool.serve_id}.{next(self._jobs)}.{command.id}",
            command.line,
            history=_history(command.session),
            on_started=lambda: self._on_started(command),
            on_output=lambda stream, data: self._on_output(command, stream, data),
            on_confirm=lambda message: self._on_confirm(command, message),
            on_news=command.wake.set,
        )
        command.job = job
        job.start()
        while True:
            if job.receipt is not None and command.reason is None:
                job.end()
                self._finish_by_itself(command, job.outcome())
                return
            if (job.broken is not None or job.host_dead) and command.reason is None:
                self.cancel(command, "lost")
            if command.reason is not None:
                break
            command.wake.clear()
            await command.wake.wait()
        assert command.cancelled_at is not None
        outcome = await job.settle(command.cancelled_at + self.unwind_timeout + self.rpc_grace)
        if outcome.dropped:
            command.lifecycle.fire(CommandEvent.DROP)
        elif outcome.receipt is not None and outcome.killed_at is None:
            command.lifecycle.fire(CommandEvent.FINISH)
        else:
            command.lifecycle.fire(CommandEvent.UNWIND_EXPIRED)
        self._apply_history(command, outcome)
        self._send_complete(
            command,
            facts(
                outcome,
                reason=command.reason,
                cancelled_at=command.cancelled_at,
                elapsed_ms=command.elapsed_ms,
            ),
        )

    async def _place(self, command: ClusterCommand) -> Host | None:
        deadline = time.monotonic() + HOST_WAIT
        while command.state is not CommandState.DONE:
            host = self.pool.pick()
            if host is not None:
                return host
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.pool.changed.clear()
            waits = [
                asyncio.ensure_future(self.pool.changed.wait()),
                asyncio.ensure_future(command.wake.wait()),
            ]
            await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waits:
                waiter.cancel()
            command.wake.clear()
        return None

    def _finish_by_itself(self, command: ClusterCommand, outcome: Outcome) -> None:
        if command.state is CommandState.QUEUED:
            # A receipt without a start: the host refused it (its lease had ended).
            command.lifecycle.fire(CommandEvent.START)
        command.lifecycle.fire(CommandEvent.FINISH)
        self._apply_history(command, outcome)
        self._send_complete(
            command,
            facts(outcome, reason=None, cancelled_at=None, elapsed_ms=command.elapsed_ms),
        )

    def _unsent_facts(self, command: ClusterCommand) -> dict[str, Any]:
        outcome = Outcome(dropped=True, started=False)
        result = facts(
            outcome,
            reason=command.reason,
            cancelled_at=command.cancelled_at,
            elapsed_ms=command.elapsed_ms,
        )
        lifecycle = result["lifecycle"]
        lifecycle.update(worker_exited=True, open_requests=0, open_processes=0)
        for key in ("node", "node_ip"):
            lifecycle.pop(key, None)
        return result

    def _apply_history(self, command: ClusterCommand, outcome: Outcome) -> None:
        receipt = outcome.receipt
        if receipt is not None and "chat_history" in receipt:
            with command.session.lock:
                command.session.chat_history[:] = receipt["chat_history"]

    def _send_complete(self, command: ClusterCommand, result: dict[str, Any]) -> None:
        """Send the one ``complete`` of ``command``; output after it is dropped."""
        command.completed_at = time.monotonic()
        if command.timeout_handle is not None:
            command.timeout_handle.cancel()
        if command.output is not None:
            command.output.close()
        self._commands.discard(command)
        command.sink.complete(command, result)
        to_complete = None
        if command.reason is not None and command.cancelled_at is not None:
            to_complete = (command.completed_at - command.cancelled_at) * 1000
        self.observer.completed(result, to_complete)

    # -- news from a host (event loop) ------------------------------------------------------

    def _on_started(self, command: ClusterCommand) -> None:
        command.lifecycle.fire(CommandEvent.START)
        if command.state is CommandState.DONE:
            return
        command.sink.started(command)
        if command.state is CommandState.RUNNING:
            command.timeout_handle = self._require_loop().call_later(
                command.timeout, self.cancel, command, "timeout"
            )

    def _on_output(self, command: ClusterCommand, stream: Stream, data: str) -> None:
        if command.output is not None:
            command.output.write(stream, data)

    def _on_confirm(self, command: ClusterCommand, message: str) -> None:
        if command.state is CommandState.RUNNING:
            command.confirm_pending = True
            command.sink.confirm_required(command, message)

    def _host_gone(self, host: Host) -> None:
        for job in list(host.jobs):
            job.on_host_gone()

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("ClusterRunner.start() was not called from the event loop")
        return self._loop


def _history(session: Session) -> list[dict[str, Any]]:
    with session.lock:
        return [dict(message) for message in session.chat_history]


def _failure(command: ClusterCommand, message: str) -> dict[str, Any]:
    return {
        "status": "error",
        "error": message,
        "elapsed_ms": round(command.elapsed_ms, 3),
        "reason": command.reason,
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0},
        "lifecycle": {
            "worker_exited": True if command.job is None else None,
            "open_requests": 0 if command.job is None else None,
            "open_processes": 0 if command.job is None else None,
            "started": False if command.job is None else None,
        },
    }


class _NodeCollector(Collector):
    """``/metrics`` gauges per node: ``wirecut_node_*{node="...",ip="..."}``."""

    def __init__(self, runner: ClusterRunner) -> None:
        self._runner = runner

    def collect(self) -> Any:
        nodes = self._runner.health()["nodes"]
        gauges = {
            key: GaugeMetricFamily(
                f"wirecut_node_workers_{key}",
                f"Workers ({key}) on each node.",
                labels=["node", "ip"],
            )
            for key in ("max", "busy", "queued", "leaked")
        }
        requests = GaugeMetricFamily(
            "wirecut_node_open_requests",
            "Provider requests open on each node.",
            labels=["node", "ip"],
        )
        processes = GaugeMetricFamily(
            "wirecut_node_open_processes", "Processes open on each node.", labels=["node", "ip"]
        )
        alive = GaugeMetricFamily(
            "wirecut_node_alive", "1 if the node is alive.", labels=["node", "ip"]
        )
        for node, entry in nodes.items():
            values = [node, entry["ip"] or ""]
            for key, gauge in gauges.items():
                gauge.add_metric(values, entry["workers"][key])
            requests.add_metric(values, entry["requests"]["open"])
            processes.add_metric(values, entry["processes"]["open"])
            alive.add_metric(values, 1 if entry["alive"] else 0)
        yield from gauges.values()
        yield requests
        yield processes
        yield alive
