"""The console: a host that runs commands on a thread pool and cancels them for real.

``runner`` owns the worker threads, the futures and the scopes (it knows
nothing about WebSockets); ``commands`` holds commands as values, the
command set and its parser, and the built-in commands; ``server`` is the
Starlette app (``/api/console``, ``/api/health``, ``/metrics``, the web
page) that ``wirecut serve`` runs. The terminal client is ``wirecut.client``.

Other apps (the proof tools, tests) run a console through ``ConsoleServer``
and ``ConsoleConfig`` from here, never from ``server``: they are loaded on
first use, so that importing the runner or the commands (a cluster host
does) does not import the web server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wirecut.console.server import ConsoleConfig, ConsoleServer

__all__ = ["ConsoleConfig", "ConsoleServer"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("wirecut.console.server"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
