"""A helper program of the proof tools in a process of its own, and how it starts and ends.

``wirecut bench`` times a provider and a console that must not share the
GIL with the code that times them (``SimProcess``, ``ConsoleProcess``). Each
runs as a child that prints one line when it is ready (its URL, which the
caller reads out of it), and may answer lines written to its stdin.

The child leads a session of its own, watched by the scope's group reaper:
a bench killed with SIGKILL takes the child with it instead of leaving it
listening. A terminal's Ctrl+C reaches the bench alone, whose ``stop()``
ends the child.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import subprocess
import threading
from collections.abc import Callable
from typing import IO

from wirecut.scope import unwatch_group, watch_group
from wirecut.serving import BackgroundServer

__all__ = ["STOP_TIMEOUT", "Child", "ChildService"]

#: Seconds ``stop`` waits for the child to exit (after its stdin closed, then after SIGTERM).
STOP_TIMEOUT = 5.0


class Child:
    """``argv`` in a child process of its own session; ``what`` names it in errors.

    ``start`` returns the URL from the first line the child prints, or raises
    ``RuntimeError`` with what the child said on stderr. With ``stdin``, lines
    can be sent (``ask``) and the child's first next line read as the answer,
    and closing its stdin is the first way ``stop`` asks it to end.
    """

    def __init__(self, what: str, *, stdin: bool = False) -> None:
        self.what = what
        self._stdin = stdin
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=20)
        self._readers: list[threading.Thread] = []

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return None if self._proc is None else self._proc.pid

    def start(self, argv: list[str], url_of: Callable[[str], str], timeout: float) -> str:
        """Run ``argv``; the URL ``url_of`` reads from its first line ("" if none there)."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._proc = proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if self._stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            # Its own group, which the reaper kills if this process dies first.
            start_new_session=True,
        )
        watch_group(proc.pid)
        assert proc.stdout is not None
        assert proc.stderr is not None
        self._readers = [
            _drain(proc.stdout, self._lines.put),  # "" at the end: the child exited
            _drain(proc.stderr, self._stderr.append),
        ]
        timed_out = False
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            line, timed_out = "", True
        except BaseException:  # Ctrl+C while it starts: no child left behind
            self.stop()
            raise
        url = url_of(line)
        if url.startswith("http://") or url.startswith("ws://"):
            return url
        code = proc.poll()
        if code is None and line == "" and not timed_out:
            # Its stdout ended: it is exiting, and its stdout can close a
            # moment before its exit status is there to read.
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(STOP_TIMEOUT)
        self.stop()  # and all it said is read
        said = " ".join(line.strip() for line in self._stderr if line.strip()) or "-"
        if code is not None:
            raise RuntimeError(f"the {self.what} exited ({code}) before it listened: {said}")
        raise RuntimeError(f"the {self.what} did not listen within {timeout} s: {said}")

    def ask(self, line: str, timeout: float) -> str:
        """Send ``line`` to the child's stdin; its next line of output, stripped.

        RuntimeError if it does not answer within ``timeout`` or exits first.
        """
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise RuntimeError(f"the {self.what} is not running with a stdin")
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        try:
            answer = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(
                f"the {self.what} did not answer {line!r} within {timeout} s"
            ) from None
        if answer == "":
            raise RuntimeError(f"the {self.what} exited before it answered {line!r}")
        return answer.strip()

    def stop(self) -> None:
        """Close its stdin, then SIGTERM, then SIGKILL, ``STOP_TIMEOUT`` apart; reap. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):  # it may have gone: a broken pipe
                proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_TIMEOUT)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        unwatch_group(proc.pid)  # Reaped: nothing left for the reaper.
        for reader in self._readers:
            reader.join(STOP_TIMEOUT)  # at the pipes' end now that the child is gone
        if not any(reader.is_alive() for reader in self._readers):
            # Closing a pipe a reader still blocks on would block here too.
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


class ChildService(BackgroundServer):
    """A service run by a ``Child``; a context manager (``start()``, then ``stop()``)."""

    def __init__(self, child: Child) -> None:
        self._child = child

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return self._child.pid

    def stop(self) -> None:
        self._child.stop()


def _drain(stream: IO[str], put: Callable[[str], None]) -> threading.Thread:
    """Read ``stream`` to its end on a daemon thread, handing each line, then "", to ``put``."""

    def read() -> None:
        for line in stream:
            put(line)
        put("")

    thread = threading.Thread(target=read, name="wirecut-child-output", daemon=True)
    thread.start()
    return thread
