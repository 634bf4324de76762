"""What the proxy says on the wire itself: OpenAI-shaped errors, and the ASGI messages.

Pure functions and small coroutines over an ASGI ``send``; call them on the
event loop.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Send

__all__ = [
    "FINAL",
    "REQUEST_ID_HEADER",
    "error_body",
    "error_event",
    "send_body",
    "send_json",
    "send_start",
]

#: The response header that names a proxied request (its id for cancel by id).
REQUEST_ID_HEADER = "x-wirecut-request-id"
#: What tells an SDK not to send a request again (the openai SDK reads it
#: before its status rules, which retry a 504).
FINAL = {"x-should-retry": "false"}


def error_body(
    message: str, type_: str, *, param: str | None = None, code: str | None = None
) -> bytes:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}},
        separators=(",", ":"),
    ).encode()


def error_event(message: str, type_: str, code: str | None = None) -> bytes:
    """The same error as the last event of a stream (the openai SDK raises it as an APIError)."""
    return b"data: " + error_body(message, type_, code=code) + b"\n\n"


def _headers(
    request_id: str | None, content_type: str, extra: dict[str, str]
) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", content_type.encode("latin-1"))]
    if request_id is not None:
        headers.append((REQUEST_ID_HEADER.encode(), request_id.encode("latin-1")))
    headers.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items())
    return headers


async def send_start(
    send: Send,
    status: int,
    content_type: str,
    request_id: str | None,
    extra: dict[str, str] | None = None,
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": _headers(request_id, content_type, extra or {}),
        }
    )


async def send_body(send: Send, body: bytes, *, more: bool = False) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": more})


async def send_json(
    send: Send,
    status: int,
    body: bytes | dict[str, Any],
    request_id: str | None,
    content_type: str = "application/json",
    extra: dict[str, str] | None = None,
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
    headers = {"content-length": str(len(data)), **(extra or {})}
    await send_start(send, status, content_type, request_id, headers)
    await send_body(send, data)
