"""``PerScope``: one resource (a connection pool) per scope, closed when its scope is done.

A pooled connection must never serve two scopes: cutting it for one would
kill the other's response (urllib3 #3581). The simplest correct rule is one
pool per scope, plus one for the requests made with no scope bound.

A scope's pool keeps idle keep-alive connections between its requests. They
must not outlive the scope's work: a host that keeps 2,000 cancelled scopes
around must not keep their connections (and the provider's sockets) open. So a
scoped pool is closed, by the side that owns its connections:

- at once, in the requesting thread, when the last request in flight of a
  cancelled scope ends (its connections are all idle then);
- by a reaper thread, when the scope is cancelled while no request of it is
  in flight, or when the pool has been idle for ``idle_expiry`` seconds (the
  keep-alive expiry, applied eagerly: a finished scope's connections close
  then, not at its next request or its garbage collection);
- when the scope is collected.

A pool is only ever closed while none of its requests is in flight
(``enter``/``leave`` count them), so no thread is using any of its sockets:
closing them is the pool owner's act, not a cut from another thread. A later
request of the same scope gets a new pool. The unscoped pool behaves like a
plain httpx one.

The reaper checks ``scope.cancelled`` every ``REAP_INTERVAL`` seconds while
some scoped pool is idle: a scope offers no cancel callback that does not
count in its ledger, and an idle pool is not work the scope owns.

Safe to use from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from wirecut.scope import InterruptScope

__all__ = ["REAP_INTERVAL", "Closeable", "Lease", "PerScope"]

_log = logging.getLogger("wirecut.http")

#: Seconds between two looks of the reaper at the idle pools it watches.
REAP_INTERVAL = 0.1


class Closeable(Protocol):
    def close(self) -> None: ...


T = TypeVar("T", bound=Closeable)


class Lease(Generic[T]):
    """A scope's resource and its count of requests in flight (guarded by the owner's lock)."""

    __slots__ = ("closed", "finalizer", "idle_since", "in_flight", "resource", "scope_ref")

    def __init__(self, resource: T, scope: InterruptScope | None) -> None:
        self.resource = resource
        self.scope_ref = None if scope is None else weakref.ref(scope)
        self.in_flight = 0
        self.idle_since = time.monotonic()
        self.closed = False
        self.finalizer: weakref.finalize[Any, Any] | None = None


class PerScope(Generic[T]):
    """A ``factory()``-made resource per scope (and one for "no scope"), closed with its scope.

    ``enter(scope)`` returns the scope's lease, making its resource on first
    use, and counts a request in flight; ``leave(lease)`` ends that request.
    ``close()`` closes every resource, after which ``enter`` raises
    ``RuntimeError``. ``idle_expiry`` (seconds, None: never) closes a scoped
    resource that had no request for that long.
    """

    def __init__(
        self,
        factory: Callable[[], T],
        *,
        what: str = "transport",
        idle_expiry: float | None = None,
    ) -> None:
        self._factory = factory
        self._what = what
        self._idle_expiry = idle_expiry
        # Guards the map, the leases' counts and flags, and the closed flag;
        # never held while a resource is made or closed.
        self._lock = threading.Lock()
        self._by_scope: weakref.WeakKeyDictionary[InterruptScope, Lease[T]] = (
            weakref.WeakKeyDictionary()
        )
        self._unscoped: Lease[T] | None = None
        self._closed = False

    def enter(self, scope: InterruptScope | None) -> Lease[T]:
        """The lease of ``scope``'s resource, with one more request counted in flight."""
        with self._lock:
            self._raise_if_closed()
            lease = self._unscoped if scope is None else self._by_scope.get(scope)
            if lease is not None:
                lease.in_flight += 1
                return lease
        resource = self._factory()  # Outside the lock: it may take a while.
        lease = Lease(resource, scope)
        lease.in_flight = 1
        with self._lock:
            try:
                self._raise_if_closed()
            except RuntimeError:
                resource.close()
                raise
            current = self._unscoped if scope is None else self._by_scope.get(scope)
            if current is not None:  # Another thread made one meanwhile: use it.
                current.in_flight += 1
                spare: T | None = resource
                lease = current
            else:
                spare = None
                if scope is None:
                    self._unscoped = lease
                else:
                    self._by_scope[scope] = lease
                    lease.finalizer = weakref.finalize(scope, _close_quietly, resource)
        if spare is not None:
            spare.close()
        return lease

    def leave(self, lease: Lease[T]) -> None:
        """One request of ``lease`` ended; close the resource if its scope was cancelled."""
        with self._lock:
            lease.in_flight -= 1
            if lease.in_flight or lease.closed or lease.scope_ref is None:
                return
            scope = lease.scope_ref()
            if scope is not None and not scope.cancelled:
                lease.idle_since = time.monotonic()
                close_now = False
            else:
                close_now = self._drop_locked(lease, scope)
        if close_now:
            # This thread ran the scope's last request: the connections are
            # idle now, and ours to close.
            _close_quietly(lease.resource)
        else:
            _reaper.watch(self)

    def __len__(self) -> int:
        """How many resources are open (scoped ones and the unscoped one)."""
        with self._lock:
            return len(self._by_scope) + (self._unscoped is not None)

    def close(self) -> None:
        """Close every resource. Safe to call more than once."""
        with self._lock:
            self._closed = True
            leases = list(self._by_scope.values())
            if self._unscoped is not None:
                leases.append(self._unscoped)
            self._by_scope.clear()
            self._unscoped = None
            for lease in leases:
                lease.closed = True
                if lease.finalizer is not None:
                    lease.finalizer.detach()
        for lease in leases:
            lease.resource.close()

    def _raise_if_closed(self) -> None:
        if self._closed:
            raise RuntimeError(f"Cannot send a request, as the {self._what} has been closed.")

    def _drop_locked(self, lease: Lease[T], scope: InterruptScope | None) -> bool:
        """Take ``lease`` out of the map (the lock is held); True if the caller must close it."""
        if lease.closed:
            return False
        lease.closed = True
        if scope is not None and self._by_scope.get(scope) is lease:
            del self._by_scope[scope]
        if lease.finalizer is not None:
            lease.finalizer.detach()
        return True

    def _collect_idle(self, now: float) -> tuple[bool, list[T]]:
        """For the reaper: the idle resources to close now, and whether others stay idle."""
        closing: list[T] = []
        watching = False
        with self._lock:
            for scope, lease in list(self._by_scope.items()):
                if lease.in_flight or lease.closed:
                    continue
                expired = self._idle_expiry is not None and now - lease.idle_since >= (
                    self._idle_expiry
                )
                if scope.cancelled or expired:
                    if self._drop_locked(lease, scope):
                        closing.append(lease.resource)
                else:
                    watching = True
        return watching, closing


def _close_quietly(resource: Closeable) -> None:
    # Runs in the reaper, a finalizer or the last request's thread, none of
    # which may fail because a connection's close did.
    try:
        resource.close()
    except Exception:
        _log.exception("closing an idle pool failed")


class _Reaper:
    """One daemon thread that closes the idle pools of cancelled and idle-expired scopes.

    It runs while some scoped pool is idle and exits when none is left.
    """

    def __init__(self) -> None:
        # Guards the watched set and the thread handle; the thread waits on it.
        self._cond = threading.Condition(threading.Lock())
        self._watched: weakref.WeakSet[PerScope[Closeable]] = weakref.WeakSet()
        self._thread: threading.Thread | None = None

    def watch(self, per_scope: PerScope[T]) -> None:
        with self._cond:
            self._watched.add(per_scope)  # type: ignore[arg-type]
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="wirecut-http-reaper", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            closing: list[Closeable] = []
            with self._cond:
                self._cond.wait(REAP_INTERVAL)
                now = time.monotonic()
                for per_scope in list(self._watched):
                    # Under our lock, so that a watch() cannot slip between the
                    # look and the discard; PerScope's lock nests inside ours.
                    watching, idle = per_scope._collect_idle(now)
                    closing.extend(idle)
                    if not watching:
                        self._watched.discard(per_scope)
                if not self._watched and not closing:
                    self._thread = None
                    return
            for resource in closing:
                _close_quietly(resource)


_reaper = _Reaper()
