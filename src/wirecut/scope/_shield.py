"""The commit shield: while a thread is inside a commit section, a cancel waits for it.

A commit section (``InterruptScope.committing``) is where work makes its
effect durable: a database's ``COMMIT``, the request that writes. Cut in the
middle, the host could not say whether the effect happened: the write may
land while the acknowledgement is lost. So while a thread is inside one, a
cancel acts on nothing that thread registered (its sockets, its processes,
its waits), raises nothing in it (``check``, ``sleep``, ``wait`` and
escalation pass it by), and the cuts it would have made are kept here. When
the thread leaves its outermost section they run, and the cancel reaches the
thread at its next cooperative point: trio's ``CancelScope.shield``, as a
property of the thread rather than of the scope.

A cut is kept or run under ``_lock``, and a thread enters its shield under
it too, so a cancel either finds the shield and keeps the cut, or cuts
before the shield exists (and the section's entry check sees the cancel).
Safe from any thread; stdlib only.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

__all__ = ["defer_if_shielded", "is_shielded", "shielded"]

_log = logging.getLogger("wirecut.scope")


class _Shield:
    __slots__ = ("deferred", "depth")

    def __init__(self) -> None:
        #: Sections open in the thread (they nest).
        self.depth = 0
        #: The cuts a cancel kept for the thread's way out, in the order they came.
        self.deferred: list[Callable[[], None]] = []


# Thread ident -> its shield, for the threads inside a section now. Read by
# cancellers on other threads, so not a threading.local.
_shields: dict[int, _Shield] = {}
# Guards _shields and every shield's fields.
_lock = threading.Lock()


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Shield the calling thread for the block (blocks may nest).

    When the outermost block ends, however it ends, the cuts kept meanwhile
    run on this thread, before the block's exception (if any) goes on.
    """
    me = threading.get_ident()
    with _lock:
        shield = _shields.get(me)
        if shield is None:
            shield = _shields[me] = _Shield()
        shield.depth += 1
    try:
        yield
    finally:
        with _lock:
            shield.depth -= 1
            if shield.depth:
                deferred = []
            else:
                del _shields[me]
                deferred = shield.deferred
        for cut in deferred:
            try:
                cut()
            except Exception:
                _log.exception("a cut kept for the end of a commit section failed")


def is_shielded(ident: int | None) -> bool:
    """True while thread ``ident`` is inside a commit section."""
    with _lock:
        return ident in _shields


def defer_if_shielded(ident: int, cut: Callable[[], None]) -> bool:
    """Keep ``cut`` for the end of thread ``ident``'s sections; False if it is in none."""
    with _lock:
        shield = _shields.get(ident)
        if shield is None:
            return False
        shield.deferred.append(cut)
        return True
