"""``HostPool``: the serve process's command hosts and node wardens, one of each per node.

Runs on the serve process's event loop. It creates, on every alive node of
the cluster (or the ones it was given), a ``NodeWarden`` and a
``CommandHost`` with ``slots`` command threads; renews each host's lease and
reads its counts every ``renew_every`` seconds; notices nodes that joined
(a host is made for them) and hosts that died (their jobs are told);
sends cancels by each host's cancel line (``_line``), or batched per host
into one control call when it has none; and kills a host, saying it is gone
only once that node's warden saw the process gone.

Hosts are detached actors named ``wirecut-<serve id>-<n>`` in the namespace
``wirecut``: they outlive a serve process that was killed, for as long as
their lease, so that they can cancel their commands in order (see
``_host``). ``shutdown()`` kills them. Wardens are ordinary actors: they die
with the serve process, which is the only one that asks them anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from wirecut.console.cluster._host import CommandHost, HostConfig, HostIdentity, NodeWarden
from wirecut.console.cluster._line import LineClient

__all__ = ["NAMESPACE", "Host", "HostPool", "HostState"]

_log = logging.getLogger("wirecut.cluster")

#: The Ray namespace of wirecut's actors.
NAMESPACE = "wirecut"
#: Control calls a host serves at once beside its commands (cancel, confirm, renew ...).
CONTROL_THREADS = 16
#: How long a host may take to start (its actor created and answering) before it is given up.
START_TIMEOUT = 60.0
#: How long a renew may take before the host counts as unreachable.
RENEW_TIMEOUT = 5.0
#: Cancel calls to one host in flight at once; the cancels made while they
#: are out wait for an answer and then travel together. Two, not one: with
#: one, a burst's later cancels waited out the first call's whole round trip
#: (docs/cluster.md, "Measured").
CANCEL_CALLS = 2
#: How long a cancel call to a host that has one out already waits for more
#: cancels, in seconds. A burst's frames are read over a few milliseconds:
#: sent at once, the second call carried the one or two cancels read so far,
#: and the rest of the burst waited for an answer (docs/cluster.md, "Measured").
CANCEL_GATHER = 0.002
#: How long a cancel call may hold back the next one to the same host.
CANCEL_SLOT = 0.5
#: How long, after ``ray.kill``, the warden is asked whether the process is gone.
KILL_CONFIRM = 3.0
#: How long one question to the warden may go unanswered before it counts as unreachable.
KILL_ANSWER = 5.0
#: Between two questions to the warden, in seconds.
KILL_POLL = 0.02
#: The least time between two tries to connect a host's cancel line, in
#: seconds: one that could not connect, or broke, is tried again at a renew
#: at least this long after the last try.
LINE_RETRY = 2.0


class HostState(enum.Enum):
    """Where a command host is in its life, as the serve process knows it."""

    STARTING = "starting"  # the actor was created; it has not answered ``where`` yet
    READY = "ready"  # takes commands; its lease is renewed
    UNREACHABLE = "unreachable"  # its last control call failed or timed out: no new commands
    GONE = "gone"  # dead (its process or node was lost) or killed by us: never used again


@dataclass(eq=False)
class Host:
    """One command host as the pool sees it (event loop only)."""

    name: str
    node_id: str
    actor: Any
    slots: int
    state: HostState = HostState.STARTING
    identity: HostIdentity | None = None
    #: Jobs sent to it and not ended (including ones waiting in Ray's queue).
    jobs: set[Any] = field(default_factory=set)
    #: Its last ``renew`` answer: the counts of its command runner.
    counts: dict[str, Any] = field(default_factory=dict)
    pending_cancels: list[tuple[Any, str]] = field(default_factory=list)
    cancel_scheduled: bool = False
    cancels_in_flight: int = 0
    renewing: bool = False
    #: Its cancel line, once connected; cancels go by the control call without one.
    line: LineClient | None = None
    #: A try to connect the line is under way; the next may start at ``line_retry_at``.
    line_connecting: bool = False
    line_retry_at: float = 0.0
    #: A try failed and was logged as a warning (the later ones are not).
    line_warned: bool = False
    #: Cancels sent to it by its line and by the control call (for health).
    cancels_by_line: int = 0
    cancels_by_ray: int = 0
    killed: asyncio.Future[bool | None] | None = None
    killed_at: float | None = None
    gone_at: float | None = None

    @property
    def node_ip(self) -> str | None:
        return None if self.identity is None else self.identity.node_ip

    @property
    def waiting(self) -> int:
        """Jobs sent here that have not started: they wait in Ray's queue of this actor."""
        return sum(1 for job in self.jobs if not job.started)


class HostPool:
    """The command hosts of one serve process. Event loop only, after ``start()``.

    Cancellation: ``shutdown()`` stops the renewals and kills every host and
    warden; the jobs still on them are the runner's to end first.
    """

    def __init__(
        self,
        config: HostConfig,
        *,
        nodes: Iterable[str] | None = None,
        renew_every: float | None = None,
        on_host_gone: Callable[[Host], None] = lambda host: None,
    ) -> None:
        # The hosts' cancel lines take this pool's token only.
        self.config = replace(config, line_token=config.line_token or secrets.token_urlsafe(24))
        self.serve_id = secrets.token_hex(4)
        self._only_nodes = None if nodes is None else set(nodes)
        self.renew_every = renew_every or max(0.2, min(1.0, config.lease_seconds / 4))
        self._on_host_gone = on_host_gone
        self.hosts: list[Host] = []
        self.wardens: dict[str, Any] = {}
        self.node_ips: dict[str, str] = {}
        self.alive_nodes: set[str] = set()
        self.changed = asyncio.Event()
        self._serial = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._host_class: Any = None
        self._closed = False

    # -- life -------------------------------------------------------------------------

    def start(self) -> None:
        """Begin: make the hosts of every alive node, then keep renewing (on the loop)."""
        self._renewer = asyncio.get_running_loop().create_task(self._renew_loop())

    async def shutdown(self) -> None:
        """Stop renewing; kill every host and warden. Their leases would end them anyway."""
        self._closed = True
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        for task in list(self._tasks):
            task.cancel()
        for host in self.hosts:
            host.state = HostState.GONE
            if host.line is not None:
                host.line.close()
            with contextlib.suppress(Exception):
                ray.kill(host.actor, no_restart=True)
        for warden in self.wardens.values():
            with contextlib.suppress(Exception):
                ray.kill(warden, no_restart=True)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- placing commands ---------------------------------------------------------------

    def ready(self) -> list[Host]:
        return [h for h in self.hosts if h.state is HostState.READY]

    def pick(self) -> Host | None:
        """The ready host with the fewest jobs (a free slot if any has one), or None."""
        ready = self.ready()
        if not ready:
            return None
        return min(ready, key=lambda h: (len(h.jobs) >= h.slots, len(h.jobs)))

    @property
    def saturated(self) -> bool:
        """True when a job sent now would wait in Ray's queue: no ready host has a free slot."""
        return all(len(h.jobs) >= h.slots for h in self.ready())

    # -- control calls --------------------------------------------------------------------

    def cancel(self, host: Host, job: Any, reason: str) -> None:
        """Send a cancel for ``job``; the host's answer goes to ``job.on_cancel_answer``.

        Never blocks. By the host's cancel line if it has one: one write,
        read by a thread of the host that does nothing else. Otherwise (and
        for what the line cannot settle) by the control call, ``by_ray``.
        """
        if host.line is not None and host.line.send(job, reason):
            host.cancels_by_line += 1
            return
        self.by_ray(host, job, reason)

    def by_ray(self, host: Host, job: Any, reason: str) -> None:
        """Send a cancel for ``job`` by the ``cancel`` control call.

        Never blocks. At most ``CANCEL_CALLS`` control calls per host are in
        flight. The first goes at once; one made while another is out waits
        ``CANCEL_GATHER`` for the rest of a burst; the cancels made while both
        are out wait for an answer (a few milliseconds) and then travel
        together: a burst of cancels costs a few calls, not one each, on a
        loop that is busy with the bursts' output too.
        """
        host.cancels_by_ray += 1
        host.pending_cancels.append((job, reason))
        if host.cancels_in_flight < CANCEL_CALLS and not host.cancel_scheduled:
            host.cancel_scheduled = True
            loop = asyncio.get_running_loop()
            if host.cancels_in_flight:
                loop.call_later(CANCEL_GATHER, self._flush_cancels, host)
            else:
                loop.call_soon(self._flush_cancels, host)

    def _flush_cancels(self, host: Host) -> None:
        host.cancel_scheduled = False
        batch, host.pending_cancels = host.pending_cancels, []
        if not batch:
            return
        try:
            ref = host.actor.cancel.remote([(job.id, reason) for job, reason in batch])
        except RayError as exc:
            for job, _ in batch:
                job.on_control_error(exc)
            return
        host.cancels_in_flight += 1
        self._spawn(self._cancel_answers(host, batch, asyncio.wrap_future(ref.future())))

    async def _cancel_answers(
        self, host: Host, batch: list[tuple[Any, str]], answer: asyncio.Future[Any]
    ) -> None:
        released = False

        def next_batch() -> None:
            nonlocal released
            if not released:
                released = True
                host.cancels_in_flight -= 1
                if host.pending_cancels and not host.cancel_scheduled:
                    self._flush_cancels(host)

        try:
            try:
                answers = await asyncio.wait_for(asyncio.shield(answer), CANCEL_SLOT)
            except TimeoutError:
                next_batch()  # A slow host must not hold back the cancels behind this one.
                answers = await answer
        except RayError as exc:
            if isinstance(exc, ActorDiedError):
                self.mark_gone(host)
            for job, _ in batch:
                job.on_control_error(exc)
            return
        finally:
            next_batch()
        for (job, _), (kind, receipt) in zip(batch, answers, strict=True):
            job.on_cancel_answer(kind, receipt)

    def mark_gone(self, host: Host) -> None:
        """``host`` is dead (Ray said so) or killed: no more jobs, and its jobs are told."""
        if host.state is HostState.GONE:
            return
        host.state = HostState.GONE
        host.gone_at = time.monotonic()
        if host.line is not None:
            host.line.close()
        self.changed.set()
        self._on_host_gone(host)

    async def kill(self, host: Host) -> bool | None:
        """Kill ``host`` (no restart); True once its node's warden saw the process gone.

        False: the warden saw it still running for ``KILL_CONFIRM`` seconds;
        None: nobody could tell (the warden, or its node, did not answer a
        question within ``KILL_ANSWER`` seconds).
        Concurrent calls share the one kill and its answer.
        """
        if host.killed is None:
            host.killed = asyncio.get_running_loop().create_future()
            host.killed_at = time.monotonic()
            self.mark_gone(host)
            result = await self._kill_and_confirm(host)
            host.killed.set_result(result)
        return await asyncio.shield(host.killed)

    async def _kill_and_confirm(self, host: Host) -> bool | None:
        with contextlib.suppress(Exception):
            ray.kill(host.actor, no_restart=True)
        warden = self.wardens.get(host.node_id)
        identity = host.identity
        if warden is None or identity is None:
            return None
        deadline = time.monotonic() + KILL_CONFIRM
        while True:
            # Each question has its own bound: a slow answer (a loaded node)
            # is still an answer, and only none at all means unreachable.
            try:
                gone = await asyncio.wait_for(
                    warden.gone.remote(identity.pid, identity.start_ticks), KILL_ANSWER
                )
            except (RayError, TimeoutError):
                return None  # The warden (and likely its node) is unreachable: unconfirmed.
            if gone:
                return True
            if time.monotonic() >= deadline:
                return False  # Seen running after the kill, for the whole window.
            await asyncio.sleep(KILL_POLL)

    # -- keeping the pool ----------------------------------------------------------------

    async def _renew_loop(self) -> None:
        while not self._closed:
            try:
                await self._refresh_nodes()
            except Exception:  # A failed look at the nodes must not stop the renewals.
                _log.exception("listing the cluster's nodes failed")
            # Forget hosts that are gone once no job of theirs is left to settle.
            self.hosts = [h for h in self.hosts if h.state is not HostState.GONE or h.jobs]
            for host in self.hosts:
                # Each host on its own: one that hangs must not hold up the leases of the others.
                if _renewable(host) and not host.renewing:
                    host.renewing = True
                    self._spawn(self._renew(host))
            await asyncio.sleep(self.renew_every)

    async def _renew(self, host: Host) -> None:
        try:
            await self._renew_once(host)
        finally:
            host.renewing = False

    async def _renew_once(self, host: Host) -> None:
        timeout = min(RENEW_TIMEOUT, self.config.lease_seconds / 2)
        try:
            counts = await asyncio.wait_for(host.actor.renew.remote(), timeout)
        except ActorDiedError:
            self.mark_gone(host)
            return
        except (RayError, TimeoutError):
            if host.state is HostState.READY:
                host.state = HostState.UNREACHABLE
                self.changed.set()
            return
        host.counts = counts
        if host.state is HostState.UNREACHABLE:
            host.state = HostState.READY
            self.changed.set()
        # A line that could not connect, or broke, is tried again.
        self._connect_line_if_lost(host)

    async def _refresh_nodes(self) -> None:
        nodes = await asyncio.to_thread(ray.nodes)
        alive = set()
        for node in nodes:
            node_id = node["NodeID"]
            self.node_ips[node_id] = node.get("NodeManagerAddress", "")
            if node.get("Alive") and (self._only_nodes is None or node_id in self._only_nodes):
                alive.add(node_id)
        self.alive_nodes = alive
        for host in self.hosts:
            if host.node_id not in alive and host.state is not HostState.GONE:
                self.mark_gone(host)
        for node_id in alive:
            if not any(h.node_id == node_id and h.state is not HostState.GONE for h in self.hosts):
                self._make_host(node_id)
        for node_id in list(self.wardens):
            if node_id not in alive:
                del self.wardens[node_id]

    def _make_host(self, node_id: str) -> None:
        strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
        if node_id not in self.wardens:
            self.wardens[node_id] = (
                ray.remote(NodeWarden)
                .options(num_cpus=0, max_restarts=0, scheduling_strategy=strategy)
                .remote()
            )
        name = f"wirecut-{self.serve_id}-{next(self._serial)}"
        if self._host_class is None:
            # Concurrency groups are the class's, not an option of one actor.
            # (Ray's type stubs do not list the argument: hence the Any.)
            groups = {"commands": self.config.slots, "control": CONTROL_THREADS}
            make_remote: Any = ray.remote
            self._host_class = make_remote(concurrency_groups=groups)(CommandHost)
        actor = self._host_class.options(
            name=name,
            namespace=NAMESPACE,
            lifetime="detached",
            num_cpus=0,
            max_restarts=0,
            max_task_retries=0,
            scheduling_strategy=strategy,
        ).remote(self.config)
        host = Host(name=name, node_id=node_id, actor=actor, slots=self.config.slots)
        self.hosts.append(host)
        self._spawn(self._await_ready(host))

    async def _await_ready(self, host: Host) -> None:
        try:
            where = host.actor.where.remote()
            identity: HostIdentity = await asyncio.wait_for(where, START_TIMEOUT)
            host.identity = identity
        except (RayError, TimeoutError) as exc:
            _log.warning(
                "command host %s on node %s did not start: %s", host.name, host.node_id, exc
            )
            self.mark_gone(host)
            with contextlib.suppress(Exception):
                ray.kill(host.actor, no_restart=True)
            return
        if host.state is HostState.STARTING:
            host.state = HostState.READY
            self.changed.set()
            self._connect_line_if_lost(host)

    def _connect_line_if_lost(self, host: Host) -> None:
        """Connect ``host``'s cancel line if it has none or it broke (once per ``LINE_RETRY``)."""
        identity = host.identity
        if (
            self._closed
            or host.state is not HostState.READY
            or identity is None
            or identity.line_port is None
            or host.line_connecting
            or (host.line is not None and not host.line.closed)
            or time.monotonic() < host.line_retry_at
        ):
            return
        host.line_connecting = True
        host.line_retry_at = time.monotonic() + LINE_RETRY
        self._spawn(self._connect_line(host, (identity.node_ip, identity.line_port)))

    async def _connect_line(self, host: Host, address: tuple[str, int]) -> None:
        # Until it is connected (or if it cannot be), cancels go by the control call.
        token = self.config.line_token
        assert token is not None
        try:
            line = await LineClient.connect(
                address, token, lambda job, reason: self.by_ray(host, job, reason), name=host.name
            )
        except (OSError, TimeoutError) as exc:
            # Once a warning, then quietly: a firewall would say it at every try.
            log = _log.debug if host.line_warned else _log.warning
            log(
                "cannot connect the cancel line of %s at %s:%s (%s): its cancels go by Ray",
                host.name,
                *address,
                exc,
            )
            host.line_warned = True
            return
        finally:
            host.line_connecting = False
        if host.state is HostState.GONE or self._closed:
            line.close()
            return
        if host.line_warned:
            _log.info("the cancel line of %s is connected", host.name)
        host.line = line

    # -- health ---------------------------------------------------------------------------

    def by_node(self) -> dict[str, dict[str, Any]]:
        """Counts per node of the hosts that are not gone (for /api/health and /metrics)."""
        nodes: dict[str, dict[str, Any]] = {}
        for host in self.hosts:
            if host.state is HostState.GONE:
                continue  # Its last counts are stale, and its process is gone or going.
            entry = nodes.setdefault(
                host.node_id,
                {
                    "ip": self.node_ips.get(host.node_id) or host.node_ip,
                    "alive": host.node_id in self.alive_nodes,
                    "hosts": {state.value: 0 for state in HostState},
                    "workers": {"max": 0, "busy": 0, "queued": 0, "leaked": 0},
                    "requests": {"open": 0},
                    "processes": {"open": 0},
                    "cancel_lines": 0,
                    "cancels": {"line": 0, "ray": 0},
                },
            )
            entry["hosts"][host.state.value] += 1
            entry["cancel_lines"] += 0 if host.line is None or host.line.closed else 1
            entry["cancels"]["line"] += host.cancels_by_line
            entry["cancels"]["ray"] += host.cancels_by_ray
            workers = host.counts.get("workers", {})
            entry["workers"]["max"] += host.slots
            entry["workers"]["busy"] += int(workers.get("busy", 0))
            entry["workers"]["leaked"] += int(workers.get("leaked", 0))
            entry["workers"]["queued"] += host.waiting
            entry["requests"]["open"] += int(host.counts.get("requests", {}).get("open", 0))
            entry["processes"]["open"] += int(host.counts.get("processes", {}).get("open", 0))
        return nodes


def _renewable(host: Host) -> bool:
    return host.state in (HostState.READY, HostState.UNREACHABLE)
