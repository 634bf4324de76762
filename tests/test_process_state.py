"""wirecut changes nothing process-wide that its host did not ask for.

The library layers (``scope``, ``http``, ``provider``, ``adapters``, ``aio``)
run inside other people's processes: a host that imports them, cancels a
stream, cuts 64 at once, kills a subprocess tree and cancels an
``aio.run_sync`` call keeps its threads' scheduling policy and CPUs, its
switch interval, its signal handlers and its environment, and the group
reaper it gets runs as the host does. A default ``wirecut serve`` changes no
thread's policy or CPUs during a burst of 64 cancels either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from _console import ConsoleClient, serving
from wirecut.simulator import SimConfig, SimulatorServer

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or not Path("/proc/self/task").is_dir(),
    reason="reads threads' policy and CPUs from Linux's /proc",
)

HERE = Path(__file__).resolve().parent
STREAMS = SimConfig(slots=64, tokens_per_second=50, prompt_ms=5, endless=True)


def test_the_library_layers_leave_the_hosts_process_as_they_found_it() -> None:
    with SimulatorServer(STREAMS) as sim:
        run = subprocess.run(
            [sys.executable, str(HERE / "_plain_host.py"), sim.base_url],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    before, after = found["before"], found["after"]
    assert after["switch_interval"] == before["switch_interval"]
    assert after["signals"] == before["signals"]
    assert after["environ"] == before["environ"]
    main = before["main"]
    # Every thread, the ones wirecut started included, at every look: the
    # host's policy and CPUs.
    for threads in found["seen"]:
        assert threads, "no thread was seen"
        for tid, state in threads.items():
            assert state == main, f"thread {tid}: {state} != {main}"
    assert found["reaper"] == main


def _threads_of(pid: int) -> dict[int, tuple[int, frozenset[int]]]:
    found = {}
    for entry in os.listdir(f"/proc/{pid}/task"):
        try:
            found[int(entry)] = (
                os.sched_getscheduler(int(entry)),
                frozenset(os.sched_getaffinity(int(entry))),
            )
        except OSError:
            continue  # it ended meanwhile
    return found


def test_a_default_serve_changes_no_threads_policy_or_cpus_during_a_burst_of_64_cancels(
    tmp_path: Path,
) -> None:
    expected = (os.sched_getscheduler(0), frozenset(os.sched_getaffinity(0)))
    with SimulatorServer(STREAMS) as sim:
        with serving(tmp_path, "--provider-url", sim.base_url, "--workers", "64") as served:
            pid = served.proc.pid
            looks: list[dict[int, tuple[int, frozenset[int]]]] = []
            done = threading.Event()

            def watch() -> None:
                # Looks at every thread again and again until the burst is over.
                while not done.is_set():
                    looks.append(_threads_of(pid))

            with ConsoleClient(served.ws_url) as client:
                ids = [client.run("chat tell me everything", id=f"c{k}") for k in range(64)]
                for id in ids:
                    client.wait_for(lambda f: f["type"] == "output", 30, id=id)
                watcher = threading.Thread(target=watch)
                watcher.start()
                try:
                    for id in ids:
                        client.cancel(id)
                    completes = client.completes(ids, 60)
                finally:
                    done.set()
                    watcher.join(30)
            looks.append(_threads_of(pid))
            token = served.url.split("token=")[1]
            health: dict[str, Any] = httpx.get(
                served.url.split("?")[0] + "api/health", params={"token": token}
            ).json()
    assert {c["status"] for c in completes.values()} == {"cancelled"}
    assert health["workers"]["leaked"] == 0
    assert len(looks) >= 2
    for threads in looks:
        for tid, state in threads.items():
            assert state == expected, f"serve's thread {tid}: {state} != {expected}"
