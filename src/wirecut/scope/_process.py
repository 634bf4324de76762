"""Child processes: reading /proc, killing a process group, and ``scope.popen``.

The one place in wirecut that signals a process group or parses
``/proc/<pid>/stat``; ``wirecut.local`` stops its server with
``kill_process_group`` too. Stdlib only. Waiting for an exit uses a pidfd
where the kernel has one (a wakeup, no polling) and polls elsewhere.

A killed group leaves zombies until their parent (or init) reaps them: a
zombie has exited and is never counted as alive (docs/architecture.md, fact 8).
Every group ``scope.popen`` starts is watched by the group reaper
(``_reaper``) until it has ended, so it dies with us even when we are killed.
"""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from wirecut.scope._errors import Interrupted
from wirecut.scope._reaper import unwatch_group, watch_group
from wirecut.scope._timers import is_never

if TYPE_CHECKING:
    from wirecut.scope._interrupt_scope import InterruptScope
    from wirecut.scope._registration import Registration

__all__ = [
    "ProcStat",
    "ProcessTarget",
    "ScopedPopen",
    "group_members",
    "kill_process_group",
    "proc_stat",
    "proc_stats",
    "signal_group",
    "wait_exited",
]

#: How long a kill waits for each SIGKILLed process to be gone: dying takes a
#: moment after the signal, and "killed" should be true when it is said.
KILL_WAIT = 5.0

#: Default time a cut process group gets between SIGTERM and SIGKILL.
DEFAULT_KILL_GRACE = 1.0

#: Poll interval where there is no pidfd to wait on.
_POLL_S = 0.01


def check_grace(grace: float | None) -> float:
    """The kill grace to use: the default for None; ValueError for NaN or negative."""
    if grace is None:
        return DEFAULT_KILL_GRACE
    if math.isnan(grace) or grace < 0:
        raise ValueError(f"grace must be a non-negative number of seconds, not {grace!r}")
    return grace


# -- /proc -----------------------------------------------------------------------------


class ProcStat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` that wirecut reads."""

    pid: int
    state: str  # one letter: R running, S sleeping, D disk, Z zombie, T stopped ...
    ppid: int
    pgid: int
    #: When it started, in clock ticks since boot (a reused pid has another);
    #: None where the record is too short to say.
    start_ticks: int | None = None

    @property
    def alive(self) -> bool:
        """Not a zombie: a zombie has exited and only waits to be reaped."""
        return self.state != "Z"


def parse_stat(pid: int, text: str) -> ProcStat:
    """Parse the text of ``/proc/<pid>/stat``."""
    # The command name is in parentheses and may itself hold spaces and ")":
    # the fields start after the last ")".
    fields = text[text.rindex(")") + 2 :].split()
    start = int(fields[19]) if len(fields) > 19 else None
    return ProcStat(pid, fields[0], int(fields[1]), int(fields[2]), start)


def proc_stat(pid: int) -> ProcStat | None:
    """The kernel's record of ``pid``, or None if it is gone (or there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None  # Exited (and reaped) meanwhile, or no /proc here.
    return parse_stat(pid, text)


def proc_stats() -> list[ProcStat]:
    """Every process visible in /proc (empty where there is none)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    stats = (proc_stat(int(name)) for name in names if name.isdigit())
    return [stat for stat in stats if stat is not None]


def group_members(pgid: int) -> list[int]:
    """The pids of process group ``pgid`` that are alive (zombies are not)."""
    return [stat.pid for stat in proc_stats() if stat.pgid == pgid and stat.alive]


# -- signals and exits -------------------------------------------------------------------


def leads_group(pid: int) -> bool:
    """Whether ``pid`` leads its own process group (False if it is gone)."""
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to every process of group ``pgid``; True if it reached any.

    The group outlives a reaped leader as long as it has members, and Linux
    never reuses the id of a live group, so this cannot hit a stranger while
    a member is left.
    """
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def wait_exited(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` s for ``pid`` to exit, leaving it unreaped; True once it has.

    A zombie has exited. Waits on a pidfd (readable once the process exits);
    where there is none, polls. An infinite ``timeout`` waits for as long as it takes.
    """
    wait_s = None if is_never(timeout) else max(0.0, timeout)
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            fd = pidfd_open(pid)
        except ProcessLookupError:
            return True  # Already reaped.
        except OSError:
            pass  # No pidfd from this kernel: poll below.
        else:
            try:
                readable, _, _ = select.select([fd], [], [], wait_s)
                return bool(readable)
            finally:
                os.close(fd)
    deadline = None if wait_s is None else time.monotonic() + wait_s
    while not _has_exited(pid):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _has_exited(pid: int) -> bool:
    try:
        # Our own child: ask without reaping it.
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        pass  # Not our child (a group member): ask the kernel's record.
    stat = proc_stat(pid)
    if stat is not None:
        return not stat.alive
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    # No /proc and the pid answers: alive, or a zombie we cannot tell apart.
    return False


class ProcessTarget:
    """A child process and the way to kill it with its group.

    The process should lead its own session or process group (``scope.popen``
    starts it so); otherwise only the process itself is signalled, never the
    group it shares with us.

    As a ``Cuttable``, ``cut()`` sends SIGTERM and leaves the rest (SIGKILL
    after ``grace`` seconds, waiting for the members, reaping) to a helper
    thread; ``on_signalled`` runs before that thread starts and ``on_killed``
    when it is done, for the owner's timeline and ledger.
    """

    def __init__(
        self,
        popen: subprocess.Popen[Any],
        grace: float,
        *,
        on_signalled: Callable[[], None] | None = None,
        on_killed: Callable[[ProcessTarget], None] | None = None,
    ) -> None:
        self.popen = popen
        self.grace = grace
        self.own_group = leads_group(popen.pid)
        # Set when the cut starts; read by the scope once the cut is over:
        # a process being killed stays owned until the kill is done.
        self.killing = False
        # Whether any signal of the kill reached a process.
        self.signalled = False
        self._on_signalled = on_signalled
        self._on_killed = on_killed

    def signal(self, sig: signal.Signals) -> bool:
        """Send ``sig`` to the process group (or the process alone); True if delivered."""
        if self.own_group:
            delivered = signal_group(self.popen.pid, sig)
        elif self.popen.returncode is None:
            try:
                os.kill(self.popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                delivered = False
            else:
                delivered = True
        else:
            delivered = False
        self.signalled = self.signalled or delivered
        return delivered

    def cut(self, reason: str) -> bool:
        """SIGTERM now; SIGKILL after the grace, wait and reap on a helper thread."""
        self.killing = True
        try:
            delivered = self.signal(signal.SIGTERM)
            if delivered and self._on_signalled is not None:
                self._on_signalled()
        finally:
            try:
                threading.Thread(target=self._finish_kill, name="wirecut-kill", daemon=True).start()
            except BaseException:
                self._killed()  # No helper thread: let go rather than count it forever.
                raise
        return delivered

    def _finish_kill(self) -> None:
        try:
            self.finish_kill()
            self.popen.poll()  # Reap, unless the owner's wait() already does.
            if self.own_group:
                unwatch_group(self.popen.pid)  # Dead: nothing for the reaper to do.
        finally:
            self._killed()

    def _killed(self) -> None:
        if self._on_killed is not None:
            self._on_killed(self)

    def finish_kill(self) -> None:
        """After SIGTERM: wait out the grace for the leader, then SIGKILL what is left."""
        self.wait_exit(self.popen.pid, self.grace)
        # Whatever of the group survived SIGTERM (or ignored it) goes now.
        self.kill_remaining()

    def kill_remaining(self, timeout: float = KILL_WAIT) -> None:
        """SIGKILL the group (or the process) and wait until every member has exited."""
        self.signal(signal.SIGKILL)
        members = group_members(self.popen.pid) if self.own_group else []
        for pid in [self.popen.pid, *members]:
            self.wait_exit(pid, timeout)

    def wait_exit(self, pid: int, timeout: float) -> bool:
        """``wait_exited``, knowing that a reaped leader has exited."""
        if pid == self.popen.pid and self.popen.returncode is not None:
            return True
        return wait_exited(pid, timeout)


def kill_process_group(popen: subprocess.Popen[Any], *, grace: float) -> int:
    """Stop ``popen`` and its process group, and reap it; returns its exit status.

    SIGTERM to the group, SIGKILL to whatever is left once the leader exited
    or ``grace`` seconds passed, wait until every member is gone, then
    ``popen.wait()``. A process that does not lead its own group is signalled
    alone. Blocks for up to ``grace`` plus a few seconds; call it from the
    thread that owns ``popen`` (or any thread, if no other one waits for it).
    """
    target = ProcessTarget(popen, grace)
    target.signal(signal.SIGTERM)
    target.finish_kill()
    return popen.wait()


# -- scope.popen -------------------------------------------------------------------------


class ScopedPopen(subprocess.Popen[Any]):
    """A ``subprocess.Popen`` started by ``scope.popen()``: its own session, registered.

    Its registration ends when it has been waited for (``wait``,
    ``communicate``, ``run``-style use, or the ``with`` block); then whatever is
    left of its process group is killed.
    """

    def __init__(
        self, scope: InterruptScope, argv: list[str], *, grace: float | None, **kwargs: Any
    ) -> None:
        grace = check_grace(grace)
        # Checked here, right before the fork: a cancelled scope starts
        # nothing (the registration below would kill it, but only after it
        # ran for a moment and maybe did its visible work).
        scope.check()
        kwargs["start_new_session"] = True
        super().__init__(argv, **kwargs)
        # Its own session: nothing kills it when we die, unless the reaper
        # does (a SIGKILL of `wirecut serve` left `sleep 3600` running).
        watch_group(self.pid)
        self._registration: Registration | None = None
        try:
            self._registration = scope.register_process(self, grace=grace)
        except BaseException as exc:
            if not isinstance(exc, Interrupted):
                # Not registered, so nobody else will kill it.
                signal_group(self.pid, signal.SIGKILL)
            # Cancelled while it started, the cut on entry kills it within
            # the grace. Either way, close its pipes and reap it here: the
            # caller never gets the object to do so.
            with self:
                pass
            if not isinstance(exc, Interrupted):
                unwatch_group(self.pid)  # (A cut's kill unwatches it when done.)
            raise

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self._release()
        return code

    def __exit__(self, *exc_info: Any) -> None:
        super().__exit__(*exc_info)
        self._release()

    def _release(self) -> None:
        registration = self._registration
        if registration is not None and registration.active:
            registration.unregister()
            target: ProcessTarget = registration.target
            if target.own_group:
                # Nothing the process started outlives it.
                target.kill_remaining()
                unwatch_group(self.pid)
