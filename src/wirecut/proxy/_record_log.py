"""``RecordLog``: ``proxy.jsonl``, written off the request path, rotated by size, mode 0600.

A record is the proxy's account of a request, and it must never cost the
request anything: ``append`` only queues it (the event loop never touches
the disk), and a thread of the log's own writes it. A write that fails (a
full disk, a file system gone read-only) fails no request: the line is
kept, up to ``max_pending`` lines, and written with the next that can be;
one warning says the log is failing and one says it recovered, and a line
that could not even be kept is counted (``dropped``), never hidden. The file
is rotated once it would pass ``max_bytes``: ``proxy.jsonl`` becomes
``proxy.jsonl.1`` (and ``.1`` becomes ``.2`` ..., ``backups`` of them kept).
Every file is mode 0600 (records name requests and models).

``append`` from any thread (the loop); ``close`` once, at the end.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import stat
import threading
from pathlib import Path

from wirecut.proxy._record import ProxyRecord

__all__ = ["RecordLog"]

_log = logging.getLogger("wirecut.proxy")

_STOP = object()
#: Seconds ``close`` waits for the writer to write what is queued.
CLOSE_BOUND = 5.0


class RecordLog:
    """Writes records to ``path``, one JSON line each (None: keeps none); see the module."""

    def __init__(
        self,
        path: Path | None,
        *,
        max_bytes: int = 64 * 1024 * 1024,
        backups: int = 3,
        max_pending: int = 100_000,
    ) -> None:
        if max_bytes < 1 or backups < 1 or max_pending < 1:
            raise ValueError("max_bytes, backups and max_pending must each be >= 1")
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        #: Records that could neither be written nor kept for later.
        self.dropped = 0
        self._max_pending = max_pending
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        # Guards the start of the writer thread (append may race close).
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        # The writer's own state (only its thread touches these).
        self._pending: collections.deque[bytes] = collections.deque()
        self._fd: int | None = None
        self._size = 0
        self._failing = False

    @property
    def pending(self) -> int:
        """Lines waiting for a write that can succeed (a full disk's backlog)."""
        return len(self._pending)

    def append(self, record: ProxyRecord) -> None:
        """Queue ``record`` for writing; never blocks, never raises."""
        if self.path is None:
            return
        with self._lock:
            if self._closed:
                self.dropped += 1
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="wirecut-proxy-records", daemon=True
                )
                self._thread.start()
        self._queue.put(record)

    def close(self) -> None:
        """Write what is queued (bounded by ``CLOSE_BOUND``), then close the file."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        self._queue.put(_STOP)
        thread.join(CLOSE_BOUND)

    # -- the writer thread ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            batch = [item]
            while not self._queue.empty():  # Whatever queued meanwhile goes in one write.
                batch.append(self._queue.get())
            stop = False
            for each in batch:
                if each is _STOP:
                    stop = True
                elif isinstance(each, ProxyRecord):
                    self._keep(json.dumps(each.to_json(), separators=(",", ":")).encode() + b"\n")
            self._flush()
            if stop:
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None
                return

    def _keep(self, line: bytes) -> None:
        if len(self._pending) >= self._max_pending:
            self._pending.popleft()
            self.dropped += 1
        self._pending.append(line)

    def _flush(self) -> None:
        try:
            while self._pending:
                line = self._pending[0]
                fd = self._file(len(line))
                os.write(fd, line)
                self._size += len(line)
                self._pending.popleft()
        except OSError as exc:
            if self._fd is not None:
                # Reopened at the next try: the file may be gone or be another now.
                os.close(self._fd)
                self._fd = None
            if not self._failing:
                self._failing = True
                _log.warning(
                    "wirecut proxy: cannot write %s (%s); keeping the records to write later",
                    self.path,
                    exc.strerror or exc,
                )
            return
        if self._failing:
            self._failing = False
            _log.warning("wirecut proxy: writing %s again", self.path)

    def _file(self, incoming: int) -> int:
        """The open file, rotated first if ``incoming`` bytes would pass ``max_bytes``."""
        assert self.path is not None
        if self._fd is not None and self._size + incoming > self.max_bytes and self._size > 0:
            os.close(self._fd)
            self._fd = None
            self._rotate()
        if self._fd is None:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                info = os.fstat(fd)
                if stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) != 0o600:
                    os.fchmod(fd, 0o600)  # Whatever the umask, or a file an older version made.
                self._size = info.st_size
            except OSError:
                os.close(fd)
                raise
            self._fd = fd
            if self._size > 0 and self._size + incoming > self.max_bytes:
                return self._file(incoming)  # An old file already full: rotate it first.
        return self._fd

    def _rotate(self) -> None:
        assert self.path is not None
        for n in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._size = 0
