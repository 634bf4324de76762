"""``RunnerLimits``: the bounds of a console's runner, and the one place their defaults are written.

Kept apart from the runner (stdlib only) so that the command line can show
the defaults without importing the runner and everything below it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MCP_CONFIRM_TIMEOUT", "RunnerLimits"]

#: The longest a cancelled command waits for an MCP server to confirm that it
#: stopped a call (docs/mcp.md, "In the console").
MCP_CONFIRM_TIMEOUT = 2.0


@dataclass(frozen=True)
class RunnerLimits:
    """The bounds of a runner; the one place their defaults are written (docs/protocol.md).

    ``escalate_after`` (seconds after a cancel; None: ``min(1, unwind_timeout / 2)``)
    is when a worker that has not returned gets ``Interrupted`` raised in
    its thread, the last resort for pure-Python code.
    """

    workers: int = 4
    command_timeout: float = 60.0
    unwind_timeout: float = 10.0
    escalate_after: float | None = None

    def __post_init__(self) -> None:
        workers = self.workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, not {workers!r}")
        for name in ("command_timeout", "unwind_timeout"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number of seconds > 0, not {value!r}")
        after = self.escalate_after
        if after is not None and (math.isnan(after) or after < 0):
            raise ValueError(f"escalate_after must be >= 0 seconds, not {after!r}")

    @property
    def mcp_confirm_timeout(self) -> float:
        """Seconds a cut MCP call waits for its server's word: ``MCP_CONFIRM_TIMEOUT``, or half
        the unwind bound when that is shorter, so that the rest of the unwind (the worker's
        return, its other requests and processes) has the other half."""
        return min(MCP_CONFIRM_TIMEOUT, self.unwind_timeout / 2)

    @property
    def escalation(self) -> float:
        """Seconds from a cancel to the escalation."""
        if self.escalate_after is not None:
            return self.escalate_after
        return min(1.0, self.unwind_timeout / 2)
