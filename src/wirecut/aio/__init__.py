"""Run sync work from asyncio so that cancelling the task cuts it.

Imports ``wirecut.scope`` (and Starlette, for the disconnect helper) only.
``await run_sync(fn, *args)`` is a drop-in for ``asyncio.to_thread``,
``loop.run_in_executor`` and ``anyio.to_thread.run_sync`` whose cancel cuts
the thread's work and waits (bounded) for it, instead of abandoning it;
``cancel_on_disconnect(request)`` gives a Starlette or FastAPI request a scope
that its client's disconnect cancels. See docs/aio.md.
"""

from wirecut.aio._disconnect import DISCONNECT_REASON, cancel_on_disconnect
from wirecut.aio._run_sync import CANCEL_REASON, Unwind, run_sync, unwind_of

__all__ = [
    "CANCEL_REASON",
    "DISCONNECT_REASON",
    "Unwind",
    "cancel_on_disconnect",
    "run_sync",
    "unwind_of",
]
