"""The client end of one ``/api/console`` WebSocket: frames out, frames sorted by id.

``Link.open`` connects, sends the token as ``Authorization: Bearer`` (so it
stays out of logs that record URLs) and waits for ``ready``. For an address
from ``serve.json`` it first checks that the server there is the one that
wrote the file (``verify_server``): a pid that is gone, or no valid proof from
``/api/proof``, and the token is never sent. A reader task
sorts the server's frames into one ``CommandChannel`` per id the client
submitted; frames for no live id go to ``on_stray``. Everything that can go
wrong with the connection becomes a ``LinkError`` whose message is one line
meant for the user: no server, a refused token (close code 4401), a dropped
connection.

Event loop only: the link, its channels and its callbacks belong to the loop
that opened it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import json
import re
import secrets
from collections.abc import Callable

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from wirecut.client._address import Address, pid_alive
from wirecut.record import (
    CLOSE_FORBIDDEN_ORIGIN,
    CLOSE_SLOW_READER,
    CLOSE_UNAUTHORIZED,
    DEFAULT_PROMPT,
    CancelFrame,
    ConfirmFrame,
    Frame,
    RunFrame,
    proof,
    read_frame,
)

__all__ = [
    "CommandChannel",
    "Link",
    "LinkError",
    "verify_server",
]

#: Close codes a server sends when it stops or restarts.
_CLOSE_STOPPING = {1001, 1012}
#: The ids ``submit`` gives: ``c1``, ``c2``, ... (one count per link).
_OWN_ID = re.compile(r"c([1-9][0-9]*)")


class LinkError(Exception):
    """The connection to the console failed or ended; the message is one line for the user."""


class CommandChannel:
    """The frames of one submitted command, in the order they arrived. Event loop only.

    ``next()`` returns them one by one; once the link is lost and every frame
    received before was read, it raises the link's ``LinkError``.
    """

    def __init__(self, link: Link, id: str, line: str) -> None:
        self.link = link
        self.id = id
        self.line = line
        #: True once the server sent ``accepted`` (until then an ``error`` means "refused").
        self.accepted = False
        #: ``loop.time()`` when this client sent a cancel for it (None: it did not).
        self.cancel_sent_at: float | None = None
        self._frames: asyncio.Queue[Frame | None] = asyncio.Queue()

    async def next(self) -> Frame:
        frame = await self._frames.get()
        if frame is None:
            self._frames.put_nowait(None)  # Every later call fails the same way.
            raise self.link.lost or LinkError("the connection was closed by this client")
        return frame

    def deliver(self, frame: Frame | None) -> None:
        """The link's side: the next frame of this command (None: the link ended)."""
        self._frames.put_nowait(frame)


class Link:
    """One open connection to a console. Event loop only; open it with ``Link.open``."""

    def __init__(self, ws: ClientConnection, address: Address, ready: Frame) -> None:
        self.address = address
        self.ready = ready
        #: Set once the connection ended other than by ``aclose()``: why, in one line.
        self.lost: LinkError | None = None
        #: Called with every frame that belongs to no live command (stray errors, pongs).
        self.on_stray: Callable[[Frame], None] = lambda frame: None
        #: Called once when the connection is lost (not when this client closes it).
        self.on_lost: Callable[[LinkError], None] = lambda error: None
        self._ws = ws
        self._submitted = 0  # how many ids submit() gave: c1 .. c{n}
        self._channels: dict[str, CommandChannel] = {}
        self._closing = False
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def prompt(self) -> str:
        prompt = self.ready.get("prompt")
        return prompt if isinstance(prompt, str) and prompt else DEFAULT_PROMPT

    @property
    def version(self) -> str:
        return str(self.ready.get("version", "?"))

    @classmethod
    async def open(cls, address: Address, *, open_timeout: float = 10.0) -> Link:
        """Connect to ``address`` and wait for its ``ready`` frame; ``LinkError`` if that fails."""
        if address.instance is not None and address.token:
            await verify_server(address, request_timeout=open_timeout)
        headers = {"Authorization": f"Bearer {address.token}"} if address.token else None
        try:
            ws = await connect(
                address.ws_url,
                additional_headers=headers,
                open_timeout=open_timeout,
                # A loopback console is never reached through a proxy from the environment.
                proxy=None if address.loopback else True,
                max_size=None,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            raise LinkError(
                f"{address.display} answered HTTP {status} instead of opening the console "
                "WebSocket: is it a wirecut console?"
            ) from None
        except (InvalidHandshake, InvalidURI) as exc:
            raise LinkError(
                f"cannot open the console WebSocket at {address.display}: {exc}"
            ) from None
        except TimeoutError:
            raise LinkError(f"no answer from {address.display} within {open_timeout:g} s") from None
        except OSError as exc:
            raise LinkError(_unreachable(address, exc)) from None
        try:
            async with asyncio.timeout(open_timeout):
                message = await ws.recv()
        except ConnectionClosed as exc:
            raise _closed_error(address, exc) from None
        except TimeoutError:
            await ws.close()
            raise LinkError(
                f"{address.display} sent no ready frame within {open_timeout:g} s: "
                "is it a wirecut console?"
            ) from None
        ready = read_frame(message)
        if ready is None or ready.get("type") != "ready":
            await ws.close()
            raise LinkError(
                f"{address.display} did not greet with a ready frame: is it a wirecut console?"
            )
        return cls(ws, address, ready)

    # -- frames out -----------------------------------------------------------------

    async def submit(self, line: str, *, time_limit: float | None = None) -> CommandChannel:
        """Send ``run`` for ``line`` under a new id; its frames arrive on the returned channel.

        ``time_limit`` is the run frame's ``timeout`` (seconds; the server caps it).
        """
        self._submitted += 1
        channel = CommandChannel(self, f"c{self._submitted}", line)
        self._channels[channel.id] = channel
        try:
            await self._send(RunFrame(channel.id, line, time_limit).to_wire())
        except LinkError:
            del self._channels[channel.id]
            raise
        return channel

    def finished(self, id: object) -> bool:
        """True when ``id`` is one this link submitted and whose last frame has come.

        An ``error`` about such an id (its ``ref``: docs/protocol.md,
        "Extensions") is this client's ``cancel`` or ``confirm`` that crossed
        the command's ``complete`` on the wire. Ids are recognised by their
        form rather than kept, so a long session holds no list of them.
        """
        if not isinstance(id, str) or id in self._channels:
            return False
        own = _OWN_ID.fullmatch(id)
        return own is not None and int(own[1]) <= self._submitted

    async def cancel(self, id: str | None = None) -> None:
        """Ask the server to cancel ``id`` (None: every command of this connection)."""
        await self._send(CancelFrame(id).to_wire())

    async def confirm(self, id: str) -> None:
        """Answer the ``confirm_required`` of ``id``: go ahead."""
        await self._send(ConfirmFrame(id).to_wire())

    async def aclose(self) -> None:
        """Close the connection (the server cancels what is still running) and wake every channel.

        Idempotent.
        """
        self._closing = True
        with contextlib.suppress(Exception):
            await self._ws.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        self._wake_all()

    async def _send(self, frame: Frame) -> None:
        if self.lost is not None:
            raise self.lost
        if self._closing:
            raise LinkError("the connection was closed by this client")
        try:
            await self._ws.send(json.dumps(frame))
        except ConnectionClosed as exc:
            raise _closed_error(self.address, exc) from None

    # -- frames in -------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            while True:
                frame = read_frame(await self._ws.recv())
                if frame is not None:
                    self._dispatch(frame)
        except ConnectionClosed as exc:
            if not self._closing:
                self.lost = _closed_error(self.address, exc)
        finally:
            self._wake_all()
            if self.lost is not None:
                self.on_lost(self.lost)

    def _dispatch(self, frame: Frame) -> None:
        id = frame.get("id")
        channel = self._channels.get(id) if isinstance(id, str) else None
        if channel is None:
            self.on_stray(frame)
            return
        kind = frame.get("type")
        if kind == "accepted":
            channel.accepted = True
        channel.deliver(frame)
        # After complete nothing more comes for this id; an error before
        # accepted means the run was refused, and nothing more comes either.
        if kind == "complete" or (kind == "error" and not channel.accepted):
            del self._channels[channel.id]

    def _wake_all(self) -> None:
        for channel in self._channels.values():
            channel.deliver(None)
        self._channels.clear()


async def verify_server(address: Address, *, request_timeout: float = 10.0) -> None:
    """Check that the server at ``address`` holds its token, without sending it.

    For an address from ``serve.json`` (``address.instance`` set): the pid it
    names must be alive, and the server must answer a fresh random challenge
    with the HMAC of it keyed by the token, for that instance
    (docs/protocol.md, ``/api/proof``). Raises ``LinkError`` (one line: the
    file is stale, the token was not sent) otherwise.
    """
    assert address.instance is not None
    assert address.token is not None
    source = address.source
    if address.pid is not None and not pid_alive(address.pid):
        raise LinkError(
            f"{source} is stale: its server (pid {address.pid}) is not running, so the token "
            "was not sent; start `wirecut serve`"
        )
    challenge = secrets.token_urlsafe(32)
    expected = proof(address.token, address.instance, challenge)
    why: str | None = None
    try:
        # No proxy from the environment: serve.json names a server on this machine.
        async with httpx.AsyncClient(timeout=request_timeout, trust_env=False) as client:
            response = await client.get(address.proof_url, params={"challenge": challenge})
    except httpx.TimeoutException:
        why = f"no answer within {request_timeout:g} s"
    except httpx.ConnectError as exc:
        raise LinkError(_unreachable(address, _os_error(exc))) from None
    except httpx.HTTPError as exc:
        why = f"the request failed: {type(exc).__name__}"
    else:
        if response.status_code != 200:
            why = f"/api/proof answered HTTP {response.status_code}"
        else:
            try:
                given = response.json().get("proof")
            except (ValueError, AttributeError):
                given = None
            if not isinstance(given, str) or not hmac.compare_digest(given, expected):
                why = "its proof was wrong"
    if why is not None:
        raise LinkError(
            f"the server at {address.display} did not prove it is the console that wrote "
            f"{source} ({why}), so the token was not sent: the file is stale and another "
            "program has the port; restart `wirecut serve`"
        )


def _os_error(exc: BaseException) -> OSError:
    """The ``OSError`` under an httpx error (its causes), or one with its message."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError):
            return cause
        cause = cause.__cause__ or cause.__context__
    return OSError(str(exc))


def _unreachable(address: Address, exc: OSError) -> str:
    why = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno == errno.ECONNREFUSED or isinstance(exc, ConnectionRefusedError):
        why = "connection refused"
    line = f"no console at {address.display} ({why})"
    if address.pid is not None and not pid_alive(address.pid):
        return f"{line}: {address.source} is stale, its server (pid {address.pid}) is not running"
    if address.pid is not None:
        return line
    return f"{line}: is `wirecut serve` running there?"


def _closed_error(address: Address, exc: ConnectionClosed) -> LinkError:
    """One line for a connection the server closed (or that broke)."""
    close = exc.rcvd
    where = address.display
    if close is None:
        return LinkError(f"the connection to {where} was lost (no close frame)")
    if close.code == CLOSE_UNAUTHORIZED:
        if address.token is None:
            return LinkError(
                f"the console at {where} wants a token (close code 4401): give it as ?token= "
                "in the URL or in $WIRECUT_TOKEN"
            )
        return LinkError(
            f"the console at {where} refused the token from {address.token_from} (close code 4401)"
        )
    if close.code == CLOSE_FORBIDDEN_ORIGIN:
        return LinkError(f"the console at {where} refused this client's Origin (close code 4403)")
    if close.code == CLOSE_SLOW_READER:
        return LinkError(
            f"the console at {where} closed the connection because this client did not read "
            "its frames fast enough (close code 4429); its commands were cancelled"
        )
    if close.code in _CLOSE_STOPPING:
        return LinkError(f"the console at {where} is shutting down (close code {close.code})")
    reason = f": {close.reason}" if close.reason else ""
    return LinkError(f"the console at {where} closed the connection (code {close.code}{reason})")
