"""``WorkerPool``: a bounded pool of worker threads that a leaked worker does not shrink.

Why not ``concurrent.futures.ThreadPoolExecutor``: a command whose worker
never returns (pure-Python code that even escalation did not stop) would hold
one of its ``max_workers`` threads for good, and after ``max_workers`` such
leaks the console could run nothing. ``retire()`` takes a leaked thread out of
the count and starts a replacement, so that ``workers`` threads are always
available to new commands; the retired thread exits when (if ever) its task
returns. Everything else is the executor's contract: ``submit`` returns a
``concurrent.futures.Future`` whose ``cancel()`` is True only for work that
never started (docs/architecture.md, fact 4), because a worker claims each future with
``set_running_or_notify_cancel()`` before running it.

Safe to call from any thread.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["WorkerPool"]

T = TypeVar("T")


class WorkerPool:
    """``workers`` threads taking submitted work in FIFO order.

    Cancellation: ``Future.cancel()`` succeeds only while the work is queued;
    a worker skips a cancelled future. ``shutdown()`` stops taking work once
    the queue is empty and does not wait for running work.
    """

    def __init__(self, workers: int, *, name: str = "wirecut-worker") -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, not {workers!r}")
        self.workers = workers
        self._name = name
        # Guards the queue, the thread sets and the counters.
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[tuple[Future[Any], Callable[[], Any]]] = collections.deque()
        self._threads: set[threading.Thread] = set()  # counted towards ``workers``
        self._retired: set[threading.Thread] = set()  # leaked: not counted, exit when done
        self._idle = 0
        self._busy: dict[threading.Thread, bool] = {}
        self._serial = 0
        self._shutdown = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Queue ``fn(*args, **kwargs)``; a thread runs it when one is free."""
        future: Future[T] = Future()
        with self._cond:
            if self._shutdown:
                raise RuntimeError("Cannot submit work, as the worker pool has been shut down.")
            self._queue.append((future, lambda: fn(*args, **kwargs)))
            # Idle threads take queued work first; start one more only for the rest.
            if len(self._queue) > self._idle and len(self._threads) < self.workers:
                self._start_thread()
            self._cond.notify()
        return future

    def retire(self, thread: threading.Thread) -> None:
        """Stop counting ``thread`` (leaked) and start a replacement if work is waiting.

        The thread finishes its current task, if it ever does, and then exits.
        """
        with self._cond:
            if thread in self._threads:
                self._threads.discard(thread)
                self._retired.add(thread)
                if self._queue and self._idle == 0:
                    self._start_thread()

    @property
    def busy(self) -> int:
        """Threads running a task now, retired ones included."""
        with self._cond:
            return sum(self._busy.values())

    @property
    def queued(self) -> int:
        """Tasks waiting for a thread (cancelled ones are dropped when reached)."""
        with self._cond:
            return sum(1 for future, _ in self._queue if not future.cancelled())

    @property
    def saturated(self) -> bool:
        """True when work submitted now would wait: every thread is taken or promised."""
        with self._cond:
            free = self._idle + (self.workers - len(self._threads))
            return len(self._queue) >= free

    def shutdown(self) -> None:
        """Take no more work; idle threads exit. Safe to call more than once."""
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def _start_thread(self) -> None:
        # Called with the lock held.
        self._serial += 1
        thread = threading.Thread(
            target=self._take_work, name=f"{self._name}-{self._serial}", daemon=True
        )
        self._threads.add(thread)
        self._busy[thread] = False
        thread.start()

    def _take_work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                self._idle += 1
                while not self._queue and not self._shutdown and me not in self._retired:
                    self._cond.wait()
                self._idle -= 1
                if not self._queue or me in self._retired:
                    self._threads.discard(me)
                    self._retired.discard(me)
                    self._busy.pop(me, None)
                    return
                future, work = self._queue.popleft()
                if not future.set_running_or_notify_cancel():
                    continue  # Cancelled while queued: it never runs.
                self._busy[me] = True
            try:
                result = work()
            except BaseException as exc:  # Interrupted included: the future carries it.
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                with self._cond:
                    self._busy[me] = False
            del future, work  # Drop references before waiting for the next task.
