"""``cut_as_interrupted``: the one place where a cut becomes ``Interrupted``.

A cut shuts a socket down; the code blocked on it then fails the way its
library fails on a dead connection (``b""``, ``OSError``, httpcore's
``ReadError``, requests' ``ConnectionError`` ...). Under a cancelled scope that
failure is the cut's doing, and the caller must see the cut: every scoped
client (httpcore, httpcore2, urllib3) and the provider wrap their blocking
calls in ``cut_as_interrupted``, in the manner of httpcore's ``map_exceptions``.

Safe from any thread; a context manager instance is used by one thread.
"""

from __future__ import annotations

from types import TracebackType

from wirecut.scope import Interrupted, InterruptScope

__all__ = ["cut_as_interrupted", "raise_if_cut"]


def raise_if_cut(scope: InterruptScope | None, exc: BaseException | None = None) -> None:
    """Raise ``Interrupted(scope.reason)`` from ``exc`` if ``scope``'s cancel reaches us now.

    Call it where an I/O error or an unexpected EOF surfaces (``exc`` None for
    an EOF): under a cancelled scope it is the cut's doing. Inside a commit
    section nothing of this thread was cut, and the error is the peer's.
    """
    if scope is not None and scope.cancelled_here:
        raise Interrupted(scope.reason or "cancelled") from exc


class cut_as_interrupted:  # lower case: used like a function, as contextlib.suppress is
    """In the block, an ``Exception`` raised under a cancelled ``scope`` becomes ``Interrupted``.

    The new ``Interrupted`` carries the scope's reason and is raised ``from``
    the original error, which stays visible as its cause. ``BaseException``s
    (``Interrupted`` itself, ``KeyboardInterrupt``) pass through untouched, and
    so does everything when ``scope`` is None, still open, or its cancel waits
    for this thread's commit section. A class rather
    than a generator: it wraps every read of a response body.
    """

    __slots__ = ("_scope",)

    def __init__(self, scope: InterruptScope | None) -> None:
        self._scope = scope

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, Exception):
            raise_if_cut(self._scope, exc)
