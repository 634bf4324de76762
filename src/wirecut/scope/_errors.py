"""The exceptions of the scope layer.

The tree::

    BaseException
    └── Interrupted            the bound scope was cancelled (or timed out);
                               raised by check(), sleep(), wait(), by a
                               registration on a cancelled scope, and by
                               escalation inside a thread that never checks

``Interrupted`` derives from ``BaseException``, like ``asyncio.CancelledError``
and ``trio.Cancelled``: a cut must travel through the ``except Exception``
blocks of tools and libraries instead of being swallowed as an ordinary error.
Layers above add their own trees (``wirecut.provider.ProviderError`` ...) and
let ``Interrupted`` pass through untouched.
"""

from __future__ import annotations

__all__ = ["Interrupted"]


class Interrupted(BaseException):
    """The work was cut because its scope was cancelled.

    ``reason`` is the scope's reason ("cancelled", "timeout", or whatever the
    host passed to ``cancel()``).
    """

    def __init__(self, reason: str = "cancelled") -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"interrupted: {self.reason}"
