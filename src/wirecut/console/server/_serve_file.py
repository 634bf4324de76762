"""``ServeFile``: a data directory's ``serve.json``, owned by one live ``wirecut serve`` at a time.

``wirecut console`` without a URL reads ``serve.json`` to find the local
console. A second ``serve`` on the same data directory must neither take
the file over (the first console would become unreachable by name) nor
delete it when it stops (the first would vanish for ``wirecut console``
while it still runs). Ownership is an exclusive ``flock`` on
``serve.lock`` beside it, held for the owner's life: the kernel lets it go
when the owner's process ends, however it ends, so a file left by a server
that died is taken over by the next one, and a live owner's never is.

The lock file stays in place: removing it would let a later server lock a
new file while another still held the old one, and both would own.

Use from the thread that runs the server (``serve_forever``): ``claim``
before serving, ``write`` once listening, ``release`` at the end.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["SERVE_JSON", "SERVE_LOCK", "ServeFile"]

SERVE_JSON = "serve.json"
SERVE_LOCK = "serve.lock"


class ServeFile:
    """``data_dir/serve.json``, written and removed only by the server that holds its lock."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / SERVE_JSON
        self.lock_path = data_dir / SERVE_LOCK
        self._lock_fd: int | None = None
        self._wrote = False

    @property
    def owned(self) -> bool:
        """True while this server holds the lock (and so may write and remove the file)."""
        return self._lock_fd is not None

    def claim(self) -> dict[str, Any] | None:
        """Take the file for this server; None when it did, else what the live owner wrote.

        The owner's ``{"url": ..., "pid": ...}`` (without its token) may be
        ``{}`` when it has not written the file yet. Raises ``OSError`` when
        the lock file cannot be made.
        """
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return self._owner()
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd
        return None

    def write(self, info: dict[str, Any]) -> None:
        """Write ``info`` as the file, readable by its owner only (created 0600, never wider)."""
        if self._lock_fd is None:
            raise RuntimeError("ServeFile.write() without claim(): another server owns the file")
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, json.dumps(info).encode())
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self._wrote = True

    def release(self) -> None:
        """Remove the file this server wrote and let the lock go. Idempotent; never raises."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        try:
            if self._wrote:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
        finally:
            os.close(fd)  # The lock goes with the descriptor.

    def _owner(self) -> dict[str, Any]:
        try:
            info = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(info, dict):
            return {}
        return {key: info[key] for key in ("url", "pid") if key in info}
