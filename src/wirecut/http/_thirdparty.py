"""Every private attribute of a third-party library that wirecut relies on, checked.

httpx takes no network backend, so the scoped transports set one on the pool
that ``HTTPTransport`` made (``transport._pool._network_backend``); the
scoped backends wrap their own connected sockets in httpcore's ``SyncStream``;
the requests adapter reads ``socket._io_refs`` and overrides urllib3's pool
methods. None of these is public API. If a release renames one, an assignment
would silently create a new attribute and nothing could be cut any more, so
each is checked where it is first needed (a transport's construction, a
module's import) and a missing one is a ``RuntimeError`` that names the
library and its version. pyproject caps the majors these were checked against.

Only this module (and the checked overrides in ``wirecut.adapters``) touches
them. Safe from any thread.
"""

from __future__ import annotations

import importlib
import inspect
import os
import socket
import ssl
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = [
    "HTTPCoreFlavour",
    "httpcore_flavour",
    "install_network_backend",
    "require_private",
    "shared_ssl_context",
    "socket_io_refs",
]


def _unsupported(package: str, what: str) -> RuntimeError:
    try:
        version = importlib.import_module(package).__version__
    except (ImportError, AttributeError):
        version = "(unknown version)"
    return RuntimeError(
        f"wirecut cannot make {package} {version} cuttable: {what} is missing or changed; "
        f"install a {package} release that wirecut supports (see its pyproject caps)"
    )


def require_private(owner: type, names: tuple[str, ...], package: str) -> None:
    """Fail loudly unless ``owner`` has every attribute in ``names`` (methods wirecut overrides)."""
    for name in names:
        if not callable(getattr(owner, name, None)):
            raise _unsupported(package, f"{owner.__module__}.{owner.__qualname__}.{name}")


@dataclass(frozen=True)
class HTTPCoreFlavour:
    """What the scoped backend needs from one httpcore-like library (httpcore or httpcore2)."""

    package: str
    #: ``SyncStream(sock)``: httpcore's own stream over a connected socket
    #: (reads, writes, TLS including TLS-in-TLS, extra info).
    sync_stream: Any
    connect_error: type[Exception]  # raised for a failed connect
    connect_timeout: type[Exception]  # raised for a connect that timed out


_flavours: dict[str, HTTPCoreFlavour] = {}


def httpcore_flavour(module: ModuleType) -> HTTPCoreFlavour:
    """The flavour of ``module`` (``httpcore`` or ``httpcore2``), checked once per process."""
    flavour = _flavours.get(module.__name__)
    if flavour is not None:
        return flavour
    package = module.__name__
    try:
        sync = importlib.import_module(f"{package}._backends.sync")
    except ImportError:
        raise _unsupported(package, f"{package}._backends.sync") from None
    stream = getattr(sync, "SyncStream", None)
    if not (isinstance(stream, type) and issubclass(stream, module.NetworkStream)):
        raise _unsupported(package, f"{package}._backends.sync.SyncStream")
    if list(inspect.signature(stream).parameters) != ["sock"]:
        raise _unsupported(package, f"{package}._backends.sync.SyncStream(sock)")
    flavour = HTTPCoreFlavour(package, stream, module.ConnectError, module.ConnectTimeout)
    _flavours[package] = flavour
    return flavour


def install_network_backend(transport: Any, backend: Any, package: str) -> None:
    """Make the pool of an httpx(2) ``HTTPTransport`` connect through ``backend``.

    ``ConnectionPool``, ``HTTPProxy`` and ``SOCKSProxy`` all keep their
    backend in ``_network_backend``; ``HTTPTransport`` keeps the pool in ``_pool``.
    """
    pool = getattr(transport, "_pool", None)
    if pool is None or getattr(pool, "_network_backend", None) is None:
        raise _unsupported(package, "HTTPTransport._pool._network_backend")
    pool._network_backend = backend


if "_io_refs" not in getattr(socket.socket, "__slots__", ()):  # pragma: no cover
    raise RuntimeError("wirecut needs socket.socket._io_refs (CPython), which this Python lacks")


def socket_io_refs(sock: socket.socket) -> int:
    """How many ``makefile()`` objects still use ``sock``: ``close()`` only closes it at 0."""
    refs: int = sock._io_refs  # type: ignore[attr-defined]
    return refs


# -- one SSL context per configuration and process --------------------------------

# Guards _ssl_contexts; held while a context is built, so that two threads
# asking for the same one at once build it once.
_ssl_lock = threading.Lock()
_ssl_contexts: dict[tuple[Any, ...], ssl.SSLContext] = {}


def shared_ssl_context(
    httpx_module: ModuleType, verify: Any, cert: Any, trust_env: bool
) -> ssl.SSLContext:
    """``httpx_module.create_ssl_context(verify, cert, trust_env)``, built once per process.

    Loading the certificate store takes ~16-20 ms, and a scoped transport
    makes a pool per scope: every pool of the same configuration shares the
    context instead (an ``SSLContext`` is safe to share between threads; httpx
    shares one between all connections of a pool). A context passed in as
    ``verify`` is used as is. The environment that ``trust_env`` reads
    (``SSL_CERT_FILE``, ``SSL_CERT_DIR``) is part of the key.
    """
    if isinstance(verify, ssl.SSLContext) and not cert:
        return verify
    if isinstance(verify, ssl.SSLContext):
        key: tuple[Any, ...] = (httpx_module.__name__, id(verify), cert, trust_env)
    else:
        env = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")) if trust_env else ()
        key = (httpx_module.__name__, verify, cert, trust_env, env)
    with _ssl_lock:
        context = _ssl_contexts.get(key)
        if context is None:
            context = httpx_module.create_ssl_context(verify=verify, cert=cert, trust_env=trust_env)
            _ssl_contexts[key] = context
    return context
