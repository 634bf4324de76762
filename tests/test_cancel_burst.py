"""The cancel burst: while a canceller cuts, the threads its cuts and tokens wake wait their turn.

The mechanism with real threads, then through real sockets: a ``ChatClient``
stream from the simulator held back while a burst is held, the worker of a
scope cut before the burst began going on at once, and the console holding
the burst for a cancel frame and letting go of it on its own loop, or as it
stops.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from _console import running_console
from _poll import BOUND, until
from wirecut.console.runner import _core
from wirecut.provider import ChatClient, ChatResult
from wirecut.scope import CancelBurst, InterruptScope, cancel_burst
from wirecut.simulator import SimConfig, SimulatorServer


def hold_back_in_thread(burst: CancelBurst, scope: InterruptScope | None) -> threading.Event:
    returned = threading.Event()

    def read() -> None:
        burst.hold_back(scope)
        returned.set()

    threading.Thread(target=read, daemon=True).start()
    return returned


# -- the mechanism ---------------------------------------------------------------------------


def test_a_read_waits_while_the_burst_is_held_and_goes_on_once_released() -> None:
    burst = CancelBurst(bound=60)
    owner = object()
    burst.hold(owner)
    returned = hold_back_in_thread(burst, None)
    until(lambda: burst.waiting == 1)
    assert not returned.is_set()
    burst.release(owner)
    assert returned.wait(BOUND)
    assert (burst.begun, burst.reads_held, burst.waiting, burst.under_way) == (1, 1, 0, False)


def test_the_burst_lasts_until_its_last_holder_lets_go() -> None:
    burst = CancelBurst(bound=60)
    first, second = object(), object()
    burst.hold(first)
    burst.hold(second)
    burst.hold(first)  # again: a no-op
    burst.release(first)
    assert burst.under_way
    returned = hold_back_in_thread(burst, None)
    until(lambda: burst.waiting == 1)
    burst.release(second)
    assert returned.wait(BOUND)
    assert not burst.under_way
    assert burst.begun == 1


def test_a_scope_cancelled_before_the_burst_began_goes_on_and_a_later_one_waits() -> None:
    burst = CancelBurst(bound=60)
    owner = object()
    first, later = InterruptScope("first"), InterruptScope("later")
    first.cancel("user")  # the cut that began the burst
    burst.hold(owner)
    assert hold_back_in_thread(burst, first).wait(BOUND)
    later.cancel("user")  # cut during the burst: its worker waits its turn
    returned = hold_back_in_thread(burst, later)
    until(lambda: burst.waiting == 1)
    burst.release(owner)
    assert returned.wait(BOUND)
    assert burst.reads_held == 1


def test_a_burst_older_than_its_longest_holds_no_read() -> None:
    # A canceller that never let go (its loop died) slows reads for a moment only.
    burst = CancelBurst(bound=60, longest=0.0)
    burst.hold(object())
    assert hold_back_in_thread(burst, None).wait(BOUND)
    assert burst.reads_held == 0


# -- through real sockets --------------------------------------------------------------------


@pytest.fixture
def sim() -> Iterator[SimulatorServer]:
    """Two slots streaming without end, 200 tokens/s each."""
    with SimulatorServer(SimConfig(2, tokens_per_second=200, prompt_ms=5, endless=True)) as sim:
        yield sim


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> CancelBurst:
    """The process's burst, with reads held for as long as the test holds it."""
    monkeypatch.setattr(cancel_burst, "bound", 60.0)
    return cancel_burst


def stream(sim: SimulatorServer, name: str) -> tuple[InterruptScope, Future[ChatResult], list[str]]:
    """A ``ChatClient`` stream on a thread of a scope of its own; its future and its tokens."""
    scope = InterruptScope(name)
    tokens: list[str] = []
    client = ChatClient(sim.base_url, model="sim", max_retries=0)

    def work() -> ChatResult:
        try:
            messages = [{"role": "user", "content": "tell me everything"}]
            return client.chat(messages, on_token=tokens.append)
        finally:
            client.close()

    return scope, scope.spawn(work), tokens


def test_a_streams_read_is_held_while_a_burst_is_held(
    sim: SimulatorServer, patient: CancelBurst
) -> None:
    owner = object()
    scope, future, tokens = stream(sim, "streaming")
    try:
        until(lambda: len(tokens) >= 1)
        patient.hold(owner)
        until(lambda: patient.waiting == 1)  # its next read returned, and waits
        held_at = len(tokens)
        patient.release(owner)
        until(lambda: len(tokens) > held_at)  # and goes on once released
    finally:
        patient.release(owner)
        scope.cancel("test")
    assert future.result(BOUND).interrupted


def test_the_worker_of_the_cut_that_began_the_burst_is_not_held(
    sim: SimulatorServer, patient: CancelBurst
) -> None:
    owner = object()
    cut, cut_future, cut_tokens = stream(sim, "cut first")
    other, other_future, other_tokens = stream(sim, "streaming on")
    try:
        until(lambda: len(cut_tokens) >= 1 and len(other_tokens) >= 1)
        cut.cancel("user")
        patient.hold(owner)
        # The first cut's worker unwinds and returns while the burst is held ...
        assert cut_future.result(BOUND).interrupted
        assert cut.wait_quiescent(BOUND)
        # ... while the other stream's next read waits for the burst to end.
        until(lambda: patient.waiting == 1)
        assert patient.under_way
    finally:
        patient.release(owner)
        other.cancel("test")
    assert other_future.result(BOUND).interrupted


def test_a_cancel_frame_holds_the_burst_and_the_console_lets_go_of_it(tmp_path: Path) -> None:
    until(lambda: not cancel_burst.under_way)  # no runner of an earlier test kept it
    with running_console(tmp_path, workers=2) as console, console.client() as client:
        id = client.run("chat tell me a long story")
        client.wait_output(id)
        begun = cancel_burst.begun
        client.cancel(id)
        assert client.complete(id)["status"] == "cancelled"
        assert cancel_burst.begun == begun + 1
        # Its loop's timer ends it once no cancel came for a moment.
        until(lambda: not cancel_burst.under_way)


def test_a_console_that_stops_during_a_burst_lets_go_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The quiet that ends a burst is a timer of the runner's loop, and a
    # stopping console's loop ends: its shutdown lets go itself, or the
    # process's burst would hold every scoped read of the process (each up
    # to its bound) after the console is gone.
    until(lambda: not cancel_burst.under_way)  # no runner of an earlier test kept it
    monkeypatch.setattr(_core, "_BURST_QUIET", 60.0)  # only the shutdown can end it
    with running_console(tmp_path, workers=2) as console, console.client() as client:
        id = client.run("chat tell me a long story")
        client.wait_output(id)
        client.cancel(id)
        assert client.complete(id)["status"] == "cancelled"
        assert cancel_burst.under_way
    assert not cancel_burst.under_way
