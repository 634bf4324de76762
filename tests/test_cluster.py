"""The console's commands on a Ray cluster: two real nodes on loopback, real actors, the simulator.

A two-node cluster (``_ray_cluster``: ``ray start`` twice, 1 CPU each) is
started once for the module; each console is a real ``ConsoleServer`` whose
runner is a ``ClusterRunner``, driven over a real WebSocket. Most consoles
put their command hosts on the second node only, so that every remote claim
is about a process on another node than the one serving the console. The
checks are the local console's (``test_console``), plus where the facts came
from: ``lifecycle.node`` is the second node and the unwind steps include the
host's (``host_cancelled``, ``sockets_shut``).

The order matters once: the last test kills the second node.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from _console import ConsoleClient, health, wait_health
from _ray_cluster import WORKER_IP, RayCluster, ray_missing

_missing = ray_missing()
if _missing is not None:
    pytest.skip(_missing, allow_module_level=True)

import ray  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from wirecut.console.cluster import (  # noqa: E402
    NAMESPACE,
    ClusterRunner,
    CommandHost,
    Host,
    HostConfig,
    HostIdentity,
    HostPool,
    HostReceipt,
    NodeWarden,
    Outcome,
    ProviderSpec,
    placement,
)
from wirecut.console.cluster import _pool as cluster_pool  # noqa: E402
from wirecut.console.cluster._host import gathered  # noqa: E402
from wirecut.console.cluster._remote import remote_facts  # noqa: E402
from wirecut.console.runner import RunnerLimits  # noqa: E402
from wirecut.console.server import ConsoleConfig, ConsoleServer  # noqa: E402
from wirecut.launch import Provider  # noqa: E402
from wirecut.memory import NoteStore  # noqa: E402
from wirecut.record import Reason, Status  # noqa: E402
from wirecut.scope import proc_stat  # noqa: E402
from wirecut.simulator import SimConfig, SimulatorServer  # noqa: E402

pytestmark = pytest.mark.ray

Frame = dict[str, Any]


# -- the cluster and the consoles ----------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    running = RayCluster().start()
    try:
        ray.init(
            address=running.address,
            namespace=NAMESPACE,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
        yield running
    finally:
        ray.shutdown()
        running.stop()


@pytest.fixture(scope="module")
def second(cluster: RayCluster) -> str:
    """The node id of the second node (not the head, not this process's node)."""
    found = [
        n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == WORKER_IP
    ]
    assert len(found) == 1, ray.nodes()
    return str(found[0])


@dataclass
class Remote:
    server: ConsoleServer
    sim: SimulatorServer
    data_dir: Path

    def client(self) -> ConsoleClient:
        return ConsoleClient(self.server.ws_url)


@contextlib.contextmanager
def cluster_console(
    data_dir: Path,
    sim: SimulatorServer,
    *,
    nodes: list[str] | None,
    workers: int = 2,
    unwind_timeout: float = 5.0,
    escalate_after: float | None = None,
) -> Iterator[Remote]:
    """A console whose runner puts its commands on ``nodes`` (all nodes: None)."""
    provider = Provider(sim.base_url, None, "simulator (tests)")
    config = ConsoleConfig(
        port=0, data_dir=data_dir, workers=workers, unwind_timeout=unwind_timeout
    )

    def make_runner(services: Any, metrics: Any) -> ClusterRunner:
        return ClusterRunner(
            services,
            ProviderSpec(sim.base_url),
            limits=RunnerLimits(
                workers=workers, unwind_timeout=unwind_timeout, escalate_after=escalate_after
            ),
            observer=metrics,
            registry=metrics.registry,
            nodes=nodes,
        )

    with ConsoleServer(config, provider, runner=make_runner) as server:
        yield Remote(server, sim, data_dir)


def endless_sim(slots: int = 16, tokens_per_second: float = 50) -> SimulatorServer:
    """A simulator whose replies run to the request's ``max_tokens`` (256 for ``chat``)."""
    return SimulatorServer(
        SimConfig(slots=slots, tokens_per_second=tokens_per_second, prompt_ms=5, endless=True)
    )


@pytest.fixture(scope="module")
def remote(
    cluster: RayCluster, second: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Remote]:
    """One console for the module's simple cases: 2 command slots, on the second node."""
    with (
        endless_sim() as sim,
        cluster_console(tmp_path_factory.mktemp("remote"), sim, nodes=[second]) as running,
    ):
        yield running


# -- helpers ------------------------------------------------------------------------------


def events(complete: Frame) -> list[str]:
    return [step["event"] for step in complete["lifecycle"].get("timeline") or []]


def assert_remote_cut(complete: Frame, reason: str, node: str, status: str = "cancelled") -> None:
    """A cut confirmed by the host on ``node``: its worker returned and its ledger drained."""
    assert complete["status"] == status, complete
    assert complete["reason"] == reason, complete
    lifecycle = complete["lifecycle"]
    assert lifecycle["node"] == node
    assert lifecycle["node_ip"] == WORKER_IP
    assert lifecycle["worker_exited"] is True, complete
    assert lifecycle["open_requests"] == 0
    assert lifecycle["open_processes"] == 0
    assert lifecycle["started"] is True
    steps = events(complete)
    assert steps[0] == "cancel_requested"
    assert "host_cancelled" in steps
    assert "worker_exited" in steps


def metric(server: ConsoleServer, pattern: str) -> float:
    text = httpx.get(server.url + "metrics", params={"token": server.token}).text
    found = re.search(re.escape(pattern) + r" ([0-9.e+]+)", text)
    return float(found.group(1)) if found else 0.0


def wait_token(client: ConsoleClient, id: str, timeout: float = 30) -> None:
    client.wait_for(
        lambda f: f["type"] == "output" and f["id"] == id and f["stream"] == "token", timeout
    )


def wait_started(client: ConsoleClient, id: str, timeout: float = 30) -> None:
    client.wait_for(lambda f: f["type"] == "started" and f["id"] == id, timeout)


def wait_requests_ended(sim: SimulatorServer, timeout: float = 15) -> list[Any]:
    """Poll (bounded) until the simulator has no request left open; returns the open ones."""
    deadline = time.monotonic() + timeout
    while True:
        open_ = [r for r in sim.requests() if r.t_end is None]
        if not open_ or time.monotonic() > deadline:
            return open_
        time.sleep(0.05)


def seed_notes(client: ConsoleClient) -> None:
    for title, body in [("Lyon trip", "train at 9"), ("Lyon hotel", "near the station")]:
        assert client.complete(client.run(f"memory add '{title}' -- '{body}'"))["status"] == "ok"


# -- where each command runs ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "where"),
    [
        ("chat hello", "remote"),
        ("sleep 1", "remote"),
        ("probe sleep", "remote"),
        ("memory list", "local"),
        ("curator status", "local"),
        ("curator run --yes", "local"),
        ("curator run --consolidate --yes", "split"),
        ("jobs", "local"),
        ("help", "local"),
        ("no-such-command", "local"),
        ("'unclosed", "local"),
    ],
)
def test_placement_keeps_the_store_and_the_connection_local(line: str, where: str) -> None:
    assert placement(line) == where


@pytest.mark.parametrize("address", ["", "nonsense", "head:99999", ":6379"])
def test_a_malformed_ray_address_is_a_usage_error_in_one_line(address: str, tmp_path: Path) -> None:
    done = _serve_once(tmp_path, "--ray", address)
    assert done.returncode == 2
    assert "--ray takes auto, local, or HOST:PORT" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_ray_address_where_nothing_listens_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    done = _serve_once(tmp_path, "--ray", f"127.0.0.1:{port}")
    assert done.returncode == 1
    assert f"cannot join the Ray cluster at 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


def _serve_once(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "wirecut", "serve", "--port", "0", "--no-token"),
            *("--data-dir", str(tmp_path), "--provider-url", "http://127.0.0.1:9/v1", *args),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


# -- the promise on the second node, per way of ending a command --------------------------------


def test_a_streaming_chat_cancelled_on_the_second_node_reaches_the_provider(
    remote: Remote, second: str
) -> None:
    since = remote.sim.simulator.event_log.next_seq
    with remote.client() as c:
        id = c.run("chat tell me a long story")
        wait_token(c, id)
        requests_before = len(remote.sim.requests())
        c.cancel(id)
        complete = c.complete(id)
        c.complete(c.run("sleep 0"))  # a sequence point: nothing of `id` after its complete

    assert_remote_cut(complete, "user", second)
    steps = events(complete)
    assert steps.index("sockets_shut") < steps.index("worker_exited")
    assert complete["usage"]["completion_tokens"] >= 1
    assert complete["usage"]["requests"] == 1
    remote.sim.wait_for_event("peer_closed", since=since)
    assert c.of(id)[-1]["type"] == "complete"
    assert len(remote.sim.requests()) == requests_before


def test_a_curator_consolidation_cancelled_on_the_second_node_leaves_the_store(
    remote: Remote, second: str
) -> None:
    with remote.client() as c:
        seed_notes(c)  # runs here, in the serve process: the store is its SQLite file
        store = NoteStore.in_data_dir(remote.data_dir)
        before = store.dump()
        since = remote.sim.simulator.event_log.next_seq
        id = c.run("curator run --consolidate --yes")
        wait_token(c, id)  # the model streams its plan from the second node
        requests_before = len(remote.sim.requests())
        c.cancel(id)
        complete = c.complete(id)
        c.complete(c.run("sleep 0"))

    assert complete["status"] == "cancelled"
    assert complete["reason"] == "user"
    lifecycle = complete["lifecycle"]
    assert lifecycle["node"] == second
    assert lifecycle["worker_exited"] is True  # here, and on the host (its ledger)
    assert lifecycle["open_requests"] == 0
    assert lifecycle["open_processes"] == 0
    steps = events(complete)
    assert steps[0] == "cancel_requested"
    assert "host_cancelled" in steps
    assert "sockets_shut" in steps
    remote.sim.wait_for_event("peer_closed", since=since)
    assert store.dump() == before
    assert len(remote.sim.requests()) == requests_before


def test_a_split_command_is_not_kept_after_its_complete(remote: Remote, second: str) -> None:
    # Its split's jobs hold the worker's token callback, which reaches the
    # command's scope: keyed by that scope, the entry kept its own key alive.
    # And timers set in the worker's context (its model request's, its
    # timeout's) kept the scope until their time, cancelled or not.
    runner = remote.server.state.runner
    with remote.client() as c:
        seed_notes(c)
        id = c.run("curator run --consolidate --yes")
        wait_token(c, id)  # a model request of it is out on the second node

        async def scopes() -> list[weakref.ref[Any]]:
            return [weakref.ref(cmd.scope) for cmd in runner.live() if cmd.id == id]

        refs = asyncio.run_coroutine_threadsafe(scopes(), runner.loop).result(10)
        c.cancel(id)
        complete = c.complete(id)
        c.complete(c.run("sleep 0"))  # a sequence point: nothing of `id` after its complete
    # Its worker thread drops its last local a moment after the exit it
    # reported: nothing signals that, so this polls, with a deadline.
    deadline = time.monotonic() + 10
    while refs and refs[0]() is not None and time.monotonic() < deadline:
        gc.collect()
        threading.Event().wait(0.001)
    assert complete["status"] == "cancelled"
    assert len(refs) == 1
    assert refs[0]() is None


def test_a_consolidation_planned_on_the_second_node_is_applied_here(
    cluster: RayCluster, second: str, tmp_path: Path
) -> None:
    def responder(body: dict[str, Any]) -> dict[str, Any]:
        plan = {"umbrellas": [{"title": "Lyon", "summary": "the trip", "note_ids": [1, 2]}]}
        return {"content": json.dumps(plan)}

    with (
        SimulatorServer(SimConfig(slots=2, prompt_ms=5), responder=responder) as sim,
        cluster_console(tmp_path, sim, nodes=[second]) as running,
        running.client() as c,
    ):
        seed_notes(c)
        complete = c.complete(c.run("curator run --consolidate --yes"))
        output = c.output(complete["id"])

    assert complete["status"] == "ok", (complete, output)
    assert complete["lifecycle"]["node"] == second
    store = NoteStore.in_data_dir(tmp_path)
    umbrellas = [n for n in store.notes() if n.title == "Lyon"]
    assert len(umbrellas) == 1
    assert sorted(n.id for n in store.merged_into(umbrellas[0].id)) == [1, 2]


def test_a_timeout_on_the_second_node_is_reported_as_timeout(remote: Remote, second: str) -> None:
    since = remote.sim.simulator.event_log.next_seq
    with remote.client() as c:
        complete = c.complete(c.run("chat go on forever", timeout=0.5))
    assert_remote_cut(complete, "timeout", second, status="timeout")
    remote.sim.wait_for_event("peer_closed", since=since)


def test_a_dropped_connection_cancels_its_commands_on_the_second_node(
    remote: Remote, second: str
) -> None:
    pattern = 'wirecut_commands_total{reason="disconnect",status="cancelled"}'
    counted = metric(remote.server, pattern)
    since = remote.sim.simulator.event_log.next_seq
    c = remote.client()
    id = c.run("chat a long one please")
    wait_token(c, id)
    sleeper = c.run("sleep 30")
    wait_started(c, sleeper)
    busy = wait_health(remote.server, lambda h: h["nodes"].get(second, {})["workers"]["busy"] == 2)
    c.ws.socket.shutdown(socket.SHUT_RDWR)  # no close handshake: the TCP connection just ends
    c.close()

    remote.sim.wait_for_event("peer_closed", since=since)
    idle = wait_health(
        remote.server,
        lambda h: h["nodes"][second]["workers"]["busy"] == 0 and h["requests"]["open"] == 0,
    )
    assert busy["nodes"][second]["workers"]["busy"] == 2
    assert busy["workers"]["busy"] >= 2  # the totals count the remote workers
    assert idle["nodes"][second]["workers"] == {"max": 2, "busy": 0, "queued": 0, "leaked": 0}
    assert idle["requests"]["open"] == 0
    deadline = time.monotonic() + 10
    while metric(remote.server, pattern) < counted + 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the completes are decided on the server's loop, after the close
    assert metric(remote.server, pattern) == counted + 2
    assert (
        metric(remote.server, f'wirecut_node_workers_max{{ip="{WORKER_IP}",node="{second}"}}') == 2
    )


def test_a_command_queued_in_ray_and_cancelled_never_reaches_the_provider(
    remote: Remote, second: str
) -> None:
    with remote.client() as c:
        blockers = [c.run("sleep 30") for _ in range(2)]  # both slots of the second node's host
        for id in blockers:
            wait_started(c, id)
        requests_before = len(remote.sim.requests())
        queued = c.run("chat hello")
        accepted = c.wait_for(lambda f: f["type"] == "accepted" and f["id"] == queued)
        assert accepted["queued"] is True
        waiting = wait_health(remote.server, lambda h: h["nodes"][second]["workers"]["queued"] == 1)
        c.cancel(queued)
        complete = c.complete(queued)
        for id in blockers:
            c.cancel(id)
            c.complete(id)
        # Sequence points: the host takes calls in order, so the dropped one came up first.
        for _ in range(2):
            assert c.complete(c.run("sleep 0"))["status"] == "ok"
        frames = [f["type"] for f in c.of(queued)]

    assert waiting["nodes"][second]["workers"]["queued"] == 1
    assert complete["status"] == "cancelled"
    assert complete["lifecycle"]["started"] is False
    assert complete["lifecycle"]["worker_exited"] is True
    assert frames == ["accepted", "complete"]
    assert len(remote.sim.requests()) == requests_before


def test_chat_keeps_the_connections_history_across_hosts(
    cluster: RayCluster, tmp_path: Path
) -> None:
    seen: list[list[str]] = []

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        seen.append([m["role"] for m in body["messages"]])
        return {"content": "noted"}

    with (
        SimulatorServer(SimConfig(slots=2, prompt_ms=5), responder=responder) as sim,
        cluster_console(tmp_path, sim, nodes=None) as running,
        running.client() as c,
    ):
        for line in ("chat first", "chat second", "chat --new", "chat third"):
            assert c.complete(c.run(line))["status"] == "ok"
    assert seen == [
        ["system", "user"],
        ["system", "user", "assistant", "user"],
        ["system", "user"],
    ]


def test_a_worker_past_the_bound_is_force_killed_and_its_exit_confirmed(
    cluster: RayCluster, second: str, tmp_path: Path
) -> None:
    with (
        endless_sim(2) as sim,
        # No escalation: `probe python-loop` then spins until its process dies.
        cluster_console(
            tmp_path, sim, nodes=[second], unwind_timeout=1.0, escalate_after=math.inf
        ) as running,
        running.client() as c,
    ):
        id = c.run("probe python-loop")
        c.wait_output(id, 30)
        hosts = _command_host_pids(cluster)
        c.cancel(id)
        complete = c.complete(id, 30)
        after = c.complete(c.run("sleep 0"), 60)  # a new host took the killed one's place

    lifecycle = complete["lifecycle"]
    assert complete["status"] == "cancelled"
    assert lifecycle["worker_exited"] is True
    assert lifecycle["force_killed"] is True
    steps = events(complete)
    assert steps.index("host_killed") < steps.index("worker_exited")
    assert hosts - _command_host_pids(cluster)  # the killed host's process is really gone
    assert after["status"] == "ok"


def _command_host_pids(cluster: RayCluster) -> set[int]:
    pids = set()
    for pid in cluster.node_pids(WORKER_IP):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"ray::CommandHost"):
                    pids.add(pid)
        except OSError:
            continue
    return pids


def test_no_false_cancelled_over_200_randomized_cancels(
    cluster: RayCluster, tmp_path: Path
) -> None:
    rng = random.Random(12)
    lines = ["chat tell me more", "chat and more", "sleep 10", "sleep 0", "probe sleep"]
    completes: list[Frame] = []
    with (
        endless_sim(32) as sim,
        cluster_console(tmp_path, sim, nodes=None, workers=4) as running,
        running.client() as c,
    ):
        for batch in range(8):
            ids = [c.run(rng.choice(lines), id=f"r{batch}-{k}") for k in range(25)]
            for id in ids:
                when = rng.random()
                if when > 0.6:  # once it runs (earlier ones were cancelled: a slot comes free)
                    c.wait_for(
                        lambda f, id=id: f.get("id") == id and f["type"] in ("started", "complete"),
                        30,
                    )
                if when > 0.3:
                    time.sleep(rng.random() * 0.03)  # a random moment, not a synchronisation
                c.cancel(id)
            completes += [c.complete(id, 30) for id in ids]
        still_open = wait_requests_ended(sim)

    assert len(completes) == 200
    false = [
        f
        for f in completes
        if f["status"] == "cancelled"
        and not (
            f["lifecycle"]["worker_exited"] is True
            and f["lifecycle"]["open_requests"] == 0
            and f["lifecycle"]["open_processes"] == 0
        )
    ]
    assert false == []
    assert {f["status"] for f in completes} <= {"cancelled", "ok"}
    assert still_open == []
    kinds = {f["lifecycle"]["started"] for f in completes if f["status"] == "cancelled"}
    assert kinds == {True, False}  # both paths were taken: queued in Ray, and running


# -- the serve process and the node, lost ---------------------------------------------------------


def _named_hosts() -> set[str]:
    return {
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == NAMESPACE and a["name"].startswith("wirecut-")
    }


def test_a_killed_serve_process_leaves_no_command_running(
    cluster: RayCluster, tmp_path: Path
) -> None:
    before = _named_hosts()
    # The replies must outlast the lease (5 s) and the wait below: 256 tokens
    # at 50 tok/s ended on their own in CI before the lease cut them.
    with endless_sim(tokens_per_second=5) as sim:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "wirecut",
                "serve",
                "--port",
                "0",
                "--no-token",
                "--workers",
                "2",
                "--data-dir",
                str(tmp_path),
                "--provider-url",
                sim.base_url,
                "--ray",
                cluster.address,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            banner = proc.stdout.readline()
            assert banner.startswith("wirecut console: "), proc.stderr.read() if proc.stderr else ""
            url = banner.split(": ", 1)[1].strip().replace("http://", "ws://") + "api/console"
            since = sim.simulator.event_log.next_seq
            with ConsoleClient(url) as c:
                ids = [c.run("chat tell me everything") for _ in range(2)]
                for id in ids:
                    wait_token(c, id)
                hosts = _named_hosts() - before
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
            # The hosts' leases end: each cancels its commands (reason shutdown) and exits.
            for _ in ids:
                since = sim.wait_for_event("peer_closed", since=since, timeout=30).seq + 1
            deadline = time.monotonic() + 30
            while _named_hosts() & hosts and time.monotonic() < deadline:
                time.sleep(0.1)
            left = _named_hosts() & hosts
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
    assert hosts
    assert left == set()
    assert wait_requests_ended(sim) == []


# -- the cancel line ----------------------------------------------------------------------------


def _receipt(stream: Iterator[Any], timeout: float = 30) -> HostReceipt:
    items: list[Any] = []
    while not items or items[-1][0] != "complete":
        items += ray.get(next(stream), timeout=timeout)
    receipt: HostReceipt = items[-1][1]
    return receipt


def test_several_cancels_in_one_write_to_the_line_end_every_command(
    cluster: RayCluster, second: str
) -> None:
    ids = ["line-0", "line-1", "line-2"]
    with endless_sim() as sim:
        config = HostConfig(
            ProviderSpec(sim.base_url),
            RunnerLimits(workers=3, unwind_timeout=30.0),
            lease_seconds=60.0,
            line_token="the-token",
        )
        make_remote: Any = ray.remote
        actor = (
            make_remote(concurrency_groups={"commands": 3, "control": 4})(CommandHost)
            .options(
                num_cpus=0,
                max_restarts=0,
                max_task_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(second, soft=False),
            )
            .remote(config)
        )
        try:
            identity: HostIdentity = ray.get(actor.where.remote(), timeout=60)
            assert identity.line_port is not None
            streams = [
                iter(actor.run.remote(id, "chat tell me everything", None, None)) for id in ids
            ]
            for stream in streams:
                items: list[Any] = []
                while not any(item[0] == "output" for item in items):
                    items += ray.get(next(stream), timeout=30)
            address = (identity.node_ip, identity.line_port)
            with socket.create_connection(address, timeout=30) as sock:
                cancels = [json.dumps([id, "user"]) for id in ids]
                sock.sendall("\n".join(["the-token", *cancels, ""]).encode())
                answers = b""
                while answers.count(b"\n") < len(ids):
                    answers += sock.recv(4096)
            assert answers.decode().split() == ["cancelling"] * 3
            for stream in streams:
                facts = _receipt(stream).facts
                assert (facts.status, facts.reason) == (Status.CANCELLED, Reason.USER)
                assert facts.lifecycle.worker_exited is True
                assert facts.lifecycle.open_requests == 0
        finally:
            ray.kill(actor)
    assert wait_requests_ended(sim) == []


def test_a_cancel_to_the_second_node_goes_by_its_cancel_line(remote: Remote, second: str) -> None:
    node = wait_health(remote.server, lambda h: h["nodes"][second]["cancel_lines"] == 1, 30)
    node = node["nodes"][second]
    assert node["cancel_lines"] == 1
    before = node["cancels"]
    with remote.client() as c:
        id = c.run("chat tell me a long story")
        wait_token(c, id)
        c.cancel(id)
        complete = c.complete(id)
    assert_remote_cut(complete, "user", second)
    after = health(remote.server)["nodes"][second]["cancels"]
    assert after == {"line": before["line"] + 1, "ray": before["ray"]}
    labels = f'ip="{WORKER_IP}",node="{second}"'
    assert metric(remote.server, f"wirecut_node_cancel_lines{{{labels}}}") == 1
    for way, count in after.items():
        assert metric(remote.server, f'wirecut_node_cancels_total{{{labels},way="{way}"}}') == count


def cancel_a_stream(running: Remote, node: str) -> tuple[Frame, dict[str, Any]]:
    """A long chat, cancelled once it streams: its ``complete``, then ``node``'s health entry."""
    with running.client() as c:
        id = c.run("chat tell me a long story")
        wait_token(c, id)
        c.cancel(id)
        complete = c.complete(id)
    return complete, health(running.server)["nodes"][node]


def test_where_the_line_cannot_connect_cancels_go_by_ray_and_still_cut(
    second: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionRefusedError("planted: a firewall between the nodes")

    monkeypatch.setattr(cluster_pool.LineClient, "connect", refused)
    with endless_sim() as sim, cluster_console(tmp_path, sim, nodes=[second]) as running:
        complete, node = cancel_a_stream(running, second)
    assert_remote_cut(complete, "user", second)
    assert (node["cancel_lines"], node["cancels"]) == (0, {"line": 0, "ray": 1})
    assert "cannot connect the cancel line" in caplog.text
    assert wait_requests_ended(sim) == []


def test_a_line_that_could_not_connect_or_broke_is_connected_again(
    second: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    connect = cluster_pool.LineClient.connect
    tries: list[asyncio.AbstractEventLoop] = []
    lines: list[cluster_pool.LineClient] = []

    async def refused_twice(*args: Any, **kwargs: Any) -> cluster_pool.LineClient:
        tries.append(asyncio.get_running_loop())
        if len(tries) <= 2:
            raise ConnectionRefusedError("planted: the first two tries are refused")
        lines.append(await connect(*args, **kwargs))
        return lines[-1]

    def lines_of(h: dict[str, Any]) -> int:
        return int(h["nodes"][second]["cancel_lines"])

    monkeypatch.setattr(cluster_pool.LineClient, "connect", refused_twice)
    with endless_sim() as sim, cluster_console(tmp_path, sim, nodes=[second]) as running:
        # Refused at first (a warning, once), it connects at a later renew ...
        assert lines_of(wait_health(running.server, lambda h: lines_of(h) == 1, 30)) == 1
        # ... and once the line is lost, it connects again.
        tries[0].call_soon_threadsafe(lines[0].close)
        node = wait_health(running.server, lambda h: len(lines) == 2 and lines_of(h) == 1, 30)
        assert (len(tries), len(lines), lines_of(node)) == (4, 2, 1)
        complete, node = cancel_a_stream(running, second)
    assert_remote_cut(complete, "user", second)
    assert node["cancels"] == {"line": 1, "ray": 0}
    assert caplog.text.count("cannot connect the cancel line") == 1
    assert wait_requests_ended(sim) == []


def test_a_lost_node_ends_its_commands_as_lost_never_as_cancelled(
    cluster: RayCluster, second: str, tmp_path: Path
) -> None:
    # The last test: it kills the second node.
    with (
        endless_sim(4) as sim,
        cluster_console(tmp_path, sim, nodes=[second]) as running,
        running.client() as c,
    ):
        chat = c.run("chat tell me a long story")
        wait_token(c, chat)
        sleeper = c.run("sleep 30")
        wait_started(c, sleeper)
        killed = cluster.kill_node(WORKER_IP)
        c.cancel(sleeper)  # a cancel racing the loss: its unwind cannot be confirmed
        completes = [c.complete(id, 45) for id in (chat, sleeper)]
        gone = wait_health(running.server, lambda h: not h["nodes"].get(second, {}).get("alive"))

    assert killed
    for complete in completes:
        assert complete["status"] == "error", complete
        assert complete["reason"] == "lost"
        assert complete["lifecycle"]["worker_exited"] is None  # unconfirmable, never a guess
        assert complete["lifecycle"]["node"] == second
        assert "lost" in complete["error"]
    assert not gone["nodes"].get(second, {}).get("alive")
    assert not any(pid for pid in killed if os.path.exists(f"/proc/{pid}/status") and _alive(pid))


def _alive(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")


# -- the warden and the lease, on their own -------------------------------------------------


def test_the_warden_says_a_live_process_is_alive_and_a_gone_or_reused_one_is_gone() -> None:
    warden = NodeWarden()
    proc = subprocess.Popen(["sleep", "60"])
    try:
        stat = proc_stat(proc.pid)
        assert stat is not None
        assert stat.start_ticks is not None
        assert warden.gone(proc.pid, stat.start_ticks) is False
        # The same pid with another start time is another process: ours is gone.
        assert warden.gone(proc.pid, stat.start_ticks + 1) is True
    finally:
        proc.kill()
        proc.wait()
    assert warden.gone(proc.pid, stat.start_ticks) is True


def test_a_kill_the_warden_sees_fail_is_reported_worker_exited_false(
    cluster: RayCluster,
) -> None:
    # A "host" whose process ray.kill cannot end: a process of ours that the
    # warden is asked about. The warden sees it alive for the whole
    # confirmation window, so the kill is reported as failed, never as done.
    node = ray.get_runtime_context().get_node_id()
    proc = subprocess.Popen(["sleep", "60"])
    try:
        stat = proc_stat(proc.pid)
        assert stat is not None
        identity = HostIdentity(node, "127.0.0.1", proc.pid, stat.start_ticks)
        config = HostConfig(
            ProviderSpec("http://127.0.0.1:9/v1"), RunnerLimits(workers=1), lease_seconds=5.0
        )
        pool = HostPool(config)
        warden = ray.remote(NodeWarden).options(num_cpus=0).remote()
        dummy = ray.remote(NodeWarden).options(num_cpus=0).remote()
        ray.get([warden.where.remote(), dummy.where.remote()], timeout=60)  # both started
        pool.wardens[node] = warden
        host = Host(name="test-host", node_id=node, actor=dummy, slots=1, identity=identity)

        async def kill() -> bool | None:
            return await pool.kill(host)

        exited = asyncio.run(kill())
        assert exited is False
        assert proc.poll() is None  # it really is still running
        outcome = Outcome(killed_at=time.monotonic(), exited=exited, node=node)
        facts = remote_facts(
            outcome, reason=Reason.USER, cancelled_at=time.monotonic(), elapsed_ms=1.0
        )
        assert facts.lifecycle.worker_exited is False
        assert facts.lifecycle.force_killed is False
        assert facts.status is Status.CANCELLED
        assert "worker_exited" not in [step.event for step in facts.lifecycle.timeline or ()]
    finally:
        proc.kill()
        proc.wait()


def test_a_host_whose_lease_expires_cancels_its_commands_with_reason_shutdown(
    cluster: RayCluster,
) -> None:
    config = HostConfig(
        ProviderSpec("http://127.0.0.1:9/v1"),
        RunnerLimits(workers=2, unwind_timeout=2.0),
        lease_seconds=1.0,
    )
    groups = {"commands": 2, "control": 4}
    make_remote: Any = ray.remote
    actor = (
        make_remote(concurrency_groups=groups)(CommandHost)
        .options(num_cpus=0, max_restarts=0, max_task_retries=0)
        .remote(config)
    )
    ray.get(actor.where.remote(), timeout=60)  # started: its lease runs from now
    items: list[Any] = []
    for ref in actor.run.remote("lease-job", "sleep 60", None, None):
        batch = ray.get(ref, timeout=30)
        items.extend(batch)
        if items[-1][0] == "complete":
            break
    kinds = [item[0] for item in items]
    assert kinds[0] == "started"
    receipt = items[-1][1]
    assert isinstance(receipt, HostReceipt)
    facts = receipt.facts
    assert facts.status is Status.CANCELLED
    assert facts.reason is Reason.SHUTDOWN  # cancelled through its runner, not killed
    assert facts.lifecycle.worker_exited is True
    assert facts.lifecycle.timeline is not None
    assert facts.lifecycle.timeline[0].event == "cancel_requested"


# -- cancels to a host, and what its streams send ---------------------------------------------


@dataclass(eq=False)
class _PoolJob:
    id: str
    answers: list[str] = field(default_factory=list)
    answered: asyncio.Event = field(default_factory=asyncio.Event)

    def on_cancel_answer(self, kind: str, receipt: Any) -> None:
        self.answers.append(kind)
        self.answered.set()

    def on_control_error(self, exc: BaseException) -> None:
        self.answers.append(f"error: {exc}")
        self.answered.set()


def test_cancels_to_one_host_go_two_calls_at_a_time_the_second_gathered_the_rest_together(
    cluster: RayCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cluster_pool.CANCEL_CALLS == 2
    # Long enough that no slow turn of this test's loop sends j1 before j2
    # came, and no call here outlasts its slot.
    monkeypatch.setattr(cluster_pool, "CANCEL_GATHER", 0.2)
    monkeypatch.setattr(cluster_pool, "CANCEL_SLOT", 30.0)
    config = HostConfig(
        ProviderSpec("http://127.0.0.1:9/v1"), RunnerLimits(workers=1), lease_seconds=5.0
    )

    # Defined here, so that Ray sends the class itself to the actor's node.
    class _GateHost:
        """A host stand-in: its ``cancel`` calls are seen at once and answered one at a time."""

        def __init__(self) -> None:
            self.seen: list[list[str]] = []
            self.gate = threading.Semaphore(0)

        @ray.method(concurrency_group="control")
        def cancel(self, requests: list[tuple[str, str]]) -> list[tuple[str, Any]]:
            self.seen.append([job_id for job_id, _ in requests])
            self.gate.acquire(timeout=30)
            return [("cancelling", None) for _ in requests]

        @ray.method(concurrency_group="test")
        def answer_one(self) -> None:
            self.gate.release()

        @ray.method(concurrency_group="test")
        def calls(self) -> list[list[str]]:
            return self.seen

    make_remote: Any = ray.remote
    gate = (
        make_remote(concurrency_groups={"control": 4, "test": 1})(_GateHost)
        .options(num_cpus=0)
        .remote()
    )
    ray.get(gate.calls.remote(), timeout=60)  # started
    jobs = [_PoolJob(f"j{k}") for k in range(6)]

    async def calls(count: int) -> list[list[str]]:
        deadline = time.monotonic() + 30
        while True:
            seen: list[list[str]] = await gate.calls.remote()
            if len(seen) >= count or time.monotonic() > deadline:
                return seen
            await asyncio.sleep(0.01)

    async def burst() -> None:
        pool = HostPool(config)
        host = Host(name="gate", node_id="gate", actor=gate, slots=1)
        pool.cancel(host, jobs[0], "user")
        await asyncio.sleep(0)  # the first call goes at the loop's next turn
        assert await calls(1) == [["j0"]]
        pool.cancel(host, jobs[1], "user")
        await asyncio.sleep(0)
        # A second call may go while the first is out, but it first waits for
        # the rest of the burst: not sent at the next turn.
        assert host.cancel_scheduled
        assert [job.id for job, _ in host.pending_cancels] == ["j1"]
        pool.cancel(host, jobs[2], "user")
        assert await calls(2) == [["j0"], ["j1", "j2"]]  # no wait for the first's answer
        assert host.cancels_in_flight == 2
        for job in jobs[3:]:
            pool.cancel(host, job, "user")
        await asyncio.sleep(0)
        # Two calls are out: the rest wait for an answer, together.
        assert not host.cancel_scheduled
        assert [job.id for job, _ in host.pending_cancels] == ["j3", "j4", "j5"]
        await gate.answer_one.remote()
        assert await calls(3) == [["j0"], ["j1", "j2"], ["j3", "j4", "j5"]]
        for _ in range(2):
            await gate.answer_one.remote()
        for job in jobs:
            await asyncio.wait_for(job.answered.wait(), 30)

    try:
        asyncio.run(burst())
    finally:
        ray.kill(gate)
    assert [job.answers for job in jobs] == [["cancelling"]] * 6


def test_one_cancel_call_wakes_the_host_loop_once_and_a_failing_cancel_leaves_the_rest_cut(
    cluster: RayCluster,
) -> None:
    # Defined here, so that Ray sends the class itself to the host's node
    # (which cannot import this test module).
    class _CountingHost(CommandHost):
        """A command host that counts the calls it queues on its loop for the runner's cancels.

        Its runner's cancel of ``wake-0`` fails, as a bug would.
        """

        def __init__(self, config: HostConfig) -> None:
            super().__init__(config)
            self.cancel_wakes = 0
            loop = self._loop
            queue_call = loop.call_soon_threadsafe

            def counted(callback: Any, *args: Any, **kwargs: Any) -> Any:
                if getattr(callback, "__name__", "") == "_cancel_on_loop":
                    self.cancel_wakes += 1
                return queue_call(callback, *args, **kwargs)

            loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
            runner_cancel = self._runner.cancel

            def cancel(command: Any, reason: str) -> bool:
                if command.id == "wake-0":
                    raise RuntimeError("planted: this cancel fails")
                return runner_cancel(command, reason)

            self._runner.cancel = cancel  # type: ignore[method-assign]

        def wakes(self) -> int:
            return self.cancel_wakes

    config = HostConfig(
        ProviderSpec("http://127.0.0.1:9/v1"),
        RunnerLimits(workers=4, unwind_timeout=5.0),
        lease_seconds=30.0,
    )
    make_remote: Any = ray.remote
    actor = (
        make_remote(concurrency_groups={"commands": 4, "control": 4})(_CountingHost)
        .options(num_cpus=0, max_restarts=0, max_task_retries=0)
        .remote(config)
    )
    try:
        ids = [f"wake-{k}" for k in range(4)]
        streams = [iter(actor.run.remote(id, "sleep 60", None, None)) for id in ids]
        for stream in streams:
            assert ray.get(next(stream), timeout=60)[0] == ("started",)
        answers = ray.get(actor.cancel.remote([(id, "user") for id in ids]), timeout=30)
        assert answers == [("cancelling", None)] * 4
        for id, stream in zip(ids, streams, strict=True):
            items: list[Any] = []
            while not items or items[-1][0] != "complete":
                items += ray.get(next(stream), timeout=30)
            facts = items[-1][1].facts
            assert facts.lifecycle.worker_exited is True  # every one was cut
            if id == "wake-0":
                continue  # its runner cancel failed (planted): the others' must not
            assert facts.status is Status.CANCELLED
            assert facts.reason is Reason.USER
        assert ray.get(actor.wakes.remote(), timeout=30) == 1
    finally:
        ray.kill(actor)


class _Waits:
    """A job's news queue that records how long each ``get`` was allowed to wait for more."""

    def __init__(self) -> None:
        self._items: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.waits: list[float] = []

    def put(self, item: tuple[Any, ...]) -> None:
        self._items.put(item)

    def get(self, timeout: float | None = None) -> tuple[Any, ...]:
        if timeout is not None:
            self.waits.append(timeout)
        return self._items.get(timeout=timeout)

    def get_nowait(self) -> tuple[Any, ...]:
        return self._items.get_nowait()


def test_a_jobs_first_output_goes_at_once_and_later_output_is_gathered() -> None:
    news = _Waits()
    batches = gathered(news, 0.05)  # type: ignore[arg-type]
    news.put(("started",))
    assert next(batches) == [("started",)]
    news.put(("output", "token", "a"))
    assert next(batches) == [("output", "token", "a")]
    assert news.waits == []  # the first token waited for nothing more
    news.put(("output", "token", "b"))
    news.put(("output", "token", "c"))
    assert next(batches) == [("output", "token", "b"), ("output", "token", "c")]
    assert news.waits
    assert all(0 < wait <= 0.05 for wait in news.waits)
    news.put(("output", "token", "d"))
    news.put(("complete", "receipt"))
    # A receipt ends the wait at once, and the stream.
    assert next(batches) == [("output", "token", "d"), ("complete", "receipt")]
    with pytest.raises(StopIteration):
        next(batches)
