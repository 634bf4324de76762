"""Waiting for a process that is not our child to exit: on a pidfd, without polling."""

from __future__ import annotations

import os
import select

__all__ = ["exited"]


def exited(pid: int, timeout: float) -> bool:
    """Whether ``pid`` exits within ``timeout`` (a zombie has); waits on a pidfd, no polling."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)
