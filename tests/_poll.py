"""Waiting for a state another thread changes, when there is no event to wait on."""

from __future__ import annotations

import time
from collections.abc import Callable

#: How long a state may take to be reached, in seconds, before the test fails.
BOUND = 10.0


def until(condition: Callable[[], bool], bound: float = BOUND) -> None:
    """Poll ``condition`` until it holds; fail after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, "the state was never reached"
        time.sleep(0.005)
