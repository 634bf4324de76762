"""The checks behind wirecut's promise, shared by the HTTP-level test files."""

from __future__ import annotations

import gc
from collections.abc import Callable

from _loopback import LoopbackServer
from wirecut.scope import InterruptScope


def assert_quiet(scope: InterruptScope) -> None:
    """Nothing the scope owned is left: no thread, socket, process or object."""
    assert scope.wait_quiescent(2), scope.live()
    assert scope.live() == {"threads": 0, "sockets": 0, "processes": 0, "objects": 0}


def assert_cut_reached_the_server(server: LoopbackServer, scope: InterruptScope) -> None:
    """The server saw the one request close, no request came after it, and the scope drained."""
    assert server.wait_closes(1)
    assert len(server.requests) == 1
    assert_quiet(scope)


def cyclic_garbage(run: Callable[[], None]) -> list[str]:
    """The type names of what ``run()`` left to the cycle collector (it runs with it off).

    A cut is cheap only if what it ends goes when it ends: what waits for a
    full collection is a pause of tens of milliseconds later, on whichever
    thread allocates then (the console's event loop, in a burst of cancels).
    """
    gc.collect()
    # Held until the end: what existed before (an idle pool of an earlier
    # test, expiring on the timer thread meanwhile) cannot turn into garbage
    # during ``run()`` and be counted as its.
    before = gc.get_objects()
    gc.disable()
    try:
        run()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return [f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        del before
