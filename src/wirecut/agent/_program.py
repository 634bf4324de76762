"""Run a started program to its end: feed its stdin, collect its output, bound its time.

What ``subprocess.Popen.communicate`` does, with one difference that matters
to a tool: the program is over when its *leader* exits, not when its output
pipe reaches end-of-file. ``communicate`` waits for EOF, so a descendant that
left the process group (``setsid`` and a double fork) and kept the pipe open
holds it (and the agent's turn) for as long as it lives, past a cancel and
past the timeout. Here the leader's exit ends the reading: the rest of the
group is killed, what is already in the pipe is read, and a pipe that is
still open then can only be held by a process outside the group, which is
reported, not waited for. Killing it is beyond what a process group can do.

Call from the thread that owns the ``Popen``; Linux (``pidfd_open``).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["ProgramRun", "run_program"]

_CHUNK = 65536
# Reads after the group is gone: 1 MiB, the largest pipe an unprivileged
# process can ask for (/proc/sys/fs/pipe-max-size).
_DRAIN_READS = 16
# Without pidfd_open (Linux < 5.3), the leader's exit is polled this often.
_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class ProgramRun:
    """How a program run ended and what it wrote."""

    output: bytes
    returncode: int
    # The timeout passed first; the group was killed.
    timed_out: bool
    # After the group was gone its output pipe was still open: a descendant
    # outside the group holds it. Whatever it writes later is not read.
    escaped: bool


def run_program(proc: subprocess.Popen[Any], stdin: bytes, timeout: float) -> ProgramRun:
    """Feed ``stdin`` to ``proc``, read its stdout until its leader exits or ``timeout`` passes.

    ``proc`` must lead its own process group (``scope.popen`` starts it so)
    and have ``stdin`` and ``stdout`` pipes (stderr merged or not piped).
    On timeout the whole group gets SIGKILL. Returns once the leader has been
    waited for (``proc.wait()``, which for a ``ScopedPopen`` also kills what
    is left of its group).

    Cancellation: a cut of the scope ``proc`` is registered with kills its
    group (SIGTERM, SIGKILL after the grace); the leader's exit ends this at
    once, whether or not something outside the group still holds the output
    pipe. The caller checks the scope afterwards to tell a cut from a normal end.
    """
    assert proc.stdin is not None
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    out_fd = proc.stdout.fileno()
    os.set_blocking(out_fd, False)
    chunks: list[bytes] = []
    pending = memoryview(stdin)
    timed_out = False
    with contextlib.ExitStack() as stack:
        selector = stack.enter_context(selectors.DefaultSelector())
        selector.register(out_fd, selectors.EVENT_READ, "out")
        if pending:
            in_fd = proc.stdin.fileno()
            os.set_blocking(in_fd, False)
            selector.register(in_fd, selectors.EVENT_WRITE, "in")
        else:
            _close(proc.stdin)
        pidfd = _pidfd(proc)
        if pidfd is not None:
            stack.callback(os.close, pidfd)
            selector.register(pidfd, selectors.EVENT_READ, "exit")
        # Polled after the pidfd was opened: a leader not reaped by then is the
        # process the pidfd refers to (a reaped one's pid may have been reused).
        exited = proc.poll() is not None
        while not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            events = selector.select(remaining if pidfd is not None else min(remaining, _POLL_S))
            for key, _ in events:
                if key.data == "exit":
                    exited = True
                elif key.data == "out" and not _read_some(out_fd, chunks):
                    selector.unregister(out_fd)  # EOF: the exit is still to come
                elif key.data == "in":
                    pending = _write_some(key.fd, pending)
                    if not pending:
                        selector.unregister(key.fd)
                        _close(proc.stdin)
            if pidfd is None:
                exited = proc.poll() is not None
    _close(proc.stdin)
    if timed_out:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    returncode = proc.wait()
    # The group is gone now (waited for, and a ScopedPopen kills the rest):
    # what it wrote is in the pipe. Read it; a pipe not at EOF then is held
    # by a process outside the group.
    escaped = _drain(out_fd, chunks)
    return ProgramRun(b"".join(chunks), returncode, timed_out, escaped)


def _pidfd(proc: subprocess.Popen[Any]) -> int | None:
    # Readable once the leader has exited (a zombie's is readable at once).
    # None without pidfd_open, or when the leader was reaped already.
    try:
        return os.pidfd_open(proc.pid)
    except (OSError, AttributeError):
        return None


def _read_some(fd: int, chunks: list[bytes]) -> bool:
    """Read what is there; False at EOF."""
    try:
        chunk = os.read(fd, _CHUNK)
    except BlockingIOError:
        return True
    if chunk:
        chunks.append(chunk)
    return bool(chunk)


def _write_some(fd: int, pending: memoryview) -> memoryview:
    """Write what the pipe takes; nothing is left to write once the reader is gone."""
    try:
        return pending[os.write(fd, pending[:_CHUNK]) :]
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        return pending[:0]


def _drain(fd: int, chunks: list[bytes]) -> bool:
    """Read what the pipe holds, to EOF; True if it is still open.

    Bounded: a pipe holds at most a few of these reads (64 KiB by default),
    and one that keeps filling is being written by a process outside the group.
    """
    for _ in range(_DRAIN_READS):
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        chunks.append(chunk)
    return True


def _close(stream: Any) -> None:
    with contextlib.suppress(OSError):
        stream.close()
