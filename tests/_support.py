"""What the test files share: the bounds a test waits within, waiting for a state, the CLI.

Tests never sleep to wait for something: they wait on an event, a condition
or a process with one of these bounds, which only a failing test reaches.
When there is no event to wait on (another process's state), ``until`` and
``eventually`` poll a condition. ``run_wirecut`` runs the command line as a
user does, and the two ``assert_*`` check how it fails; ``file_refused``
how a loader refuses a bad file.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "BOUND",
    "PROCESS_BOUND",
    "assert_one_line_failure",
    "assert_usage_error",
    "eventually",
    "file_refused",
    "run_wirecut",
    "until",
]

#: How long a state may take to be reached, in seconds, before the test fails:
#: "promptly" on a shared, noisy machine.
BOUND = 10.0
#: How long a program (``wirecut ...``, a console client) may take to start and
#: answer: its imports take a moment on a loaded machine.
PROCESS_BOUND = 30.0


def eventually(condition: Callable[[], bool], bound: float = BOUND, *, every: float = 0.05) -> bool:
    """Poll ``condition`` every ``every`` seconds until it holds (True) or ``bound`` passes."""
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)
    return True


def until(condition: Callable[[], bool], bound: float = BOUND) -> None:
    """Poll ``condition`` until it holds; fail after ``bound`` seconds."""
    assert eventually(condition, bound, every=0.005), "the state was never reached"


def run_wirecut(
    *args: str, timeout: float = PROCESS_BOUND, **run: Any
) -> subprocess.CompletedProcess[str]:
    """``python -m wirecut ARGS`` to its end, its output as text (``run``: to subprocess.run)."""
    return subprocess.run(
        [sys.executable, "-m", "wirecut", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **run,
    )


def assert_usage_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2, nothing on stdout, and click's short usage error: one ``Error:`` line."""
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    assert all(word in errors[0] for word in words), result.stderr
    # The error line, and at most click's two lines of usage and hint.
    assert len([line for line in lines if line.strip()]) <= 3, result.stderr


def assert_one_line_failure(result: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 1, nothing on stdout, and one line on stderr naming ``words``."""
    assert result.returncode == 1, result
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert all(word in result.stderr for word in words), result.stderr


def file_refused(
    load: Callable[[Path], object], path: Path, text: str, error: type[Exception], *words: str
) -> str:
    """How ``load`` refuses ``text`` written to ``path``: ``error``, one line naming ``words``.

    The line starts with the path; it is returned for further checks.
    """
    path.write_text(text)
    with pytest.raises(error) as caught:
        load(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert all(word in message for word in words), message
    return message
