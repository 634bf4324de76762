"""``SlowAcker``: a loopback server that acknowledges a COMMIT line only when a test says so."""

from __future__ import annotations

import contextlib
import socket
import threading

from _support import BOUND

__all__ = ["SlowAcker"]


class SlowAcker:
    """A loopback server that acknowledges a ``COMMIT`` line once told to.

    ``got_commit`` is set when the COMMIT arrived; ``ack`` lets the answer
    go; ``peer_closed`` is set when the client's side closed (EOF).
    """

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.got_commit = threading.Event()
        self.ack = threading.Event()
        self.peer_closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.listener.getsockname()[:2]
        return host, port

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return  # closed before any client came
        with conn:
            data = b""
            while not data.endswith(b"COMMIT\n"):
                chunk = conn.recv(1024)
                if not chunk:
                    self.peer_closed.set()
                    return
                data += chunk
            self.got_commit.set()
            self.ack.wait(BOUND)
            with contextlib.suppress(OSError):
                conn.sendall(b"OK\n")
            while conn.recv(1024):
                pass
            self.peer_closed.set()

    def close(self) -> None:
        self.ack.set()
        # shutdown(), not close(), wakes a thread blocked in accept().
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(BOUND)
