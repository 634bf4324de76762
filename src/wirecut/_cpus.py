"""``wirecut serve --cpus``: the console's threads on a set of CPUs, its children on all of them.

CPython runs one thread's Python at a time. A burst of cancels wakes dozens
of threads (each cut worker, the event loop between them), and on a machine
with more than one CPU each hand-off of the GIL to a thread that sleeps on
another CPU is a wake-up across CPUs, which costs more than the hand-off
itself (on a virtual machine, a trip through the hypervisor). Pinned to one
CPU, a burst of 64 ran about a fifth less CPU and its ``complete``s came
that much sooner (docs/architecture.md, "One CPU for the console").

Pinning is per thread on Linux: ``pin`` sets every thread of the process
and, through them, every thread started later. A child process inherits
its parent thread's set, and a program a command runs (a tool's
subprocess) is not the console's to confine: ``pin`` has ``scope.popen``
give those the CPUs the process had (``wirecut.scope.set_child_cpus``).
``wirecut bench --console-cpus`` runs its console on the CPUs given
(``set_threads``, in the console's process) and itself, with what it
starts, on the others (``confined``). Linux only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from wirecut.scope import set_child_cpus

__all__ = ["CpuError", "allowed", "check", "confined", "parse_cpus", "pin", "set_threads"]


class CpuError(ValueError):
    """A CPU list that does not parse, or names a CPU this process may not run on."""


def allowed() -> frozenset[int]:
    """The CPUs the calling thread may run on; ``CpuError`` where the system cannot say."""
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None:
        raise CpuError("choosing CPUs needs Linux (os.sched_setaffinity)")
    return frozenset(getter(0))


def parse_cpus(text: str) -> frozenset[int]:
    """CPUs from a list like ``1``, ``0,2`` or ``2-3`` (what ``taskset -c`` takes)."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise CpuError(f"{text!r} is not a CPU list (like 1, 0,2 or 2-3)") from None
        if low < 0 or high < low:
            raise CpuError(f"{part.strip()!r} in {text!r} is not a CPU or a range of CPUs")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def check(cpus: frozenset[int]) -> frozenset[int]:
    """``cpus``, if this process may run on each of them; else ``CpuError`` naming the others."""
    can = allowed()
    outside = sorted(cpus - can)
    if not cpus or outside:
        raise CpuError(
            f"this process may run on CPUs {_spell(can)} only, not on {_spell(outside or cpus)}"
        )
    return cpus


def pin(cpus: frozenset[int]) -> None:
    """Run every thread of this process, and every thread started later, on ``cpus``.

    The programs ``scope.popen`` starts from then on get the CPUs the process
    had. Call it once, at startup. Raises ``CpuError`` naming the CPUs that
    this process may not use.
    """
    check(cpus)
    set_child_cpus(allowed())  # before the pin: the CPUs the process had
    set_threads(cpus)


def set_threads(cpus: frozenset[int]) -> None:
    """Run every thread of this process, and every thread started later, on ``cpus``.

    No check, no change for the programs ``scope.popen`` starts: ``pin`` is
    the console's; this is for a process that chose its CPUs before it ran.
    """
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cpus)
        except ProcessLookupError:
            pass  # The thread ended meanwhile.


@contextlib.contextmanager
def confined(cpus: frozenset[int]) -> Iterator[None]:
    """Every thread of this process on ``cpus`` for the block, then back on the CPUs it had.

    A child process started in the block inherits ``cpus``, and keeps them.
    """
    had = allowed()
    set_threads(cpus)
    try:
        yield
    finally:
        set_threads(had)


def _spell(cpus: frozenset[int] | list[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))
