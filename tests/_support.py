"""What the test files share: the bounds a test waits within, and waiting for a state.

Tests never sleep to wait for something: they wait on an event, a condition
or a process with one of these bounds, which only a failing test reaches.
When there is no event to wait on, ``until`` polls a condition.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["BOUND", "PROCESS_BOUND", "until"]

#: How long a state may take to be reached, in seconds, before the test fails:
#: "promptly" on a shared, noisy machine.
BOUND = 10.0
#: How long a program (``wirecut ...``, a console client) may take to start and
#: answer: its imports take a moment on a loaded machine.
PROCESS_BOUND = 30.0


def until(condition: Callable[[], bool], bound: float = BOUND) -> None:
    """Poll ``condition`` until it holds; fail after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, "the state was never reached"
        time.sleep(0.005)
