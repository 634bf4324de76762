"""What the simulator's tests share: start simulators, send raw requests, read the wire.

Every wait is ``sim.wait_for`` on the simulator's event log (a condition
variable) or a blocking read with a bound: nothing here sleeps.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from wirecut.simulator import EventKind, SimConfig, SimEvent, SimulatorServer

__all__ = [
    "FAST",
    "HELLO",
    "body_for",
    "of",
    "raw_post",
    "request_id_of",
    "sim_factory",
    "sse_events",
]

FAST: dict[str, Any] = {"tokens_per_second": 200.0, "prompt_ms": 10.0, "reply_tokens": 8}
HELLO = [{"role": "user", "content": "hello"}]


def sim_factory() -> Iterator[Callable[..., SimulatorServer]]:
    """Yield a function that starts simulators with FAST defaults overridden; stop them after."""
    servers: list[SimulatorServer] = []

    def make(responder: Any = None, **overrides: Any) -> SimulatorServer:
        server = SimulatorServer(SimConfig(**{**FAST, **overrides}), responder=responder)
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def body_for(route: str, text: str = "hello", **fields: Any) -> dict[str, Any]:
    """A minimal valid body for ``route`` whose prompt is one user message ``text``."""
    if route == "/v1/completions":
        return {"prompt": text, **fields}
    if route == "/v1/responses":
        return {"input": text, **fields}
    return {"messages": [{"role": "user", "content": text}], **fields}


def raw_post(sim: SimulatorServer, path: str, body: dict[str, Any]) -> socket.socket:
    """Send a POST on a raw socket and leave the response unread."""
    sock = socket.create_connection((sim.host, sim.port), timeout=10)
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: sim\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def request_id_of(sim: SimulatorServer, sock: socket.socket) -> str:
    """The simulator's id for the request sent on ``sock`` (matched by client port)."""
    host, port = sock.getsockname()[:2]
    event = sim.wait_for(
        lambda ev: (
            ev.kind == EventKind.REQUEST_RECEIVED and ev.detail["client"] == f"{host}:{port}"
        ),
        timeout=5,
    )
    assert event.request_id is not None
    return event.request_id


def of(kind: EventKind, request_id: str) -> Callable[[SimEvent], bool]:
    return lambda ev: ev.kind == kind and ev.request_id == request_id


def sse_events(lines: Iterable[str]) -> list[tuple[str | None, str]]:
    """Server-sent events as ``(event name or None, data)``, in order."""
    events: list[tuple[str | None, str]] = []
    name: str | None = None
    data: list[str] = []
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data.append(line[len("data: ") :])
        elif not line and data:
            events.append((name, "\n".join(data)))
            name, data = None, []
    if data:
        events.append((name, "\n".join(data)))
    return events
