"""``Lanes``: the scopes requests run under, reused while nothing cut them.

A request runs under an ``InterruptScope`` that no other request uses while
it runs, so a cut of one never touches another. ``wirecut.http`` keeps a
connection pool per scope (a connection never serves two scopes at once,
urllib3 #3581): a new scope per request would also mean a new upstream
connection per request, a TCP connect and the upstream's accept in front of
every first token. So a scope whose request ended without a cut goes back
here, and the next request takes it, with its idle keep-alive connection.
A scope that was cancelled is never reused (its cut is latched, and its pool
is closed).

Event loop only.
"""

from __future__ import annotations

import itertools

from wirecut.scope import InterruptScope

__all__ = ["Lanes"]


class Lanes:
    """A free list of open scopes, at most ``keep`` of them idle."""

    def __init__(self, keep: int = 64) -> None:
        self._keep = keep
        self._idle: list[InterruptScope] = []
        self._numbers = itertools.count(1)

    def take(self) -> InterruptScope:
        """An open scope that no request uses now (the most recently used one first)."""
        while self._idle:
            scope = self._idle.pop()
            if not scope.cancelled:
                return scope
        return InterruptScope(f"proxy-lane-{next(self._numbers)}")

    def give_back(self, scope: InterruptScope) -> None:
        """``scope``'s request is over and its thread returned; a cancelled scope is dropped."""
        if not scope.cancelled and len(self._idle) < self._keep:
            self._idle.append(scope)
