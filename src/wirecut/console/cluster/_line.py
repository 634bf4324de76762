"""The cancel line: a host's cancels straight from its serve process, over one TCP connection.

A cancel sent as a Ray control call reaches the host's control thread after
Ray's own path (the call's submission, gRPC, the actor's thread pool, the
call's Python wrapper), in turns with the workers that the first cuts of a
burst woke (docs/cluster.md, "The cancel line").
The line is one socket per host, read by a thread of the host that does
nothing else: a cancel is one write in the serve process and one read on the
host.

The wire: the serve process writes the host's token (``HostConfig.line_token``)
as the first line, then one JSON array ``[job_id, reason]`` a line. The host
answers each in order with one line: ``cancelling``, ``dropped`` or ``done``,
the kinds of the ``cancel`` control call. Only ``cancelling`` needs nothing
more; for the other two the serve process asks again by the control call,
whose answer carries the receipt.

Ray stays the way of a cancel when there is no line: before it is connected,
when it cannot be (a firewall between the nodes), once it broke until the
pool has connected it again (``_pool.LINE_RETRY``), and for a cancel the
line has not answered within ``ANSWER_TIMEOUT`` (sent again: a cancel is
idempotent).

Bounds (the port can be reached by whoever reaches the node): at most
``MAX_CONNECTIONS`` connections at once; a connection that has not sent the
token within ``TOKEN_SECONDS``, sends a wrong one, a line longer than
``MAX_LINE``, a line that is not a request, or does not read its answers is
closed. Nothing but a cancel can be asked.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import json
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wirecut.record import Reason

__all__ = ["ANSWER_TIMEOUT", "CancelLine", "LineClient", "LineRequest"]

_log = logging.getLogger("wirecut.cluster")

#: Connections a host's line accepts at once (its serve process needs one).
MAX_CONNECTIONS = 4
#: How long a new connection has to send the token, in seconds.
TOKEN_SECONDS = 5.0
#: The longest line the host reads, in bytes: a 64-character client id,
#: escaped, is far below it.
MAX_LINE = 1024
#: The kernel's send buffer of a connection, in bytes (room for thousands of answers).
SEND_BUFFER = 65536
#: How long the serve process waits for the line's answer to a cancel before
#: it sends that cancel by the control call as well, in seconds.
ANSWER_TIMEOUT = 0.5
#: How long the serve process tries to connect a host's line, in seconds.
CONNECT_TIMEOUT = 2.0

#: A job id and the reason of its cancel.
LineRequest = tuple[str, str]
#: The host's cancel: takes the requests; returns one answer kind per request.
HostCancel = Callable[[list[LineRequest]], list[str]]

_KINDS = frozenset({"cancelling", "dropped", "done"})
_REASONS = frozenset(reason.value for reason in Reason)


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    token_by: float
    authenticated: bool = False
    buffer: bytearray = field(default_factory=bytearray)


class CancelLine:
    """The host's end: a listening socket and the one thread that reads it.

    ``cancel`` runs on that thread, one call per read with every request the
    read completed. It must never block: it cuts, and queues the rest.
    """

    def __init__(
        self,
        address: str,
        token: str,
        cancel: HostCancel,
        *,
        token_seconds: float = TOKEN_SECONDS,
    ) -> None:
        self._token = token.encode()
        self._cancel = cancel
        self._token_seconds = token_seconds
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.create_server((address, 0), family=family)
        self._listener.setblocking(False)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._wake_read, self._wake_write = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        self._connections: dict[socket.socket, _Connection] = {}
        self._closed = False
        self._thread = threading.Thread(
            target=self._serve, name="wirecut-host-cancel-line", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return self.address[1]

    def close(self) -> None:
        """Stop reading and close every connection (the thread ends within a moment)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")
        self._thread.join(5)

    # -- the line's thread ----------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while not self._closed:
                for key, _ in self._selector.select(self._timeout()):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is not self._wake_read:
                        self._read_guarded(key.data)
                self._expire()
        except Exception:
            _log.exception("the host's cancel line failed: its cancels go by Ray")
        finally:
            for connection in list(self._connections.values()):
                self._drop(connection)
            self._selector.close()
            for sock in (self._listener, self._wake_read, self._wake_write):
                sock.close()

    def _timeout(self) -> float | None:
        ends = [c.token_by for c in self._connections.values() if not c.authenticated]
        return max(0.0, min(ends) - time.monotonic()) if ends else None

    def _expire(self) -> None:
        now = time.monotonic()
        for connection in list(self._connections.values()):
            if not connection.authenticated and now >= connection.token_by:
                self._drop(connection)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        if len(self._connections) >= MAX_CONNECTIONS:
            sock.close()
            return
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Answers are a few bytes each: a client that reads none fills this soon.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        except OSError:  # reset by its client already
            sock.close()
            return
        connection = _Connection(sock, time.monotonic() + self._token_seconds)
        self._connections[sock] = connection
        self._selector.register(sock, selectors.EVENT_READ, connection)

    def _read_guarded(self, connection: _Connection) -> None:
        # What goes wrong with one connection ends that one, not the line.
        try:
            self._read(connection)
        except Exception:
            _log.exception("a connection of the host's cancel line failed: it is closed")
            self._drop(connection)

    def _read(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(connection)
            return
        connection.buffer += data
        requests, good = self._requests(connection)
        if requests:
            answers = self._cancel(requests)
            reply = "".join(f"{kind}\n" for kind in answers).encode()
            try:
                sent = connection.sock.send(reply)
            except OSError:
                sent = -1
            if sent != len(reply):  # it does not read its answers: no more for it
                good = False
        if not good:
            self._drop(connection)

    def _requests(self, connection: _Connection) -> tuple[list[LineRequest], bool]:
        """The requests of the lines ``connection`` completed, and False if it must be dropped."""
        requests: list[LineRequest] = []
        buffer = connection.buffer
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if len(line) > MAX_LINE:
                return requests, False
            if not connection.authenticated:
                if not hmac.compare_digest(line, self._token):
                    return requests, False
                connection.authenticated = True
                continue
            request = _request(line)
            if request is None:
                return requests, False
            requests.append(request)
        return requests, len(buffer) <= MAX_LINE

    def _drop(self, connection: _Connection) -> None:
        self._connections.pop(connection.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(connection.sock)
        connection.sock.close()


def _request(line: bytes) -> LineRequest | None:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and value[1] in _REASONS
    ):
        return value[0], value[1]
    return None


# -- the serve process's end -----------------------------------------------------------------


@dataclass(eq=False)
class _Sent:
    job: Any
    reason: str
    at: float
    #: Sent by the control call as well, once the line was late: its answer is ignored.
    rerouted: bool = False


class LineClient:
    """The serve process's end of one host's line (event loop only).

    ``send`` writes a cancel; the answer goes to the job's
    ``on_cancel_answer("cancelling", None)``. A cancel the line cannot settle
    goes to ``by_ray(job, reason)``, the control call: one answered
    ``dropped`` or ``done`` (the control call brings its receipt), one not
    answered within ``ANSWER_TIMEOUT``, and every one unanswered when the line
    breaks.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        by_ray: Callable[[Any, str], None],
        *,
        name: str = "host",
        answer_timeout: float = ANSWER_TIMEOUT,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._by_ray = by_ray
        self._name = name
        self._answer_timeout = answer_timeout
        self._sent: collections.deque[_Sent] = collections.deque()
        self._check: asyncio.TimerHandle | None = None
        self.closed = False
        self._answers = asyncio.get_running_loop().create_task(self._read_answers())

    @classmethod
    async def connect(
        cls,
        address: tuple[str, int],
        token: str,
        by_ray: Callable[[Any, str], None],
        *,
        name: str = "host",
        answer_timeout: float = ANSWER_TIMEOUT,
    ) -> LineClient:
        """Connect to a host's line and send the token; ``OSError`` or ``TimeoutError`` if not."""
        async with asyncio.timeout(CONNECT_TIMEOUT):
            reader, writer = await asyncio.open_connection(*address)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        writer.write(token.encode() + b"\n")
        return cls(reader, writer, by_ray, name=name, answer_timeout=answer_timeout)

    def send(self, job: Any, reason: str) -> bool:
        """Write the cancel of ``job``; False if the line is closed (send it by Ray)."""
        if self.closed:
            return False
        self._writer.write(json.dumps([job.id, reason]).encode() + b"\n")
        self._sent.append(_Sent(job, reason, time.monotonic()))
        if self._check is None:
            self._check = asyncio.get_running_loop().call_later(self._answer_timeout, self._late)
        return True

    def close(self) -> None:
        """Close the line; the cancels it has not answered are left as they are."""
        if not self.closed:
            self.closed = True
            self._answers.cancel()
            self._writer.close()
        if self._check is not None:
            self._check.cancel()
            self._check = None

    async def wait_closed(self) -> None:
        """Wait until a closed line's socket is closed too."""
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await self._answers
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()

    def _late(self) -> None:
        # Whatever waited past its time goes by Ray as well; the line stays.
        self._check = None
        now = time.monotonic()
        for sent in self._sent:
            if not sent.rerouted and now - sent.at >= self._answer_timeout:
                sent.rerouted = True
                self._by_ray(sent.job, sent.reason)
        waiting = [sent.at for sent in self._sent if not sent.rerouted]
        if waiting and not self.closed:
            delay = min(waiting) + self._answer_timeout - now
            self._check = asyncio.get_running_loop().call_later(delay, self._late)

    async def _read_answers(self) -> None:
        why = "closed by the host"
        try:
            while line := await self._reader.readline():
                wrong = self._answer(line.decode("ascii", "replace").strip())
                if wrong is not None:
                    why = wrong
                    break
        except (OSError, ValueError) as exc:  # ValueError: a line over the reader's limit
            why = str(exc) or type(exc).__name__
        self._broken(why)

    def _answer(self, kind: str) -> str | None:
        """Hand the answer ``kind`` to its cancel; what was wrong with it, or None.

        A method of its own, so that no local of the reading coroutine keeps
        the last job (and its command) while it waits for the next answer.
        """
        if kind not in _KINDS or not self._sent:
            return f"an answer it did not expect: {kind[:40]!r}"
        sent = self._sent.popleft()
        if sent.rerouted:
            pass
        elif kind == "cancelling":
            sent.job.on_cancel_answer(kind, None)
        else:
            self._by_ray(sent.job, sent.reason)
        return None

    def _broken(self, why: str) -> None:
        if self.closed:
            return
        _log.warning(
            "the cancel line of %s broke (%s): its cancels go by Ray until it is connected again",
            self._name,
            why,
        )
        self.closed = True
        self._writer.close()
        if self._check is not None:
            self._check.cancel()
            self._check = None
        while self._sent:
            sent = self._sent.popleft()
            if not sent.rerouted:
                self._by_ray(sent.job, sent.reason)
