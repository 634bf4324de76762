"""How each kind of registered thing is cut.

Every cut here returns quickly: ``InterruptScope.cancel()`` runs them on the
caller's thread and must never block on the work it cuts. Waiting that a cut
needs (a process's kill grace) happens on a helper thread.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ProcessTarget", "cut_socket"]


def cut_socket(sock: socket.socket) -> None:
    """Shut ``sock`` down in both directions; never close it.

    ``close()`` from another thread does not wake a thread blocked in
    ``recv()`` and the peer sees nothing; ``shutdown(SHUT_RDWR)`` wakes it
    (``recv`` returns b"") and sends the FIN (DESIGN fact 1). Closing is left
    to the owning thread: an fd closed here could be reused at once by another
    ``open()`` and receive the owner's late writes (fact 3).
    """
    try:
        # The plain socket method, also for an ssl.SSLSocket: its own
        # shutdown() unwraps the TLS object under the owner's feet.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # Already closed, never connected, or the peer reset it.


class ProcessTarget:
    """A registered child process and the way to kill it with its group.

    The process should lead its own session or process group (``scope.popen``
    starts it so); otherwise only the process itself is signalled, never the
    group it shares with us.
    """

    def __init__(self, popen: subprocess.Popen[Any], grace: float) -> None:
        self.popen = popen
        self.grace = grace
        self.killing = False  # set by the scope, under its lock, when the cut starts
        try:
            self.own_group = os.getpgid(popen.pid) == popen.pid
        except ProcessLookupError:
            self.own_group = False

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process group (or the process alone)."""
        try:
            if self.own_group:
                # The group outlives a reaped leader as long as it has
                # members, and Linux never reuses a live group's id.
                os.killpg(self.popen.pid, sig)
            elif self.popen.returncode is None:
                os.kill(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def start_kill(self, on_done: Callable[[], None]) -> None:
        """After the caller's SIGTERM: SIGKILL after the grace on a helper thread; reap.

        ``on_done`` runs once the leader has exited and the group was killed.
        """
        threading.Thread(
            target=self._finish_kill, args=(on_done,), name="wirecut-kill", daemon=True
        ).start()

    def _finish_kill(self, on_done: Callable[[], None]) -> None:
        try:
            self._wait_exit(self.popen.pid, self.grace)
            # Whatever of the group survived SIGTERM (or ignored it) goes now.
            self.kill_remaining()
            self.popen.poll()  # Reap, unless the owner's wait() already does.
        finally:
            on_done()

    def kill_remaining(self, timeout: float = 5.0) -> None:
        """SIGKILL the group (or the process) and wait until every member has exited.

        SIGKILL is delivered at once but dying takes a moment: waiting makes
        "killed" true when it is said.
        """
        self.signal(signal.SIGKILL)
        members = _group_members(self.popen.pid) if self.own_group else []
        for pid in [self.popen.pid, *members]:
            self._wait_exit(pid, timeout)

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        """Wait up to ``timeout`` for ``pid`` to exit (a zombie has), without polling."""
        if pid == self.popen.pid and self.popen.returncode is not None:
            return True
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return True
        try:
            readable, _, _ = select.select([fd], [], [], timeout)
            return bool(readable)
        finally:
            os.close(fd)


def _group_members(pgid: int) -> list[int]:
    """The pids in process group ``pgid``, from /proc (empty where there is none)."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        # The command name is in parentheses and may hold spaces.
        if int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid:
            members.append(int(name))
    return members
