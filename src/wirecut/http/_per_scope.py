"""``PerScope``: one resource (a connection pool) per scope, dropped with its scope.

A pooled connection must never serve two scopes: cutting it for one would
kill the other's response (urllib3 #3581). The simplest correct rule is one
pool per scope, plus one for the requests made with no scope bound. Keys are
weak, so a pool lives as long as its scope; when the scope is collected its
pool is closed (only idle connections can be left in it then: a request in
flight keeps its scope alive).

Safe to use from any thread.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from wirecut.scope import InterruptScope

__all__ = ["Closeable", "PerScope"]


class Closeable(Protocol):
    def close(self) -> None: ...


T = TypeVar("T", bound=Closeable)


class PerScope(Generic[T]):
    """A ``factory()``-made resource per scope (and one for "no scope"), closed together.

    ``get(scope)`` returns that scope's resource, making it on first use;
    ``close()`` closes them all, after which ``get`` raises ``RuntimeError``.
    """

    def __init__(self, factory: Callable[[], T], *, what: str = "transport") -> None:
        self._factory = factory
        self._what = what
        # Guards the maps and the closed flag; never held while closing a resource.
        self._lock = threading.Lock()
        self._by_scope: weakref.WeakKeyDictionary[InterruptScope, T] = weakref.WeakKeyDictionary()
        self._finalizers: list[weakref.finalize[[], InterruptScope]] = []
        self._unscoped: T | None = None
        self._closed = False

    def get(self, scope: InterruptScope | None) -> T:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"Cannot send a request, as the {self._what} has been closed.")
            if scope is None:
                if self._unscoped is None:
                    self._unscoped = self._factory()
                return self._unscoped
            resource = self._by_scope.get(scope)
            if resource is None:
                resource = self._by_scope[scope] = self._factory()
                self._finalizers = [f for f in self._finalizers if f.alive]
                self._finalizers.append(weakref.finalize(scope, resource.close))
            return resource

    def __len__(self) -> int:
        """How many resources are open (scoped ones and the unscoped one)."""
        with self._lock:
            return len(self._by_scope) + (self._unscoped is not None)

    def close(self) -> None:
        """Close every resource. Safe to call more than once."""
        with self._lock:
            self._closed = True
            resources = list(self._by_scope.values())
            if self._unscoped is not None:
                resources.append(self._unscoped)
            self._by_scope.clear()
            self._unscoped = None
            for finalizer in self._finalizers:
                finalizer.detach()
            self._finalizers.clear()
        for resource in resources:
            resource.close()
