"""The group reaper: a small process that kills our process groups if we die without doing so.

A process started with ``scope.popen`` leads a session of its own (so that a
cut can kill everything it started), and so nothing kills it when its
parent dies: after ``kill -9`` of ``wirecut serve`` its ``sleep 3600`` ran
on, re-parented to pid 1. The kernel's own answer, ``PR_SET_PDEATHSIG``,
does not fit: it fires when the *thread* that forked the child ends (a pool
thread that is replaced, a helper that returned while its process is still
owned), and it signals the leader only, not its group.

So each process that starts groups gets one reaper: ``python -I -S`` running
``_REAPER_CODE``, in a session of its own, reading "+PGID" and "-PGID" lines
from a pipe whose write end only we hold. When the pipe reaches end of file
(we exited, however: SIGKILL included, since the kernel closes our
descriptors) it sends SIGTERM to every group still listed, SIGKILL to what
is left after ``REAPER_GRACE``, and exits. A group is listed from its start
until it has been killed or waited for, so a normal exit leaves it nothing
to do.

Started on first use, from whichever thread starts the first group; safe to
use from any thread. A forked child (``os.fork`` without exec) drops its copy
of the pipe, so the reaper still sees our death, and starts its own reaper
if it starts groups. Linux and other POSIX systems; stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

__all__ = ["REAPER_GRACE", "GroupReaper", "unwatch_group", "watch_group"]

#: Seconds the reaper gives a group between SIGTERM and SIGKILL.
REAPER_GRACE = 0.3

# The reaper's whole program: no imports beyond os/signal/time (started with
# -I -S, it costs a few milliseconds and no site-packages).
_REAPER_CODE = f"""
import os, signal, time
groups = set()
pending = b""
while True:
    try:
        data = os.read(0, 65536)
    except InterruptedError:
        continue
    if not data:
        break
    lines = (pending + data).split(b"\\n")
    pending = lines.pop()
    for line in lines:
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
def live_groups(groups):
    # Groups with a member that is not a zombie: once our parent is gone, a
    # zombie waits for init to reap it, and signalling it answers "alive".
    try:
        names = os.listdir("/proc")
    except OSError:
        names = None
    if names is None:
        found = set()
        for pgid in groups:
            try:
                os.killpg(pgid, 0)
            except OSError:
                continue
            found.add(pgid)
        return found
    found = set()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) in groups:
            found.add(int(fields[2]))
    return found
deadline = time.monotonic() + {REAPER_GRACE!r}
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except OSError:
        pass
groups = live_groups(groups)
while groups and time.monotonic() < deadline:
    time.sleep(0.01)
    groups = live_groups(groups)
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class GroupReaper:
    """Kills the watched process groups when this process dies; see the module docstring.

    ``watch(pgid)`` and ``unwatch(pgid)`` are safe from any thread; the
    first ``watch`` starts the reaper process (a fork and exec, no wait).
    Each call writes one short line to a pipe the reaper keeps reading.
    """

    def __init__(self) -> None:
        # Guards the pipe, the reaper process and the set; held while a line
        # is written, so that lines from two threads never interleave.
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._groups: set[int] = set()

    @property
    def pid(self) -> int | None:
        """The reaper process's id, once started."""
        proc = self._proc
        return None if proc is None else proc.pid

    def watch(self, pgid: int) -> None:
        """Kill group ``pgid`` if this process dies before ``unwatch(pgid)``.

        Best effort: if no reaper can be started (no descendants left, say)
        the group is not watched, and the caller's own kill still holds.
        """
        with self._lock:
            self._groups.add(pgid)
            with contextlib.suppress(OSError):
                self._send(f"+{pgid}\n".encode())

    def unwatch(self, pgid: int) -> None:
        """Group ``pgid`` is gone (killed and waited for): the reaper forgets it."""
        with self._lock:
            if pgid not in self._groups:
                return
            self._groups.discard(pgid)
            if self._proc is None:
                return  # No reaper (it could not start): nothing to tell.
            with contextlib.suppress(OSError):
                self._send(f"-{pgid}\n".encode())

    def _send(self, line: bytes) -> None:
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            try:
                proc.stdin.write(line)
                proc.stdin.flush()
                return
            except (BrokenPipeError, ValueError):
                # Someone killed the reaper: start another, listing every group.
                with contextlib.suppress(OSError):
                    proc.stdin.close()
                proc.poll()
        self._start()

    def _start(self) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _REAPER_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own session: a terminal's Ctrl+C or hang-up, or a kill of
            # our process group, does not reach it; only our exit does.
            start_new_session=True,
        )
        assert proc.stdin is not None
        proc.stdin.write(b"".join(f"+{pgid}\n".encode() for pgid in sorted(self._groups)))
        proc.stdin.flush()
        self._proc = proc

    def _after_fork_in_child(self) -> None:
        # The child of an os.fork() must not hold our pipe open (the reaper
        # would then miss our death), nor speak for our groups.
        proc, self._proc = self._proc, None
        self._lock = threading.Lock()
        self._groups = set()
        if proc is not None and proc.stdin is not None:
            # Point the descriptor at /dev/null rather than close it: the
            # file object closes it again when collected, and a closed
            # number may by then belong to another file (fact 3).
            with contextlib.suppress(OSError):
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, proc.stdin.fileno(), inheritable=False)
                os.close(null)


# One reaper per process: it watches over what this process starts, and
# dies with it. Not wiring but a per-process resource, like the interpreter's
# own atexit list.
_REAPER = GroupReaper()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_REAPER._after_fork_in_child)


def watch_group(pgid: int) -> None:
    """Kill process group ``pgid`` (SIGTERM, then SIGKILL) if this process dies before it ends."""
    _REAPER.watch(pgid)


def unwatch_group(pgid: int) -> None:
    """Group ``pgid`` has ended (it was killed or waited for): no longer watch it."""
    _REAPER.unwatch(pgid)


def reaper_pid() -> int | None:
    """The process id of this process's reaper, once started (for tests and diagnostics)."""
    return _REAPER.pid
