"""Fixtures more than one test file takes (pytest finds them here by name)."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from _acker import SlowAcker
from _loopback import self_signed
from _sim import sim_factory
from wirecut.simulator import SimulatorServer


@pytest.fixture
def acker() -> Iterator[SlowAcker]:
    """A peer that acknowledges a COMMIT only when told to (``_acker``)."""
    server = SlowAcker()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def make_sim() -> Iterator[Callable[..., SimulatorServer]]:
    """Start simulators with ``_sim.FAST`` defaults overridden by keywords; stop them all after."""
    yield from sim_factory()


@pytest.fixture
def tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed server context and a client context that trusts it (``self_signed``)."""
    made = self_signed(tmp_path)
    if made is None:
        pytest.skip("needs the openssl command")
    return made[0], made[1]
