"""``cancel_on_disconnect``: a request's scope, cancelled when its HTTP client goes away.

An ASGI server tells an app that the client left by answering ``receive()``
with ``http.disconnect``; nobody asks while the app awaits its work, and
Starlette and FastAPI do not cancel the endpoint either. So the work of a
client that left runs on, and with it the provider's slot. The helper reads
``receive()`` beside the endpoint and cancels the scope at the disconnect;
``run_sync`` (or anything else bound to that scope) is then cut.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request

from wirecut.scope import InterruptScope

__all__ = ["DISCONNECT_REASON", "cancel_on_disconnect"]

#: The reason given to the scope when the client disconnects.
DISCONNECT_REASON = "disconnect"


@contextlib.asynccontextmanager
async def cancel_on_disconnect(
    request: Request, scope: InterruptScope | None = None, *, reason: str = DISCONNECT_REASON
) -> AsyncIterator[InterruptScope]:
    """Yield ``scope`` (default: a new ``InterruptScope``), cancelled if the client disconnects.

    Use in a Starlette or FastAPI endpoint, on the request's event loop,
    around the work done for that request::

        async with cancel_on_disconnect(request) as scope:
            reply = await run_sync(client.chat, messages, scope=scope)

    The request body is read (and kept: ``request.body()`` and
    ``request.json()`` still work) before the watch starts, because the
    watch takes every message ``receive()`` gives. Do not return a
    streaming response from inside the block: it would compete for them.

    Cancellation: at the client's disconnect, ``scope.cancel(reason)`` (the
    first reason wins); the work bound to the scope sees the cut at once (a
    ``ChatClient`` returns its partial result marked ``interrupted``). A
    client already gone when the block starts cancels the scope at once.
    Leaving the block stops the watch, after a last look at whether the
    client left meanwhile; it never cancels the scope otherwise, so a
    request that finished keeps an open scope.

    After the block, ``scope.cancelled`` says whether the client left: check
    it before answering. Work can return a whole answer that was complete
    before the cut reached it (its last token came between the disconnect
    and the cut), and that answer has nobody to go to.
    """
    if scope is None:
        scope = InterruptScope("request")
    try:
        await request.body()
    except ClientDisconnect:
        scope.cancel(reason)
    watch = asyncio.create_task(_watch(request, scope, reason))
    try:
        yield scope
    finally:
        watch.cancel()
        try:
            await watch
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # Our own task is being cancelled, not just the watch.
    if not scope.cancelled and await request.is_disconnected():
        scope.cancel(reason)  # It left after the watch's last read.


async def _watch(request: Request, scope: InterruptScope, reason: str) -> None:
    receive = request.receive
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel(reason)
            return
