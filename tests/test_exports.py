"""Every public package lists its names in a complete, sorted ``__all__``."""

from __future__ import annotations
import __future__

import importlib
import types

import pytest

PACKAGES = [
    "wirecut.agent",
    "wirecut.aio",
    "wirecut.client",
    "wirecut.console.cluster",
    "wirecut.console.commands",
    "wirecut.console.runner",
    "wirecut.console.server",
    "wirecut.http",
    "wirecut.launch",
    "wirecut.local",
    "wirecut.loopback",
    "wirecut.mcp",
    "wirecut.memory",
    "wirecut.proof",
    "wirecut.provider",
    "wirecut.proxy",
    "wirecut.record",
    "wirecut.scope",
    "wirecut.serving",
    "wirecut.simulator",
]


def _isort_key(name: str) -> tuple[int, str]:
    # The order ruff's RUF022 keeps: CONSTANTS, then Classes, then functions.
    kind = 0 if name.isupper() else 1 if name[0].isupper() else 2
    return kind, name


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_complete_and_sorted(name: str) -> None:
    module = importlib.import_module(name)
    public = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and not isinstance(value, types.ModuleType | __future__._Feature)
    }
    assert set(module.__all__) == public
    assert list(module.__all__) == sorted(module.__all__, key=_isort_key)
