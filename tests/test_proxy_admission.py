"""The proxy's FIFO (``Admission``): a freed slot goes to the oldest waiter still waiting.

On a real event loop with real tasks: the FIFO is event-loop-only state, and
what matters here is the order in which its futures are resolved within one
turn of the loop (the end-to-end order through sockets is in test_proxy.py).
"""

from __future__ import annotations

import asyncio

import pytest

from wirecut.proxy._admission import Admission


def run(coro: object) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(10):
            await coro  # type: ignore[misc]

    asyncio.run(bounded())


def test_a_slot_handed_to_a_waiter_that_just_gave_up_goes_to_the_next() -> None:
    async def main() -> None:
        admission = Admission(1)
        assert await admission.enter(asyncio.Event())  # A holds the only slot.
        b_leaves, c_stays = asyncio.Event(), asyncio.Event()
        b = asyncio.create_task(admission.enter(b_leaves))
        c = asyncio.create_task(admission.enter(c_stays))
        await asyncio.sleep(0)  # One turn: both tasks run up to their wait in the line.
        assert admission.queued == 2
        # In one turn of the loop: A's slot is handed to B, and B's client
        # leaves before B's task could take it.
        admission.leave()
        b_leaves.set()
        assert await b is False
        assert await c is True  # The slot went on to C, not lost.
        assert (admission.in_flight, admission.queued) == (1, 0)
        admission.leave()
        assert admission.in_flight == 0

    run(main())


def test_a_newcomer_never_overtakes_the_queue() -> None:
    async def main() -> None:
        admission = Admission(1)
        assert await admission.enter(asyncio.Event())
        waiting = asyncio.create_task(admission.enter(asyncio.Event()))
        await asyncio.sleep(0)
        assert admission.queued == 1
        admission.leave()  # Handed to the waiter...
        late = asyncio.create_task(admission.enter(asyncio.Event()))
        assert await waiting is True  # ...which has it; the newcomer waits.
        await asyncio.sleep(0)
        assert not late.done()
        assert admission.queued == 1
        late.cancel()
        with pytest.raises(asyncio.CancelledError):
            await late
        assert (admission.in_flight, admission.queued) == (1, 0)

    run(main())
