"""``cancel_burst``: while a canceller cuts scope after scope, the threads it woke wait their turn.

CPython runs one thread's Python at a time. A canceller that cuts many scopes
one after another (an event loop reading 64 cancel frames) competes for the
GIL with every thread a socket just woke: the workers its first cuts woke,
which unwind, and each stream still running, which reads its next token. At
64 streams the console's loop read the other 63 frames 3.3 ms after its
first cut, though they were in its socket already: it was waiting for its
turn (docs/architecture.md, "A burst of cancels, measured").

While a canceller holds the burst, a scoped read that returned waits before
its thread goes on with what it read, so that the cuts go first. A reader
whose scope was cancelled by the time the burst began goes on at once: a
lone cancel costs its own command nothing. Waiting is bounded twice: at most
``bound`` seconds a read, and not at all once a burst is older than
``longest`` (a canceller that never let go slows reads down for a moment, it
never stops them).

The turns after a burst are taken on one CPU. A turn of the GIL given to a
thread asleep on another CPU is a wake-up across CPUs, dearer than the turn
(on a virtual machine, a trip through the hypervisor): a burst of 64 ran a
fifth to a quarter more CPU on two CPUs than on one (docs/architecture.md,
"One CPU for a burst"). So when a burst ends, its releaser and the threads
that take part in bursts (``member()``: the console's workers) are put on
the CPU the releaser runs on before the held reads are let go, and
``one_cpu_for`` seconds later every thread still there goes back to the
CPUs the releaser had (the process's), the threads started meanwhile
included; ``scope.popen`` gives the programs it starts those CPUs (they
are not the burst's to confine). Linux, where the process may run on more
than one CPU; elsewhere, or with ``one_cpu_for=None`` (the default of a
``CancelBurst`` made by hand), nothing moves.

The members run as ``SCHED_BATCH`` (``batch_members``): a member woken by
a cut or a token does not take the CPU from the thread running there,
which was the loop holding the GIL the member needed (about 90 such
switches of the loop's thread a burst of 64, and a tenth to a sixth of
the burst's CPU).

The process has one, ``cancel_burst``: the GIL is the process's. Stdlib only;
safe from any thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from wirecut.scope._timers import SYSTEM_CLOCK, Clock, TimerHandle

if TYPE_CHECKING:
    from wirecut.scope._interrupt_scope import InterruptScope

__all__ = ["CancelBurst", "cancel_burst"]


def _load_getcpu() -> Callable[[], int] | None:
    """libc's ``sched_getcpu()``, called without releasing the GIL; None without Linux's affinity.

    Without the GIL released: in a burst, a call that lets go of it hands it
    to a woken worker (the reason ``cut_socket`` holds it through ``shutdown``).
    """
    if not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"):
        return None
    try:
        function = ctypes.PyDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    function.argtypes = []
    function.restype = ctypes.c_int
    return function


_getcpu = _load_getcpu()


def _move(thread_ids: Iterator[int] | set[int], cpus: frozenset[int]) -> None:
    for thread_id in thread_ids:
        try:
            os.sched_setaffinity(thread_id, cpus)
        except OSError:
            pass  # It ended meanwhile, or the system refused: it stays where it is.


def _to_batch() -> bool:
    """The calling thread from ``SCHED_OTHER`` to ``SCHED_BATCH``; True if it changed.

    Only from the default policy: a process someone gave another one
    (``chrt``) keeps it.
    """
    if not hasattr(os, "SCHED_BATCH"):
        return False
    try:
        if os.sched_getscheduler(0) != os.SCHED_OTHER:
            return False
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:
        return False  # A system that will not: the member preempts as any thread does.
    return True


def process_policy_for(pid: int) -> None:
    """Give ``pid``, a program a thread of ours just started, the process's scheduling policy.

    A program inherits the policy of the thread that started it: started by
    a burst's member (or a thread a member started), it would run as
    ``SCHED_BATCH``, which is the member's and not the program's. The
    process's is its main thread's. Linux; a no-op elsewhere.
    """
    if not hasattr(os, "SCHED_BATCH"):
        return
    try:
        if os.sched_getscheduler(0) != os.SCHED_BATCH:
            return
        if os.sched_getscheduler(os.getpid()) != os.SCHED_OTHER:
            return  # The process itself runs so: the program may too.
        os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        pass  # It ended meanwhile, or the system refused: it keeps its starter's.


def _threads_on(cpus: frozenset[int]) -> Iterator[int]:
    """The threads of this process that may run on ``cpus`` and nowhere else."""
    try:
        entries = os.listdir("/proc/self/task")
    except OSError:
        return  # Only the threads it moved go back.
    for entry in entries:
        try:
            if os.sched_getaffinity(int(entry)) == cpus:
                yield int(entry)
        except OSError:
            pass  # It ended meanwhile.


class CancelBurst:
    """Held by cancellers while they cut; scoped reads wait until no canceller holds it."""

    def __init__(
        self,
        *,
        bound: float = 0.02,
        longest: float = 0.25,
        one_cpu_for: float | None = None,
        batch_members: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        #: The most one read waits for a burst to end, in seconds.
        self.bound = bound
        #: A burst older than this (seconds) holds no read back any more.
        self.longest = longest
        #: How long after a burst its threads stay on one CPU (seconds): the
        #: workers it held unwind after it ends (64 of them: 10 to 20 ms).
        #: None: they are never moved.
        self.one_cpu_for = one_cpu_for
        #: Whether members run as ``SCHED_BATCH`` while members (``member()``).
        self.batch_members = batch_members
        self._clock = clock
        #: The native ids of the threads that take part in every burst.
        self._members: set[int] = set()
        #: While a burst's threads are on one CPU: that CPU, those threads, and
        #: when they go back.
        self._one_cpu: frozenset[int] | None = None
        self._moved: set[int] = set()
        self._back: TimerHandle | None = None
        #: The CPUs the burst's threads go back to, from the first burst on:
        #: the process's, which ``scope.popen`` gives the programs it starts.
        self.home: frozenset[int] | None = None
        #: Bursts whose threads were put on one CPU, since the process started.
        self.on_one_cpu = 0
        self._lock = threading.Lock()
        self._holders: set[object] = set()
        self._over = threading.Event()
        self._over.set()
        self._began_at = -math.inf
        #: Bursts begun, and reads that waited for one, since the process started.
        self.begun = 0
        self.reads_held = 0
        #: Threads waiting for the burst to end, now.
        self.waiting = 0

    @property
    def under_way(self) -> bool:
        return not self._over.is_set()

    def hold(self, owner: object) -> None:
        """``owner`` is cutting: the burst is under way until every holder has released it.

        Call it after the burst's first cut: the scopes cancelled by then are
        not held back. Holding again is a no-op.
        """
        with self._lock:
            if not self._holders:
                self._began_at = time.monotonic()
                self.begun += 1
                self._over.clear()
            self._holders.add(owner)

    def release(self, owner: object) -> None:
        """``owner`` stopped cutting (a no-op if it did not hold the burst)."""
        with self._lock:
            if owner not in self._holders:
                return
            self._holders.discard(owner)
            if not self._holders:
                try:
                    self._to_one_cpu_locked()
                finally:
                    self._over.set()  # Whatever moving the threads did.

    @contextlib.contextmanager
    def member(self) -> Iterator[None]:
        """The calling thread takes part in every burst while in the block (a worker's loop).

        With ``batch_members``, it runs as ``SCHED_BATCH`` meanwhile (Linux,
        from the default policy only): woken, it does not take the CPU from
        the thread running there, but waits for that thread to sleep or for
        the scheduler's tick. A member woken while another thread holds the
        GIL (the loop, reading the next cancel frame) could only wait for
        the GIL again (docs/architecture.md, "Workers that do not take the
        loop's CPU"). Its policy is put back when the block ends; the
        programs it starts get the process's (``scope.popen``).
        """
        thread_id = threading.get_native_id()
        with self._lock:
            self._members.add(thread_id)
        batch = self.batch_members and _to_batch()
        try:
            yield
        finally:
            if batch:
                with contextlib.suppress(OSError):
                    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            with self._lock:
                self._members.discard(thread_id)

    def _to_one_cpu_locked(self) -> None:
        """The releaser and the members on the releaser's CPU, until ``one_cpu_for`` from now.

        At the end of the burst, not its start: the cuts wake the workers
        they cut, and a woken thread on the canceller's CPU takes that CPU
        from the canceller (the provider then saw its close later, 5.3
        against 4.1 ms at the median of a burst of 64). Held, the threads
        sleep; let go, they wake on the one CPU.
        """
        if self.one_cpu_for is None or _getcpu is None:
            return
        if self._one_cpu is None:
            try:
                home = frozenset(os.sched_getaffinity(0))
            except OSError:
                return  # A system that will not say: the burst ends, nothing moves.
            cpu = _getcpu()
            if len(home) < 2 or cpu not in home:
                return  # One CPU already (``serve --cpus 1``), or none that it could name.
            self.home = home
            self._one_cpu = frozenset({cpu})
            self.on_one_cpu += 1
        moving = ({threading.get_native_id()} | self._members) - self._moved
        _move(moving, self._one_cpu)
        self._moved |= moving
        if self._back is not None:
            self._back.cancel()
        self._back = self._clock.call_later(self.one_cpu_for, self._go_back)

    def _go_back(self) -> None:
        """On the timer thread: every thread on the burst's CPU back to ``home``."""
        with self._lock:
            # Under the lock: a burst that ends meanwhile finds them where they are.
            if self._one_cpu is None or self.home is None:
                return
            self._back = None
            one, home, self._one_cpu = self._one_cpu, self.home, None
            # Those it moved, and the threads they started meanwhile.
            _move(self._moved | set(_threads_on(one)), home)
            self._moved = set()

    def hold_back(self, scope: InterruptScope | None) -> None:
        """Called by a thread that a read has just returned to: wait while a burst is under way.

        Not at all if ``scope`` was cancelled by the time the burst began,
        and at most ``bound`` seconds.
        """
        if self._over.is_set():
            return
        began_at = self._began_at
        if time.monotonic() - began_at > self.longest:
            return
        cancelled_at = None if scope is None else scope.cancelled_at
        if cancelled_at is not None and cancelled_at <= began_at:
            return
        with self._lock:
            self.waiting += 1
            self.reads_held += 1
        try:
            self._over.wait(self.bound)
        finally:
            with self._lock:
                self.waiting -= 1


#: The process's burst (there is one GIL to take turns at).
cancel_burst = CancelBurst(one_cpu_for=0.1, batch_members=True)
