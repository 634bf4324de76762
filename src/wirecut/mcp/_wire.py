"""What ``McpClient`` watches on the wire, under the SDK's session.

``tapped`` puts a pair of pumps between a transport and the SDK's session: it
learns the JSON-RPC id of each tools/call that carries a call token in its
``_meta`` (``CALL_META_KEY``), and tells when an answer for that id arrives.
The SDK drops an answer that comes after the caller gave up on its request;
the tap sees it, which is how a client knows that a server answered a
cancelled call anyway.

``HttpStreams`` keeps, per call token, the HTTP response whose stream
carries that call's answer, so that the client can close it.

Used on the client's event loop only.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import anyio
import httpx2
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCRequest, JSONRPCResponse, RequestId

from wirecut.mcp._facts import CALL_META_KEY

__all__ = ["HttpStreams", "TapEvents", "tapped"]

_EXTENSION = "wirecut_mcp_call"


class _Receiving(Protocol):
    def __aiter__(self) -> _Receiving: ...
    async def __anext__(self) -> SessionMessage | Exception: ...


class _Sending(Protocol):
    async def send(self, item: SessionMessage, /) -> None: ...
    async def aclose(self) -> None: ...


class TapEvents(Protocol):
    """What the tap reports (on the loop, before the session sees the message)."""

    def sent(self, token: str, request_id: RequestId) -> None: ...
    def answered(self, request_id: RequestId, *, error: bool) -> None: ...


def call_token(params: Mapping[str, Any] | None) -> str | None:
    """The call token in a request's params, or None."""
    meta = (params or {}).get("_meta")
    token = meta.get(CALL_META_KEY) if isinstance(meta, Mapping) else None
    return token if isinstance(token, str) else None


@contextlib.asynccontextmanager
async def tapped(
    transport: AbstractAsyncContextManager[tuple[Any, Any]], events: TapEvents
) -> AsyncIterator[
    tuple[
        MemoryObjectReceiveStream[SessionMessage | Exception],
        MemoryObjectSendStream[SessionMessage],
    ]
]:
    """``transport``'s (read, write) streams, with ``events`` told what passes."""
    async with transport as (read, write):
        inward_send, inward = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        outward, outward_receive = anyio.create_memory_object_stream[SessionMessage](0)

        async def pump_in(source: _Receiving) -> None:
            async with inward_send:
                with contextlib.suppress(
                    anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError
                ):
                    async for item in source:
                        if isinstance(item, SessionMessage):
                            message = item.message
                            if isinstance(message, JSONRPCResponse | JSONRPCError):
                                error = isinstance(message, JSONRPCError)
                                if message.id is not None:
                                    events.answered(message.id, error=error)
                        await inward_send.send(item)

        async def pump_out(sink: _Sending) -> None:
            try:
                async with outward_receive:
                    async for item in outward_receive:
                        message = item.message
                        if isinstance(message, JSONRPCRequest) and message.method == "tools/call":
                            token = call_token(message.params)
                            if token is not None:
                                events.sent(token, message.id)
                        await sink.send(item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            finally:
                with anyio.CancelScope(shield=True):
                    await sink.aclose()

        async with anyio.create_task_group() as pumps:
            pumps.start_soon(pump_in, read)
            pumps.start_soon(pump_out, write)
            try:
                yield inward, outward
            finally:
                pumps.cancel_scope.cancel()


class HttpStreams:
    """The open response of each tools/call POST that carries a call token.

    Install ``hooks`` as an ``httpx2.AsyncClient``'s ``event_hooks``.
    """

    def __init__(self) -> None:
        self._responses: dict[str, httpx2.Response] = {}

    @property
    def hooks(self) -> dict[str, list[Callable[[Any], Any]]]:
        return {"request": [self._on_request], "response": [self._on_response]}

    async def _on_request(self, request: httpx2.Request) -> None:
        try:
            body = json.loads(request.content)
        except (httpx2.RequestNotRead, ValueError):
            return
        if isinstance(body, dict) and body.get("method") == "tools/call":
            params = body.get("params")
            token = call_token(params if isinstance(params, Mapping) else None)
            if token is not None:
                request.extensions[_EXTENSION] = token

    async def _on_response(self, response: httpx2.Response) -> None:
        token = response.request.extensions.get(_EXTENSION)
        if isinstance(token, str):
            self._responses[token] = response

    def forget(self, token: str) -> None:
        self._responses.pop(token, None)

    async def close(self, token: str) -> bool:
        """Close the response stream of ``token``'s call; False if there is none open."""
        response = self._responses.pop(token, None)
        if response is None or response.is_closed:
            return False
        with contextlib.suppress(httpx2.HTTPError, OSError, anyio.BrokenResourceError):
            await response.aclose()
        return True
