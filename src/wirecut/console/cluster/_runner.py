"""``ClusterRunner``: the runner core with the commands on a Ray cluster.

The same core (``wirecut.console.runner.RunnerCore``) as ``CommandRunner``,
with three placements: ``HostPlacement`` (a command host), the local
``ThreadPlacement`` and ``SplitPlacement`` (both this process's threads).

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
from dataclasses import dataclass, replace
from typing import Any

import ray
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from wirecut.console.cluster._host import HostConfig
from wirecut.console.cluster._pool import KILL_ANSWER, KILL_CONFIRM, Host, HostPool
from wirecut.console.cluster._remote import Outcome, RemoteJob, remote_facts
from wirecut.console.cluster._split import RemoteBounds, SplitCommands, SplitPlacement
from wirecut.console.commands import CommandSet, Services, Session, builtin_commands
from wirecut.console.runner import (
    CommandEvent,
    CommandRecord,
    CommandState,
    Placement,
    RunnerCore,
    RunnerLimits,
    RunnerObserver,
    ThreadPlacement,
)
from wirecut.console.runner._core import Accepted, Work
from wirecut.console.runner._lifecycle import CommandEvent as _Event
from wirecut.provider import ProviderSpec
from wirecut.record import CompleteFacts, Reason

__all__ = ["LEASE_SECONDS", "ClusterRunner", "ProviderSpec", "RemoteCommand", "placement"]

_log = logging.getLogger("wirecut.cluster")

#: A host whose serve process did not renew its lease for this long cancels its commands.
LEASE_SECONDS = 5.0
#: Beyond the unwind bound: the round trip of a cancel and its receipt.
RPC_GRACE = 2.0
#: How long a command waits for a command host to be ready before it fails.
HOST_WAIT = 60.0
#: Commands that need the store or the connection: they run in the serve process.
LOCAL_COMMANDS = ("help", "jobs", "memory", "curator")


def placement(line: str, commands: CommandSet | None = None) -> str:
    """Where ``line`` runs: "local", "split" (store here, model request remote) or "remote".

    A line that does not parse runs "local": the local runner rejects it
    with its usage, as without a cluster.
    """
    from wirecut.console.commands import CommandError

    try:
        found, args = (commands or builtin_commands()).parse(line)
    except CommandError:
        return "local"
    return _where(found.name, args)


def _where(name: str, args: list[str]) -> str:
    if name == "curator run" and "--consolidate" in args:
        return "split"
    if name.split(" ")[0] in LOCAL_COMMANDS:
        return "local"
    return "remote"


@dataclass(eq=False, kw_only=True)
class RemoteCommand(CommandRecord):
    """A command whose work runs on a command host."""

    job: RemoteJob | None = None
    confirm_pending: bool = False


class HostPlacement(Placement[RemoteCommand]):
    """Runs commands on the cluster's command hosts (see the module docstring).

    ``runner`` is the core (``RunnerCore``): it hears of starts and
    confirmations, and its ``cancel`` is how a lost host ends a command.
    """

    def __init__(self, pool: HostPool, bounds: RemoteBounds, runner: RunnerCore) -> None:
        self.pool = pool
        self._bounds = bounds
        self._runner = runner
        self._jobs = itertools.count(1)
        # Remote commands not yet completed (the health's "waiting for a host").
        self._live: set[RemoteCommand] = set()

    # -- Placement ----------------------------------------------------------------------

    def record(self, accepted: Accepted) -> RemoteCommand:
        return RemoteCommand.of(accepted, self)

    def launch(self, command: RemoteCommand) -> None:
        self._live.add(command)  # Placed on a host by its driver (``settle``).

    def cut(self, command: RemoteCommand, reason: Reason) -> None:
        """Never blocks: the host's cancel is one control call, batched with the others."""
        if command.job is not None:
            command.job.cancel(reason)

    def cancel(self, command: RemoteCommand, reason: Reason) -> bool:
        return command.job is None  # Not sent to any host yet: it never will be.

    def confirm(self, command: RemoteCommand) -> bool:
        job = command.job
        if not command.confirm_pending or job is None:
            return False
        command.confirm_pending = False
        job.host.actor.confirm.remote(job.id)
        return True

    async def settle(self, command: RemoteCommand) -> CompleteFacts:
        try:
            return await self._run(command)
        finally:
            self._live.discard(command)

    async def _run(self, command: RemoteCommand) -> CompleteFacts:
        host = await self._place(command)
        if command.state is CommandState.DONE:  # Cancelled before it reached any host.
            assert command.reason is not None
            return CompleteFacts.unstarted(command.reason, elapsed_ms=command.elapsed_ms)
        if host is None:
            command.lifecycle.fire(CommandEvent.REJECT)
            return CompleteFacts.failed(
                "no command host became ready on the cluster", elapsed_ms=command.elapsed_ms
            )
        job = RemoteJob(
            self.pool,
            host,
            f"{self.pool.serve_id}.{next(self._jobs)}.{command.id}",
            command.line,
            history=_history(command.session),
            on_started=lambda: self._on_started(command),
            on_output=lambda stream, data: _write(command, stream, data),
            on_confirm=lambda message: self._on_confirm(command, message),
            on_news=command.wake.set,
        )
        command.job = job
        job.start()
        while True:
            if job.receipt is not None and command.reason is None:
                job.end()
                return self._by_itself(command, job.outcome())
            if (job.broken is not None or job.host_dead) and command.reason is None:
                self._runner.cancel(command, Reason.LOST)
            if command.reason is not None:
                break
            command.wake.clear()
            await command.wake.wait()
        assert command.cancelled_at is not None
        bounds = self._bounds
        outcome = await job.settle(command.cancelled_at + bounds.unwind_timeout + bounds.rpc_grace)
        if outcome.dropped:
            command.lifecycle.fire(CommandEvent.DROP)
        elif outcome.receipt is not None and outcome.killed_at is None:
            command.lifecycle.fire(CommandEvent.FINISH)
        else:
            command.lifecycle.fire(CommandEvent.UNWIND_EXPIRED)
        _apply_history(command, outcome)
        return remote_facts(
            outcome,
            reason=command.reason,
            cancelled_at=command.cancelled_at,
            elapsed_ms=command.elapsed_ms,
        )

    async def _place(self, command: RemoteCommand) -> Host | None:
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

    def _by_itself(self, command: RemoteCommand, outcome: Outcome) -> CompleteFacts:
        if command.state is CommandState.QUEUED:
            # A receipt without a start: the host refused it (its lease had ended).
            command.lifecycle.fire(CommandEvent.START)
        command.lifecycle.fire(CommandEvent.FINISH)
        _apply_history(command, outcome)
        return remote_facts(outcome, reason=None, cancelled_at=None, elapsed_ms=command.elapsed_ms)

    # -- news from a host (event loop) ------------------------------------------------------

    def _on_started(self, command: RemoteCommand) -> None:
        command.lifecycle.fire(_Event.START)
        self._runner.started(command)

    def _on_confirm(self, command: RemoteCommand, message: str) -> None:
        if command.state is CommandState.RUNNING:
            command.confirm_pending = True
            self._runner.confirm_required(command, message)

    def waiting(self) -> int:
        """Remote commands waiting for a host to be ready (they wait here, not in Ray)."""
        return sum(1 for c in self._live if c.job is None and c.state is not CommandState.DONE)


class ClusterRunner(RunnerCore):
    """Runs a console's commands on a Ray cluster. Use from the event loop thread only.

    Ray must be initialised in this process (``connect``). ``start()``
    (on the loop) creates a ``CommandHost`` with ``limits.workers`` slots on
    every alive node (``nodes``: only these node ids); commands sent before a
    host is ready wait for one. ``shutdown()`` ends every command, remote and
    local, with its ``complete``, then kills the hosts.

    Cancellation: see the module docstring. ``limits.unwind_timeout`` is the
    hosts' bound; the serve process adds ``rpc_grace`` for the round trip,
    and the local placements (split and local commands) allow for both plus
    the kill's confirmation.
    """

    def __init__(
        self,
        services: Services,
        provider: ProviderSpec,
        *,
        commands: CommandSet | None = None,
        limits: RunnerLimits | None = None,
        observer: RunnerObserver | None = None,
        registry: CollectorRegistry | None = None,
        lease_seconds: float = LEASE_SECONDS,
        nodes: Iterable[str] | None = None,
        rpc_grace: float = RPC_GRACE,
    ) -> None:
        limits = limits if limits is not None else RunnerLimits()
        if not math.isfinite(lease_seconds) or lease_seconds <= 0:
            raise ValueError(
                f"lease_seconds must be a finite number of seconds > 0, not {lease_seconds!r}"
            )
        if not ray.is_initialized():
            raise RuntimeError("Ray is not initialised in this process: call connect() first")
        super().__init__(
            commands if commands is not None else builtin_commands(), limits, observer=observer
        )
        self.services = services
        self.rpc_grace = rpc_grace
        self.bounds = RemoteBounds(limits.unwind_timeout, rpc_grace, limits.command_timeout)
        # The host's own backstop: the serve process decides the timeouts.
        backstop = limits.command_timeout + limits.unwind_timeout
        self.pool = HostPool(
            HostConfig(provider, replace(limits, command_timeout=backstop), lease_seconds),
            nodes=nodes,
            on_host_gone=self._host_gone,
        )
        self.hosts = HostPlacement(self.pool, self.bounds, self)
        self.splits = SplitCommands(self.pool, self.bounds)
        client = self.splits.client
        # The split commands' chat client: its requests run on a host.
        local_services = replace(services, chat_client=lambda: client)
        # The local bound covers a split command's remote unwind (the host's
        # bound, the round trip, the kill's confirmation).
        local = RunnerLimits(
            workers=limits.workers,
            command_timeout=limits.command_timeout,
            unwind_timeout=limits.unwind_timeout + rpc_grace + KILL_CONFIRM + KILL_ANSWER + 1.0,
            escalate_after=limits.escalate_after,
        )
        self.threads = ThreadPlacement(local_services, self.commands, local, self)
        self.split = SplitPlacement(self.threads, self.splits)
        if registry is not None:
            registry.register(_NodeCollector(self))

    # -- RunnerCore --------------------------------------------------------------------------

    def _start_placements(self, loop: asyncio.AbstractEventLoop) -> None:
        self.threads.start(loop)
        self.splits.start(loop)
        self.pool.start()

    async def _stop_placements(self) -> None:
        self.threads.stop()
        await self.pool.shutdown()

    def _route(self, line: str) -> tuple[Placement[Any], Work]:
        found, args = self.commands.parse(line)
        where = _where(found.name, args)
        if where == "remote":
            return self.hosts, (found, args)
        if where == "split":
            return self.split, (found, args)
        return self.threads, (found, args)

    def _call_placement(self) -> Placement[Any]:
        return self.threads

    @property
    def saturated(self) -> bool:
        """True when a remote command sent now would wait (in Ray's queue, or for a host)."""
        return self.pool.saturated

    def health(self) -> dict[str, Any]:
        """The ``/api/health`` body: the protocol's totals over this process and every node.

        ``nodes`` (added) has the same counts per node id, "local" for this
        process's own threads, with each node's address and whether it is alive.
        """
        local = self.threads.health()
        nodes: dict[str, Any] = {
            "local": {
                "ip": None,
                "alive": True,
                "workers": dict(local["workers"]),
                "requests": dict(local["requests"]),
                "processes": dict(local["processes"]),
            }
        }
        # Commands waiting for a host to be ready wait here, not in Ray.
        nodes["local"]["workers"]["queued"] += self.hosts.waiting()
        nodes.update(self.pool.by_node())
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

    def _host_gone(self, host: Host) -> None:
        for job in list(host.jobs):
            job.on_host_gone()


def _write(command: CommandRecord, stream: Any, data: str) -> None:
    if command.output is not None:
        command.output.write(stream, data)


def _history(session: Session) -> list[dict[str, Any]]:
    with session.lock:
        return [dict(message) for message in session.chat_history]


def _apply_history(command: CommandRecord, outcome: Outcome) -> None:
    receipt = outcome.receipt
    if receipt is not None and receipt.chat_history is not None:
        with command.session.lock:
            command.session.chat_history[:] = receipt.chat_history


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
        lines = GaugeMetricFamily(
            "wirecut_node_cancel_lines",
            "Command hosts on each node whose cancel line is connected.",
            labels=["node", "ip"],
        )
        cancels = CounterMetricFamily(
            "wirecut_node_cancels",
            "Cancels sent to each node's command hosts, by way: line or ray.",
            labels=["node", "ip", "way"],
        )
        for node, entry in nodes.items():
            values = [node, entry["ip"] or ""]
            for key, gauge in gauges.items():
                gauge.add_metric(values, entry["workers"][key])
            requests.add_metric(values, entry["requests"]["open"])
            processes.add_metric(values, entry["processes"]["open"])
            alive.add_metric(values, 1 if entry["alive"] else 0)
            if "cancels" in entry:  # a node of command hosts, not "local"
                lines.add_metric(values, entry["cancel_lines"])
                for way, count in entry["cancels"].items():
                    cancels.add_metric([*values, way], count)
        yield from gauges.values()
        yield requests
        yield processes
        yield alive
        yield lines
        yield cancels
