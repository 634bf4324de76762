"""Fixtures more than one test file takes (pytest finds them here by name)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from _acker import SlowAcker


@pytest.fixture
def acker() -> Iterator[SlowAcker]:
    """A peer that acknowledges a COMMIT only when told to (``_acker``)."""
    server = SlowAcker()
    try:
        yield server
    finally:
        server.close()
