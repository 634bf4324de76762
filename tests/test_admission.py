"""``wirecut.provider``'s admission: no more requests in flight than slots, the rest in line.

``AdmissionLine`` is bookkeeping (no waiting): its order and hand-overs are
checked directly. ``SlotGate`` is checked with real threads and real
scopes, and through ``ChatClient`` against the simulator over real sockets:
a request cut while it waits in line is never sent, and the place it would
have taken goes to the next one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import pytest

from _sim import FAST, HELLO, sim_factory
from _support import BOUND, until
from wirecut.provider import AdmissionLine, ChatClient, ProviderStatusError, SlotCount, SlotGate
from wirecut.scope import Interrupted, InterruptScope, bind_scope
from wirecut.simulator import EventKind, SimulatorServer

sim = pytest.fixture(sim_factory)


# -- the line -----------------------------------------------------------------------------


def test_a_freed_place_goes_to_the_oldest_waiter_and_a_newcomer_never_overtakes() -> None:
    line: AdmissionLine[str] = AdmissionLine(1)
    assert line.try_enter("a")
    assert not line.try_enter("b")
    assert not line.try_enter("c")
    assert (line.in_flight, line.queued) == (1, 2)
    assert line.leave() == ["b"]
    assert not line.try_enter("d")  # "c" waits: "d" goes behind it, though nothing is free.
    assert line.leave() == ["c"]
    assert line.leave() == ["d"]
    assert line.leave() == []
    assert (line.in_flight, line.queued) == (0, 0)


def test_a_waiter_that_withdraws_leaves_the_line_and_a_place_handed_to_it_goes_on() -> None:
    line: AdmissionLine[str] = AdmissionLine(1)
    assert line.try_enter("a")
    for waiter in ("b", "c", "d"):
        assert not line.try_enter(waiter)
    assert line.withdraw("c")  # still waiting: just gone
    assert line.leave() == ["b"]  # handed to b ...
    assert not line.withdraw("b")  # ... which gives up: it holds a place to pass on
    assert line.leave() == ["d"]
    assert (line.in_flight, line.queued) == (1, 0)


def test_more_places_admit_waiters_in_order_and_fewer_admit_none_until_enough_left() -> None:
    line: AdmissionLine[str] = AdmissionLine(1)
    assert line.try_enter("a")
    assert not line.try_enter("b")
    assert not line.try_enter("c")
    assert line.resize(3) == ["b", "c"]
    assert line.resize(1) == []
    assert line.leave() == []  # 2 in flight, 1 place: nobody waits anyway
    assert not line.try_enter("d")
    assert line.leave() == []  # 1 in flight: still no free place
    assert line.leave() == ["d"]


def test_an_unlimited_line_never_queues_and_leave_without_entering_is_refused() -> None:
    line: AdmissionLine[int] = AdmissionLine(None)
    assert all(line.try_enter(i) for i in range(100))
    assert line.queued == 0
    with pytest.raises(RuntimeError, match="without a request in flight"):
        AdmissionLine[int](2).leave()


@pytest.mark.parametrize("slots", [0, -1, True, 1.5, "2"])
def test_a_line_refuses_a_slot_count_that_is_not_a_whole_number_above_0(slots: object) -> None:
    with pytest.raises(ValueError, match="slots must be a whole number >= 1 or None"):
        AdmissionLine(slots)  # type: ignore[arg-type]


# -- the gate, with threads ------------------------------------------------------------------


class _Holder:
    """A thread that takes a place at ``gate`` under its own scope and holds it until released."""

    def __init__(self, gate: SlotGate, name: str, entered: list[str]) -> None:
        self.scope = InterruptScope(name)
        self.release = threading.Event()
        self.admitted = threading.Event()
        self.name = name

        def hold() -> None:
            with gate.admitted():
                entered.append(name)
                self.admitted.set()
                self.release.wait(BOUND)

        self.future: Future[None] = self.scope.spawn(hold)

    def outcome(self) -> BaseException | None:
        try:
            self.future.result(BOUND)
        except BaseException as exc:
            return exc
        return None


@pytest.fixture
def holders() -> Iterator[Callable[[SlotGate, str, list[str]], _Holder]]:
    made: list[_Holder] = []

    def make(gate: SlotGate, name: str, entered: list[str]) -> _Holder:
        holder = _Holder(gate, name, entered)
        made.append(holder)
        return holder

    yield make
    for holder in made:
        holder.release.set()
        holder.scope.cancel("test over")
        holder.outcome()


def test_the_gate_lets_no_more_threads_in_than_slots_and_the_rest_in_arrival_order(
    holders: Callable[[SlotGate, str, list[str]], _Holder],
) -> None:
    gate = SlotGate(2)
    entered: list[str] = []
    first = [holders(gate, f"h{i}", entered) for i in range(2)]
    for holder in first:
        assert holder.admitted.wait(BOUND)
    waiting = []
    for i in range(2, 5):
        waiting.append(holders(gate, f"h{i}", entered))
        until(lambda n=i: gate.queued == n - 1)  # each joins the line before the next
    assert gate.health() == {"slots": 2, "source": None, "in_flight": 2, "queued": 3}
    assert sorted(entered) == ["h0", "h1"]
    first[0].release.set()
    assert waiting[0].admitted.wait(BOUND)
    first[1].release.set()
    assert waiting[1].admitted.wait(BOUND)
    assert entered[2:] == ["h2", "h3"]
    assert (gate.in_flight, gate.queued) == (2, 1)


def test_a_cancel_ends_a_waiter_at_once_and_its_request_never_gets_in(
    holders: Callable[[SlotGate, str, list[str]], _Holder],
) -> None:
    gate = SlotGate(1)
    entered: list[str] = []
    busy = holders(gate, "busy", entered)
    assert busy.admitted.wait(BOUND)
    waiter = holders(gate, "waiter", entered)
    until(lambda: gate.queued == 1)
    waiter.scope.cancel("user")
    assert isinstance(waiter.outcome(), Interrupted)  # while busy still holds its place
    assert (gate.in_flight, gate.queued) == (1, 0)
    busy.release.set()
    assert busy.outcome() is None
    assert entered == ["busy"]
    assert (gate.in_flight, gate.queued) == (0, 0)


def test_a_place_handed_to_a_waiter_as_it_is_cancelled_goes_on_to_the_next(
    holders: Callable[[SlotGate, str, list[str]], _Holder],
) -> None:
    gate = SlotGate(1)
    entered: list[str] = []
    # The one place is the test's own (taken on the line itself, so that it can
    # be given back below exactly when the test says).
    with gate._lock:
        assert gate._line.try_enter(threading.Event())
    cut = holders(gate, "cut", entered)
    until(lambda: gate.queued == 1)
    after = holders(gate, "after", entered)
    until(lambda: gate.queued == 2)
    # The race, made certain: the cancel and the hand-over both happen while
    # the gate's lock is held, so "cut" wakes cancelled and handed a place.
    with gate._lock:
        cut.scope.cancel("user")
        for handed in gate._line.leave():
            handed.set()
    assert isinstance(cut.outcome(), Interrupted)
    assert after.admitted.wait(BOUND)
    assert entered == ["after"]
    assert (gate.in_flight, gate.queued) == (1, 0)


def test_a_cancelled_scope_does_not_even_join_the_line() -> None:
    gate = SlotGate(1)
    scope = InterruptScope("late")
    scope.cancel("user")
    ran: list[str] = []

    def take() -> None:
        with gate.admitted():
            ran.append("in")

    with bind_scope(scope), pytest.raises(Interrupted):
        take()  # a place is free, and still it is not taken
    assert ran == []
    assert (gate.in_flight, gate.queued) == (0, 0)


def test_a_gate_is_unlimited_until_the_provider_says_its_slots_then_holds_to_them(
    holders: Callable[[SlotGate, str, list[str]], _Holder],
) -> None:
    answers = [SlotCount(None, settled=False), SlotCount(1, settled=True, source="/slots")]
    gate = SlotGate(learn=lambda: answers.pop(0), relearn_interval=3600.0)
    assert gate.learn_slots() == SlotCount(None, settled=False)
    entered: list[str] = []
    early = [holders(gate, f"early{i}", entered) for i in range(2)]
    for holder in early:
        assert holder.admitted.wait(BOUND)  # no limit yet: both in
    assert gate.learn_slots() == SlotCount(1, settled=True, source="/slots")
    late = holders(gate, "late", entered)
    until(lambda: gate.queued == 1)
    early[0].release.set()
    assert early[0].outcome() is None
    assert (gate.in_flight, gate.queued) == (1, 1)  # one place, still taken
    early[1].release.set()
    assert late.admitted.wait(BOUND)
    assert (gate.slots, gate.source, gate.settled) == (1, "/slots", True)


def test_a_request_asks_a_provider_that_had_not_said_again_before_it_takes_its_turn() -> None:
    answers = [SlotCount(None, settled=False), SlotCount(2, settled=True, source="/props")]
    gate = SlotGate(learn=lambda: answers.pop(0), relearn_interval=0.0)
    gate.learn_slots()
    with gate.admitted():
        assert (gate.slots, gate.source, gate.settled) == (2, "/props", True)
    with gate.admitted():  # settled: not asked again
        pass
    assert answers == []


# -- through ChatClient, over real sockets ---------------------------------------------------


def _endless(sim: Callable[..., SimulatorServer]) -> SimulatorServer:
    return sim(slots=1, endless=True, **{k: v for k, v in FAST.items() if k != "reply_tokens"})


def test_a_chat_cut_while_it_waits_for_a_slot_is_never_sent_to_the_provider(
    sim: Callable[..., SimulatorServer],
) -> None:
    server = _endless(sim)
    gate = SlotGate(1)
    with ChatClient(server.base_url, admission=gate) as client:
        first = InterruptScope("first")
        flowing = threading.Event()
        running = first.spawn(client.chat, HELLO, on_token=lambda _: flowing.set())
        assert flowing.wait(BOUND)
        queued = InterruptScope("queued")
        waiting = queued.spawn(client.chat, HELLO, max_tokens=4)
        until(lambda: gate.queued == 1)
        queued.cancel("user")
        with pytest.raises(Interrupted):
            waiting.result(BOUND)
        first.cancel("user")
        assert running.result(BOUND).interrupted
        # The slot is free now: what reaches the provider next is a new request.
        after = client.chat(HELLO, max_tokens=2)
    assert after.finish_reason == "length"
    received = [ev for ev in server.events() if ev.kind == EventKind.REQUEST_RECEIVED]
    assert len(received) == 2  # the first and the last: never the one cut in line
    assert (gate.in_flight, gate.queued) == (0, 0)


def test_a_chat_that_failed_gives_its_place_to_the_next(
    sim: Callable[..., SimulatorServer],
) -> None:
    server = sim(slots=1)
    gate = SlotGate(1)
    with ChatClient(server.base_url, admission=gate, max_retries=0) as client:
        with pytest.raises(ProviderStatusError, match="HTTP 400"):
            client.chat([], max_tokens=2)  # refused by the provider
        assert (gate.in_flight, gate.queued) == (0, 0)
        assert client.chat(HELLO, max_tokens=2).text
