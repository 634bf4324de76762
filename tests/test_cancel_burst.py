"""The cancel burst: while a canceller cuts, the threads its cuts and tokens wake wait their turn.

The mechanism with real threads, then through real sockets: a ``ChatClient``
stream from the simulator held back while a burst is held, the worker of a
scope cut before the burst began going on at once, and the console holding
the burst for a cancel frame and letting go of it on its own loop, or as it
stops.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from _console import metrics, running_console
from _poll import BOUND, until
from wirecut.console.runner import _core
from wirecut.console.runner._pool import WorkerPool
from wirecut.provider import ChatClient, ChatResult
from wirecut.scope import CancelBurst, InterruptScope, MockClock, _process, cancel_burst
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


def test_every_read_held_goes_on_once_released() -> None:
    burst = CancelBurst(bound=60)
    owner = object()
    burst.hold(owner)
    returned = [hold_back_in_thread(burst, None) for _ in range(3)]
    until(lambda: burst.waiting == 3)
    burst.release(owner)
    assert all(event.wait(BOUND) for event in returned)
    assert (burst.reads_held, burst.waiting) == (3, 0)


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


def test_the_consoles_metrics_count_the_processs_bursts(tmp_path: Path) -> None:
    until(lambda: not cancel_burst.under_way)  # no runner of an earlier test kept it
    with running_console(tmp_path, workers=2) as console, console.client() as client:
        id = client.run("chat tell me a long story")
        client.wait_output(id)
        client.cancel(id)
        assert client.complete(id)["status"] == "cancelled"
        until(lambda: not cancel_burst.under_way)
        found = metrics(console)
    assert cancel_burst.begun >= 1
    assert (
        found["wirecut_cancel_bursts_total"],
        found["wirecut_cancel_burst_reads_held_total"],
        found["wirecut_cancel_bursts_on_one_cpu_total"],
    ) == (cancel_burst.begun, cancel_burst.reads_held, cancel_burst.on_one_cpu)


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


def test_a_cancel_all_of_several_commands_holds_the_burst(tmp_path: Path) -> None:
    # A burst from before its first cut: the workers it cut unwind after it,
    # on one CPU (the next section).
    until(lambda: not cancel_burst.under_way)  # no runner of an earlier test kept it
    with running_console(tmp_path, workers=2) as console, console.client() as client:
        ids = [client.run("chat tell me a long story") for _ in range(2)]
        for id in ids:
            client.wait_output(id)
        begun = cancel_burst.begun
        client.cancel()
        assert [client.complete(id)["status"] for id in ids] == ["cancelled", "cancelled"]
        assert cancel_burst.begun == begun + 1
        until(lambda: not cancel_burst.under_way)


# -- the turns after a burst, on one CPU ---------------------------------------------------

two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="moving threads between CPUs needs Linux and two CPUs",
)


def cpus_of(thread_id: int) -> frozenset[int]:
    return frozenset(os.sched_getaffinity(thread_id))


class Parked:
    """A thread that waits until told, in ``burst.member()`` if a burst is given.

    ``run(fn)`` runs ``fn`` on it and returns what ``fn`` returned.
    """

    def __init__(self, burst: CancelBurst | None) -> None:
        self._burst = burst
        self._jobs: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self.id: int = self.run(threading.get_native_id)

    def _serve(self) -> None:
        with self._burst.member() if self._burst is not None else contextlib.nullcontext():
            while (job := self._jobs.get()) is not None:
                fn, future = job
                try:
                    future.set_result(fn())
                except BaseException as exc:  # for the test to see, where it asked
                    future.set_exception(exc)

    def run(self, fn: Callable[[], Any]) -> Any:
        future: Future[Any] = Future()
        self._jobs.put((fn, future))
        return future.result(BOUND)

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(BOUND)


@pytest.fixture
def parked() -> Iterator[Callable[[CancelBurst | None], Parked]]:
    threads: list[Parked] = []

    def park(burst: CancelBurst | None) -> Parked:
        threads.append(Parked(burst))
        return threads[-1]

    yield park
    for thread in threads:
        thread.stop()


def burst_in(thread: Parked, burst: CancelBurst) -> None:
    owner = object()
    thread.run(lambda: burst.hold(owner))
    thread.run(lambda: burst.release(owner))


@two_cpus
def test_a_burst_ends_with_its_threads_on_the_releasers_cpu_until_one_cpu_for_has_passed(
    parked: Callable[[CancelBurst | None], Parked],
) -> None:
    clock = MockClock()
    burst = CancelBurst(bound=60, one_cpu_for=0.1, clock=clock)
    home = cpus_of(threading.get_native_id())
    releaser, member, outsider = parked(None), parked(burst), parked(None)
    burst_in(releaser, burst)
    one = cpus_of(releaser.id)
    assert len(one) == 1
    assert one < home
    assert (cpus_of(member.id), cpus_of(outsider.id)) == (one, home)
    # A thread started on that CPU meanwhile starts there ...
    started = member.run(lambda: parked(None))
    assert cpus_of(started.id) == one
    clock.jump(0.099)
    assert cpus_of(member.id) == one
    clock.jump(0.001)
    # ... and goes back with the others.
    assert [cpus_of(t.id) for t in (releaser, member, started, outsider)] == [home] * 4
    assert (burst.on_one_cpu, burst.home) == (1, home)


@two_cpus
def test_a_release_by_a_thread_that_holds_no_part_of_the_burst_moves_nothing(
    parked: Callable[[CancelBurst | None], Parked],
) -> None:
    clock = MockClock()
    burst = CancelBurst(bound=60, one_cpu_for=0.1, clock=clock)
    home = cpus_of(threading.get_native_id())
    releaser, member = parked(None), parked(burst)
    owner = object()
    releaser.run(lambda: burst.release(owner))  # no burst
    releaser.run(lambda: burst.hold(owner))
    releaser.run(lambda: burst.release(object()))  # not its burst
    assert burst.under_way
    assert cpus_of(member.id) == home
    releaser.run(lambda: burst.release(owner))
    assert len(cpus_of(member.id)) == 1
    clock.jump(0.1)
    releaser.run(lambda: burst.release(owner))  # again
    assert (cpus_of(member.id), burst.on_one_cpu) == (home, 1)


@two_cpus
def test_a_burst_on_one_cpu_already_moves_nothing(
    parked: Callable[[CancelBurst | None], Parked],
) -> None:
    burst = CancelBurst(bound=60, one_cpu_for=0.1, clock=MockClock())
    home = cpus_of(threading.get_native_id())
    releaser, member = parked(None), parked(burst)
    pinned = frozenset({min(home)})
    releaser.run(lambda: os.sched_setaffinity(0, pinned))  # as `serve --cpus` would
    burst_in(releaser, burst)
    assert (cpus_of(releaser.id), cpus_of(member.id), burst.on_one_cpu) == (pinned, home, 0)


def test_a_system_that_will_not_say_the_cpus_moves_nothing_and_the_burst_ends(
    parked: Callable[[CancelBurst | None], Parked], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(pid: int) -> set[int]:
        raise PermissionError("not allowed here")

    burst = CancelBurst(bound=60, one_cpu_for=0.1, clock=MockClock())
    releaser = parked(None)
    monkeypatch.setattr(os, "sched_getaffinity", refuse, raising=False)
    burst_in(releaser, burst)
    assert (burst.under_way, burst.on_one_cpu) == (False, 0)


@two_cpus
def test_a_program_started_on_the_bursts_cpu_gets_the_cpus_the_burst_took_the_threads_from(
    parked: Callable[[CancelBurst | None], Parked], monkeypatch: pytest.MonkeyPatch
) -> None:
    burst = CancelBurst(bound=60, one_cpu_for=0.1, clock=MockClock())
    monkeypatch.setattr(_process, "cancel_burst", burst)
    home = cpus_of(threading.get_native_id())
    releaser = parked(None)
    burst_in(releaser, burst)
    scope = InterruptScope("programs")
    with scope:
        child = releaser.run(lambda: scope.popen(["sleep", "30"]))
        try:
            assert len(cpus_of(releaser.id)) == 1  # it was started from the one CPU
            assert frozenset(os.sched_getaffinity(child.pid)) == home
        finally:
            scope.cancel("test")
            child.wait(BOUND)


@two_cpus
def test_the_worker_pools_threads_take_part_in_the_processs_bursts(
    parked: Callable[[CancelBurst | None], Parked],
) -> None:
    until(lambda: not cancel_burst.under_way)  # no runner of an earlier test kept it
    home = cpus_of(threading.get_native_id())
    pool = WorkerPool(1, name="burst-member")
    ids: queue.Queue[int] = queue.Queue()
    release = threading.Event()
    try:
        pool.submit(lambda: (ids.put(threading.get_native_id()), release.wait(BOUND)))
        worker = ids.get(timeout=BOUND)
        burst_in(parked(None), cancel_burst)
        assert len(cpus_of(worker)) == 1
        # The process's burst sends it back by itself, ``one_cpu_for`` later.
        until(lambda: cpus_of(worker) == home)
    finally:
        release.set()
        pool.shutdown()


linux_policies = pytest.mark.skipif(
    not hasattr(os, "SCHED_BATCH"), reason="scheduling policies are Linux's"
)


def policy_in_and_after(burst: CancelBurst) -> tuple[int, int]:
    """A thread's own scheduling policy inside ``burst.member()``, and once the block ended."""
    seen: Future[tuple[int, int]] = Future()

    def member() -> None:
        with burst.member():
            inside = os.sched_getscheduler(0)
        seen.set_result((inside, os.sched_getscheduler(0)))

    threading.Thread(target=member, daemon=True).start()
    return seen.result(BOUND)


@linux_policies
def test_a_member_runs_as_sched_batch_while_in_the_block_and_as_before_after_it() -> None:
    assert policy_in_and_after(CancelBurst(batch_members=True)) == (
        os.SCHED_BATCH,
        os.SCHED_OTHER,
    )
    # A burst made by hand leaves its members' policy alone.
    assert policy_in_and_after(CancelBurst()) == (os.SCHED_OTHER, os.SCHED_OTHER)


@linux_policies
def test_the_worker_pools_threads_run_as_sched_batch() -> None:
    pool = WorkerPool(1, name="batch-member")
    try:
        policy = pool.submit(lambda: os.sched_getscheduler(0)).result(BOUND)
    finally:
        pool.shutdown()
    assert policy == os.SCHED_BATCH


@linux_policies
def test_a_program_a_member_or_its_thread_starts_gets_the_processs_policy(
    parked: Callable[[CancelBurst | None], Parked],
) -> None:
    member = parked(CancelBurst(batch_members=True))
    scope = InterruptScope("programs")

    def from_a_thread_it_starts() -> Any:
        # A thread started by a member inherits SCHED_BATCH without being one.
        started: Future[Any] = Future()
        thread = threading.Thread(target=lambda: started.set_result(start()), daemon=True)
        thread.start()
        return started.result(BOUND)

    def start() -> tuple[int, Any]:
        return os.sched_getscheduler(0), scope.popen(["sleep", "30"])

    with scope:
        started = [member.run(start), member.run(from_a_thread_it_starts)]
        try:
            for starter_policy, child in started:
                assert starter_policy == os.SCHED_BATCH
                assert os.sched_getscheduler(child.pid) == os.SCHED_OTHER
        finally:
            scope.cancel("test")
            for _, child in started:
                child.wait(BOUND)


@linux_policies
def test_a_system_that_will_not_change_the_policy_leaves_the_member_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(pid: int, policy: int, param: Any) -> None:
        raise PermissionError("not allowed here")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    burst = CancelBurst(batch_members=True)
    assert policy_in_and_after(burst) == (os.SCHED_OTHER, os.SCHED_OTHER)
    pool = WorkerPool(1, name="refused-member")
    try:
        assert pool.submit(lambda: "ran").result(BOUND) == "ran"
    finally:
        pool.shutdown()
