"""A two-node Ray cluster on loopback, started with ``ray start`` and stopped by its own pids.

``RayCluster(root)`` runs ``ray start --head`` and a second ``ray start``
that joins it, each with 1 CPU and a small object store, in a temp dir of its
own. ``stop()`` ends exactly the processes it started: every process whose
command line names that temp dir, and their descendants (workers rename
themselves, so they are found as children of their raylet), SIGTERM then
SIGKILL. Never ``ray stop``, which would end every other Ray on the machine.
``kill_node(ip)`` SIGKILLs one node's raylet and everything under it: the
node is lost, as when its machine dies.

The addresses. ``ray start --node-ip-address 127.0.0.1`` is rewritten by
Ray 2.60 into the machine's routable address (``resolve_ip_for_localhost``:
the raylet got ``--node_ip_address=192.0.2.2`` here), so the nodes use
127.0.0.2 and 127.0.0.3, which are loopback too (127.0.0.0/8 on ``lo``) and
which Ray keeps as given: every byte stays on loopback, and the two nodes
have addresses of their own, as on a real cluster.

The head's GCS declares a node dead after 3 missed health checks 0.3 s apart
(``RAY_health_check_*``; Ray's default is about 15 s), so that a lost node
shows as such within a test's time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["HEAD_IP", "WORKER_IP", "RayCluster", "ray_missing"]

HEAD_IP = "127.0.0.2"
WORKER_IP = "127.0.0.3"
#: How long one ``ray start`` may take (about 5 s here).
START_TIMEOUT = 90.0

_ENV = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "300",
    "RAY_health_check_timeout_ms": "300",
    "RAY_health_check_failure_threshold": "3",
    "RAY_USAGE_STATS_ENABLED": "0",
    # Both nodes alike: Ray 2.60's `ray start --head` turns token auth on by
    # itself when ~/.ray/auth_token exists (a local `ray.init()` writes it),
    # and a joining `ray start` then fails without the token.
    "RAY_AUTH_MODE": "disabled",
}


def ray_missing() -> str | None:
    """Why the cluster tests cannot run here (None: they can)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "the extra `ray` is not installed (pip install 'wirecut[ray]')"
    if shutil.which("ray") is None:
        return "the `ray` command is not on PATH"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RayCluster:
    """Two Ray nodes on loopback: ``address`` is the head's ``HOST:PORT``."""

    def __init__(self) -> None:
        # Short: Ray's unix socket paths live under it and must stay < 108 bytes.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="wcray-", dir="/tmp"))
        self.port = _free_port()
        self.address = f"{HEAD_IP}:{self.port}"
        self._env = {**os.environ, **_ENV}

    def start(self) -> RayCluster:
        try:
            self._ray_start(
                "--head",
                "--node-ip-address",
                HEAD_IP,
                "--port",
                str(self.port),
                "--temp-dir",
                str(self.temp_dir),
                "--include-dashboard",
                "false",
                "--dashboard-port",
                str(_free_port()),
            )
            self._ray_start("--address", self.address, "--node-ip-address", WORKER_IP)
        except BaseException:
            self.stop()
            raise
        return self

    def _ray_start(self, *args: str) -> None:
        command = [
            "ray",
            "start",
            *args,
            "--num-cpus",
            "1",
            "--object-store-memory",
            "100000000",
            "--dashboard-agent-listen-port",
            str(_free_port()),
            "--disable-usage-stats",
        ]
        done = subprocess.run(
            command, env=self._env, capture_output=True, text=True, timeout=START_TIMEOUT
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")

    # -- processes ---------------------------------------------------------------------

    def pids(self) -> set[int]:
        """Every live process of this cluster: named with its temp dir, and their descendants."""
        table = _process_table()
        tag = str(self.temp_dir).encode()
        roots = {pid for pid, (_, cmd) in table.items() if tag in cmd}
        return _with_descendants(roots, table)

    def node_pids(self, ip: str) -> set[int]:
        """The raylet of the node at ``ip`` and everything under it (its workers, its agents)."""
        table = _process_table()
        flag = f"--node_ip_address={ip}".encode()
        tag = str(self.temp_dir).encode()
        raylets = {
            pid
            for pid, (_, cmd) in table.items()
            if b"raylet" in cmd.split(b"\0", 1)[0] and flag in cmd.split(b"\0") and tag in cmd
        }
        return _with_descendants(raylets, table)

    def kill_node(self, ip: str) -> set[int]:
        """SIGKILL the node at ``ip`` (raylet, workers, agents); returns the pids killed."""
        pids = self.node_pids(ip)
        if not pids:
            raise RuntimeError(f"no raylet of this cluster runs for {ip}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def stop(self, grace: float = 5.0) -> None:
        """End every process of this cluster (SIGTERM, then SIGKILL), and remove its temp dir."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_running(pid) for pid in pids):
            time.sleep(0.05)
        for pid in pids | self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _process_table() -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, raw command line) of every process we can read."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        table[int(entry)] = (ppid, cmd)
    return table


def _with_descendants(roots: set[int], table: dict[int, tuple[int, bytes]]) -> set[int]:
    found = set(roots)
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _) in table.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    return found


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")
