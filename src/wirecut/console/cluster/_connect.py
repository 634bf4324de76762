"""Connecting the serve process to a Ray cluster: ``wirecut serve --ray ADDRESS``.

``connect("auto")`` joins the cluster that ``ray.init()`` finds by itself
(``RAY_ADDRESS``, or the one ``ray start`` last started on this machine);
``connect("local")`` starts a one-node cluster in this process's care;
anything else is a cluster address (``HOST:PORT`` of its head). Either way
this process becomes a Ray driver in the namespace ``wirecut``, with the
workers' own logs kept out of the console's output.
"""

from __future__ import annotations

import logging
import socket

__all__ = ["ClusterUnavailable", "address_problem", "connect", "disconnect"]


class ClusterUnavailable(Exception):
    """The cluster could not be reached or started; the message says why, in one line."""


def connect(address: str) -> bool:
    """Initialise Ray for ``address``; True if this started a local cluster (``local``).

    Call once, from the main thread, before the server starts. Does nothing
    (and returns False) if Ray is initialised already.
    """
    import ray

    from wirecut.console.cluster._pool import NAMESPACE

    problem = address_problem(address)
    if problem is not None:
        raise ClusterUnavailable(problem)
    if ray.is_initialized():
        return False
    if address not in ("auto", "local"):
        _probe(address)
    options = {"namespace": NAMESPACE, "log_to_driver": False, "logging_level": logging.WARNING}
    try:
        if address == "local":
            ray.init(include_dashboard=False, **options)  # type: ignore[arg-type]
            return True
        ray.init(address=address, **options)  # type: ignore[arg-type]
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ClusterUnavailable(f"cannot join the Ray cluster at {address}: {first}") from None
    return False


def disconnect() -> None:
    """Leave the cluster; a local cluster that ``connect("local")`` started stops with it."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


#: How long the head's address may take to accept a connection.
PROBE_TIMEOUT = 5.0


def address_problem(address: str) -> str | None:
    """What is wrong with ``address`` as ``--ray``'s value, in one line; None if nothing."""
    if address in ("auto", "local"):
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"--ray takes auto, local, or HOST:PORT of the cluster's head, not {address!r}"
    return None


def _probe(address: str) -> None:
    """Refuse, in one line, an address where nothing listens (``ray.init`` would wait minutes)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise ClusterUnavailable(f"cannot join the Ray cluster at {address}: {why}") from None
