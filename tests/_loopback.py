"""Loopback servers for the tests and the benchmark, and two instruments of their own.

The servers are the product's (``wirecut.loopback``):
the ``probe`` command uses the same ones. ``LoopbackServer`` scripts an
HTTP/1.1 server a handler at a time, ``StallServer`` never answers a TLS
ClientHello, ``FullBacklog`` is a listener a connect to which stays pending.

Here only what a test needs and the product must not have: ``self_signed``
makes a certificate for 127.0.0.1 with the openssl command, and
``connect_started`` watches this process's connects through an audit hook.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from wirecut.loopback import FullBacklog, LoopbackServer, StallServer
from wirecut.loopback import LoopbackExchange as Exchange
from wirecut.loopback import LoopbackRequest as Request

__all__ = [
    "Exchange",
    "FullBacklog",
    "LoopbackServer",
    "Request",
    "StallServer",
    "connect_started",
    "self_signed",
]


def self_signed(directory: Path) -> tuple[ssl.SSLContext, ssl.SSLContext, Path] | None:
    """A server context with a fresh certificate for 127.0.0.1, a client context that
    trusts it, and the certificate file; None without the openssl command."""
    if shutil.which("openssl") is None:
        return None
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    return server, client, cert


# Ports whose next connect() sets the Event; filled by connect_started().
_connect_waiters: dict[int, threading.Event] = {}
_audit_installed = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect" and _connect_waiters:
        address = args[1]
        if isinstance(address, tuple) and len(address) >= 2:
            waiter = _connect_waiters.pop(address[1], None)
            if waiter is not None:
                waiter.set()


def connect_started(port: int) -> threading.Event:
    """An Event set when some thread of this process next starts a connect to ``port``.

    Set from Python's ``socket.connect`` audit event, which fires as the
    connect is issued: a test can then cancel while the connect is pending.
    """
    global _audit_installed
    if not _audit_installed:
        sys.addaudithook(_audit)  # Hooks cannot be removed; this one costs a dict lookup.
        _audit_installed = True
    event = threading.Event()
    _connect_waiters[port] = event
    return event
