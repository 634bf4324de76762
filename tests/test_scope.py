"""InterruptScope, tested with real threads, real sockets and real processes.

Facts of the platform that the design stands on (and that no change to
wirecut can break) are checked in ``test_facts.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wirecut.scope as ws
from _support import BOUND
from wirecut.scope import (
    Interrupted,
    InterruptScope,
    MockClock,
    ScopedPopen,
    ScopeState,
    TimelineEvent,
    _cuttables,
    bind_scope,
    current_scope,
    cut_socket,
    kill_process_group,
)
from wirecut.scope._process import group_members, parse_stat, proc_stat, wait_exited
from wirecut.scope._timers import SYSTEM_CLOCK, SystemClock

HUGE = 1e10  # seconds: above threading.TIMEOUT_MAX, which no wait may exceed


@contextlib.contextmanager
def socket_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def join(thread: threading.Thread) -> None:
    """Join ``thread`` within the bound, and say so if it did not end."""
    thread.join(BOUND)
    assert not thread.is_alive(), f"{thread.name} did not end within {BOUND} s"


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    """Wait (bounded) for a state that no event announces."""
    done = threading.Event()
    for _ in range(int(BOUND / 0.001)):
        if predicate():
            return
        done.wait(0.001)
    pytest.fail(f"never: {what}")


def events(scope: InterruptScope) -> list[TimelineEvent]:
    return [event for event, _ in scope.timeline]


class Recorder:
    """An Interruptible that records its cuts."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.unregistered = False
        self.cut_after_unregister = False

    def interrupt(self, reason: str) -> None:
        if self.unregistered:
            self.cut_after_unregister = True
        self.reasons.append(reason)


class Raising:
    """An Interruptible whose interrupt() raises ``exc_type`` (after noting the call)."""

    def __init__(self, exc_type: type[BaseException]) -> None:
        self.exc_type = exc_type
        self.called = threading.Event()

    def interrupt(self, reason: str) -> None:
        self.called.set()
        raise self.exc_type("raised by a cut")


# -- the state machine ------------------------------------------------------------


def test_cancel_is_latched_and_first_reason_wins() -> None:
    scope = InterruptScope("s")
    assert scope.state is ScopeState.OPEN
    assert scope.reason is None
    assert scope.cancelled_at is None
    assert scope.cancel("user") is True
    assert scope.cancel("timeout") is False
    assert scope.state is ScopeState.CANCELLED
    assert scope.reason == "user"
    assert scope.cancelled_at is not None


@pytest.mark.parametrize("timeout", [float("nan"), -1.0])
def test_bad_timeout_is_a_value_error(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        InterruptScope(timeout=timeout)


@pytest.mark.parametrize("seconds", [float("nan"), -1.0])
def test_bad_escalate_after_and_grace_are_value_errors(seconds: float) -> None:
    scope = InterruptScope()
    with pytest.raises(ValueError, match="escalate_after"):
        scope.cancel(escalate_after=seconds)
    assert not scope.cancelled  # refused before anything was cut
    with pytest.raises(ValueError, match="grace"):
        scope.popen(["true"], grace=seconds)


def test_check_raises_once_cancelled() -> None:
    scope = InterruptScope()
    scope.check()
    scope.cancel("user")
    with pytest.raises(Interrupted) as info:
        scope.check()
    assert info.value.reason == "user"


# -- timeouts and the clock -----------------------------------------------------------


def test_timeout_cancels_with_reason_timeout() -> None:
    # The system clock's shared timer thread, for real.
    scope = InterruptScope(timeout=0.05)
    with pytest.raises(Interrupted):
        scope.sleep(BOUND)
    assert scope.reason == "timeout"


def test_timeout_fires_when_the_clock_reaches_it() -> None:
    clock = MockClock()
    scope = InterruptScope(timeout=10, clock=clock)
    child = scope.child()  # shares the parent's clock
    grandchild = child.child(timeout=1)
    clock.jump(0.5)
    assert not grandchild.cancelled
    clock.jump(0.5)
    assert grandchild.reason == "timeout"
    assert not scope.cancelled
    clock.jump(8.999)
    assert not scope.cancelled
    clock.jump(0.001)
    assert scope.reason == "timeout"
    assert child.reason == "timeout"


def test_leaving_the_with_block_drops_the_timeout() -> None:
    clock = MockClock()
    with InterruptScope(timeout=1, clock=clock) as scope:
        pass
    clock.jump(10)
    assert not scope.cancelled


def test_mock_clock_jumps_only_forward() -> None:
    with pytest.raises(ValueError, match="forward"):
        MockClock().jump(-1)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: InterruptScope(timeout=float("inf")), id="timeout-inf"),
        pytest.param(lambda: InterruptScope(timeout=HUGE), id="timeout-huge"),
        pytest.param(lambda: InterruptScope().cancel(escalate_after=float("inf")), id="esc-inf"),
        pytest.param(lambda: InterruptScope().cancel(escalate_after=HUGE), id="esc-huge"),
    ],
)
def test_an_endless_delay_is_no_deadline_and_later_timeouts_still_fire(
    make: Callable[[], object],
) -> None:
    endless = make()
    if isinstance(endless, InterruptScope):
        assert not endless.cancelled
    # Two witnesses in turn: the timer thread went past the endless entry
    # (if it was queued at all) and still fires what comes after.
    for _ in range(2):
        witness = InterruptScope(timeout=0.01)
        with pytest.raises(Interrupted):
            witness.sleep(BOUND)
        assert witness.reason == "timeout"


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit, RuntimeError])
def test_the_timer_thread_survives_a_callback_that_raises(
    exc_type: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    called = threading.Event()

    def callback() -> None:
        called.set()
        raise exc_type("raised by a timer callback")

    SYSTEM_CLOCK.call_later(0, callback)
    assert called.wait(BOUND)
    witness = InterruptScope(timeout=0.01)
    with pytest.raises(Interrupted):
        witness.sleep(BOUND)
    assert "raised by a timer callback" in caplog.text


def test_an_earlier_deadline_wakes_the_timer_thread_and_a_later_one_waits_its_turn() -> None:
    clock = SystemClock()  # a clock of its own: nothing else is queued on it
    order: list[str] = []
    done = threading.Event()
    far = clock.call_later(3600, lambda: order.append("far"))
    warm = threading.Event()
    clock.call_later(0, warm.set)
    assert warm.wait(BOUND)  # the thread ran: it now sleeps until the far deadline
    clock.call_later(0.01, lambda: order.append("near"))  # earlier: must wake the thread
    clock.call_later(0.02, lambda: (order.append("later"), done.set()))  # later: no wake
    assert done.wait(BOUND)
    assert order == ["near", "later"]
    far.cancel()


def test_a_timeout_whose_cut_raises_still_cancels_everything(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = MockClock()
    scope = InterruptScope(timeout=1, clock=clock)
    recorder = Recorder()
    with scope.register(Raising(KeyboardInterrupt)), scope.register(recorder):
        clock.jump(1)  # the KeyboardInterrupt stays in the clock (logged)
    assert recorder.reasons == ["timeout"]
    assert "raised by a cut" in caplog.text


def test_endless_waits_do_not_overflow() -> None:
    scope = InterruptScope()
    event = threading.Event()
    sleeping = threading.Event()

    def sleeper() -> None:
        sleeping.set()
        scope.sleep(float("inf"))

    def waiter() -> bool:
        return scope.wait(event, float("inf"))

    waited = scope.spawn(waiter)
    event.set()
    assert waited.result(BOUND) is True
    slept = scope.spawn(sleeper)
    assert sleeping.wait(BOUND)
    scope.cancel()
    with pytest.raises(Interrupted):
        slept.result(BOUND)
    assert scope.wait_quiescent(float("inf"))
    assert scope.wait_quiescent(HUGE)


# -- binding, `with scope:`, and the module-level helpers ---------------------------


def test_helpers_without_a_scope_do_the_plain_operation() -> None:
    assert current_scope() is None
    ws.check()
    ws.sleep(0)
    with socket_pair() as (a, b):
        with ws.register_socket(a):
            b.sendall(b"x")
            assert a.recv(1) == b"x"
    recorder = Recorder()
    with ws.register(recorder):
        pass
    assert recorder.reasons == []
    event = threading.Event()
    assert ws.wait(event, 0) is False


def test_bind_scope_sets_and_resets_the_context() -> None:
    scope = InterruptScope()
    with bind_scope(scope):
        assert current_scope() is scope
        with bind_scope(None):
            assert current_scope() is None
        assert current_scope() is scope
    assert current_scope() is None


def test_helpers_act_on_the_bound_scope() -> None:
    scope = InterruptScope()
    recorder = Recorder()
    with bind_scope(scope), ws.register(recorder):
        scope.cancel("user")
        with pytest.raises(Interrupted):
            ws.check()
        with pytest.raises(Interrupted):
            ws.sleep(BOUND)
    assert recorder.reasons == ["user"]


def test_with_scope_in_two_threads_keeps_each_binding_and_the_timeout() -> None:
    clock = MockClock()
    scope = InterruptScope(timeout=1, clock=clock)
    both_inside = threading.Barrier(2)
    first_left = threading.Event()
    timed_out = threading.Event()
    seen: dict[str, list[object]] = {"first": [], "second": []}

    def first() -> None:
        with scope:
            seen["first"].append(current_scope())
            both_inside.wait(BOUND)
        seen["first"].append(current_scope())
        first_left.set()

    def second() -> None:
        with scope:
            both_inside.wait(BOUND)
            assert first_left.wait(BOUND)
            seen["second"].append(current_scope())  # still bound here
            assert timed_out.wait(BOUND)
            seen["second"].append(scope.reason)
        seen["second"].append(current_scope())

    errors: list[BaseException] = []
    threads = [threading.Thread(target=catching(fn, errors)) for fn in (first, second)]
    for thread in threads:
        thread.start()
    assert first_left.wait(BOUND)
    clock.jump(1)  # the timeout is still armed: the second block is open
    timed_out.set()
    for thread in threads:
        join(thread)
    assert errors == []
    assert seen == {"first": [scope, None], "second": [scope, "timeout", None]}


def catching(fn: Callable[[], None], errors: list[BaseException]) -> Callable[[], None]:
    """``fn`` for a thread, with whatever it raises kept in ``errors``."""

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    return run


def test_with_scope_left_in_another_thread_is_a_clear_error() -> None:
    scope = InterruptScope()
    scope.__enter__()
    errors: list[BaseException] = []

    def leave() -> None:
        try:
            scope.__exit__(None, None, None)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=leave)
    thread.start()
    join(thread)
    assert len(errors) == 1
    assert isinstance(errors[0], RuntimeError)
    assert "did not enter it" in str(errors[0])
    scope.__exit__(None, None, None)  # the block that is really open still ends
    assert current_scope() is None


# -- sockets ------------------------------------------------------------------------


@pytest.fixture(params=["gil-held", "socket-method"])
def shutdown_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways ``cut_socket`` can shut a socket: libc's shutdown(2) holding the GIL, or not."""
    if request.param == "socket-method":
        monkeypatch.setattr(_cuttables, "_shutdown", None)
    else:
        assert _cuttables._shutdown is not None  # libc's shutdown loads on this platform
    return str(request.param)


def test_cut_socket_wakes_blocked_recv_and_peer_sees_eof(shutdown_path: str) -> None:
    scope = InterruptScope()
    started = threading.Event()
    with socket_pair() as (a, b):

        def reader() -> bytes:
            with scope.register_socket(a):
                started.set()
                return a.recv(100)

        future = scope.spawn(reader)
        assert started.wait(BOUND)
        scope.cancel("user")
        assert future.result(BOUND) == b""
        b.settimeout(BOUND)
        assert b.recv(100) == b""  # the peer saw the close (FIN)
        assert a.fileno() != -1  # not closed: the owner closes it
    assert scope.wait_quiescent(BOUND)


def test_cut_socket_says_whether_it_shut_a_socket(shutdown_path: str) -> None:
    with socket_pair() as (a, b):
        assert cut_socket(a) is True
        b.settimeout(BOUND)
        assert b.recv(1) == b""
    with socket_pair() as (a, _b):
        a.detach()  # what a TLS wrap leaves of the plain socket: fd -1
        assert cut_socket(a) is False
    a.close()
    assert cut_socket(a) is False
    with socket.socket() as unconnected:
        assert cut_socket(unconnected) is False


def test_timeline_says_sockets_shut_only_when_one_was() -> None:
    detached = InterruptScope()
    with socket_pair() as (a, _b):
        a.detach()
        with detached.register_socket(a):
            detached.cancel()
    assert events(detached) == [TimelineEvent.CANCEL_REQUESTED]

    mixed = InterruptScope()
    with socket_pair() as (a, _b), socket_pair() as (c, _d):
        c.detach()
        with mixed.register_socket(c), mixed.register_socket(a):
            mixed.cancel()
        assert a.recv(1) == b""
    assert events(mixed) == [TimelineEvent.CANCEL_REQUESTED, TimelineEvent.SOCKETS_SHUT]


def test_a_childs_unwind_steps_are_in_the_cancelled_ancestors_timeline() -> None:
    host = InterruptScope("host")
    turn = host.child("turn")
    with socket_pair() as (a, _b), turn.register_socket(a):
        host.cancel()
        assert a.recv(1) == b""
    assert events(turn) == [TimelineEvent.CANCEL_REQUESTED, TimelineEvent.SOCKETS_SHUT]
    assert events(host) == [
        TimelineEvent.CANCEL_REQUESTED,
        TimelineEvent.SOCKETS_SHUT,
        TimelineEvent.CHILDREN_CANCELLED,
    ]


def test_a_child_cut_alone_leaves_its_open_parent_without_a_timeline() -> None:
    host = InterruptScope("host")
    turn = host.child("turn")
    with socket_pair() as (a, _b), turn.register_socket(a):
        turn.cancel()
    assert events(turn) == [TimelineEvent.CANCEL_REQUESTED, TimelineEvent.SOCKETS_SHUT]
    assert host.timeline == []
    host.cancel()
    assert events(host) == [TimelineEvent.CANCEL_REQUESTED, TimelineEvent.CHILDREN_CANCELLED]


def test_unregistered_socket_is_untouched() -> None:
    scope = InterruptScope()
    with socket_pair() as (a, b):
        with scope.register_socket(a):
            pass
        scope.cancel()
        b.sendall(b"still here")
        assert a.recv(100) == b"still here"
        a.sendall(b"and back")
        assert b.recv(100) == b"and back"


def test_register_socket_after_cancel_cuts_on_entry() -> None:
    scope = InterruptScope()
    scope.cancel("user")
    with socket_pair() as (a, _b):
        with pytest.raises(Interrupted), scope.register_socket(a):
            pytest.fail("registration on a cancelled scope must raise")
        assert a.recv(1) == b""  # shut down on entry


# -- objects --------------------------------------------------------------------------


def test_cancel_interrupts_registered_objects_once() -> None:
    scope = InterruptScope()
    first, second = Recorder(), Recorder()
    with scope.register(first), scope.register(second):
        scope.cancel("user")
        scope.cancel("again")
    assert first.reasons == ["user"]
    assert second.reasons == ["user"]


def test_cancel_before_register_cuts_on_entry() -> None:
    scope = InterruptScope()
    scope.cancel("user")
    recorder = Recorder()
    with pytest.raises(Interrupted) as info:
        scope.register(recorder)
    assert info.value.reason == "user"
    assert recorder.reasons == ["user"]
    assert scope.live()["objects"] == 0


def test_one_failing_cut_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    scope = InterruptScope()
    recorder = Recorder()
    with scope.register(Raising(RuntimeError)), scope.register(recorder):
        scope.cancel()
    assert recorder.reasons == ["cancelled"]
    assert "raised by a cut" in caplog.text


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_a_cut_raising_a_base_exception_still_cuts_everything_then_surfaces(
    exc_type: type[BaseException],
) -> None:
    scope = InterruptScope()
    child = scope.child()
    first, second = Recorder(), Recorder()
    proc = scope.popen(["sh", "-c", "echo ready; exec sleep 300"], stdout=-1)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    with (
        socket_pair() as (a, _b),
        socket_pair() as (c, _d),
        scope.register(first),
        scope.register(Raising(exc_type)),
        scope.register(second),
        scope.register_socket(a),
        child.register_socket(c),
    ):
        with pytest.raises(exc_type):
            scope.cancel("user")
        # Every other cut ran before the exception came out.
        assert first.reasons == ["user"]
        assert second.reasons == ["user"]
        assert a.recv(1) == b""
        assert child.reason == "user"
        assert c.recv(1) == b""
        assert proc.wait(BOUND) == -signal.SIGTERM
        assert scope.cancel("again") is False  # latched, as ever
    proc.stdout.close()
    assert scope.wait_quiescent(BOUND)


def test_an_interrupt_that_registers_on_its_cancelled_scope_does_not_stop_the_cut() -> None:
    scope = InterruptScope()
    late, other = Recorder(), Recorder()
    child = scope.child()

    class RegistersMore:
        def interrupt(self, reason: str) -> None:
            scope.register(late)  # cut on entry: raises Interrupted in here

    with (
        socket_pair() as (a, _b),
        scope.register(RegistersMore()),
        scope.register(other),
        child.register_socket(a),
    ):
        with pytest.raises(Interrupted):
            scope.cancel("user")
        assert late.reasons == ["user"]
        assert other.reasons == ["user"]
        assert child.cancelled
        assert a.recv(1) == b""
    assert scope.live() == {"threads": 0, "sockets": 0, "processes": 0, "objects": 0}


def test_unregister_waits_for_an_inflight_cut() -> None:
    scope = InterruptScope()
    in_cut = threading.Event()
    release = threading.Event()

    class Slow:
        done = False

        def interrupt(self, reason: str) -> None:
            in_cut.set()
            release.wait(BOUND)
            self.done = True

    slow = Slow()
    registration = scope.register(slow)
    canceller = threading.Thread(target=scope.cancel)
    canceller.start()
    assert in_cut.wait(BOUND)
    unregistered = threading.Event()
    unregisterer = threading.Thread(target=lambda: (registration.unregister(), unregistered.set()))
    unregisterer.start()
    assert not unregistered.wait(0.1)  # still cutting: unregister must not return yet
    release.set()
    assert unregistered.wait(BOUND)
    assert slow.done
    join(canceller)
    join(unregisterer)


@settings(
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    plans=st.lists(
        st.lists(st.sampled_from(["register", "unregister", "hold"]), min_size=1, max_size=6),
        min_size=8,
        max_size=8,
    ),
    cancel_thread=st.integers(0, 7),
    cancel_at=st.integers(0, 6),
)
@pytest.mark.timeout(300)
def test_interleaved_register_unregister_cancel_never_miss_or_cut_late(
    plans: list[list[str]], cancel_thread: int, cancel_at: int
) -> None:
    """8 threads register and unregister while one of them cancels.

    Every object still registered at the end was cut exactly once; an object
    whose registration raised was cut on entry; no object is cut after its
    unregister returned.
    """
    scope = InterruptScope()
    barrier = threading.Barrier(8)
    outcomes: list[tuple[Recorder, str]] = []
    lock = threading.Lock()

    def worker(index: int, plan: list[str]) -> None:
        held: list[tuple[Recorder, ws.Registration]] = []
        barrier.wait(BOUND)
        for step, op in enumerate(plan):
            if index == cancel_thread and step == cancel_at:
                scope.cancel()
            if op == "unregister" and held:
                recorder, registration = held.pop()
                registration.unregister()
                recorder.unregistered = True
                with lock:
                    outcomes.append((recorder, "unregistered"))
            elif op in ("register", "hold"):
                recorder = Recorder()
                try:
                    held.append((recorder, scope.register(recorder)))
                except Interrupted:
                    with lock:
                        outcomes.append((recorder, "refused"))
        if index == cancel_thread:
            scope.cancel()
        with lock:
            outcomes.extend((recorder, "held") for recorder, _ in held)

    threads = [threading.Thread(target=worker, args=(i, plan)) for i, plan in enumerate(plans)]
    for thread in threads:
        thread.start()
    for thread in threads:
        join(thread)
    assert scope.cancelled
    for recorder, outcome in outcomes:
        assert not recorder.cut_after_unregister
        if outcome in ("held", "refused"):
            assert recorder.reasons == ["cancelled"], outcome
        else:
            assert len(recorder.reasons) <= 1


# -- processes ------------------------------------------------------------------------


def test_proc_stat_reads_the_kernels_record() -> None:
    me = proc_stat(os.getpid())
    assert me is not None
    assert me.ppid == os.getppid()
    assert me.pgid == os.getpgrp()
    assert me.alive
    # The command name is in parentheses and may hold both spaces and ")".
    stat = parse_stat(7, "7 (a) b (c)) Z 1 99 99 0 -1")
    assert (stat.state, stat.ppid, stat.pgid, stat.alive) == ("Z", 1, 99, False)


def test_cut_process_kills_the_whole_group() -> None:
    scope = InterruptScope()
    proc = scope.popen(["sh", "-c", "sleep 300 & sleep 300 & echo started; wait"], stdout=-1)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"started\n"
    assert len(group_members(proc.pid)) == 3
    scope.cancel("user")
    assert proc.wait(BOUND) != 0
    assert scope.wait_quiescent(BOUND)
    assert group_members(proc.pid) == []
    proc.stdout.close()
    assert events(scope) == ["cancel_requested", "processes_signalled", "processes_killed"]


def test_sigterm_reaches_every_member_of_the_group(tmp_path: Path) -> None:
    # A member that traps TERM leaves a marker; the leader waits for it.
    # Were SIGTERM sent to the leader alone, the member would only ever get
    # the SIGKILL after the grace, and leave no marker.
    marker = tmp_path / "member-got-term"
    member = f"trap 'touch {marker}; exit 0' TERM; echo ready; sleep 300 & wait"
    scope = InterruptScope()
    proc = scope.popen(
        ["sh", "-c", f'trap : TERM; sh -c "{member}" & wait; wait'], stdout=-1, grace=BOUND
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    scope.cancel()
    assert scope.wait_quiescent(BOUND * 2)
    assert marker.exists()
    proc.wait(BOUND)
    proc.stdout.close()


def test_process_ignoring_sigterm_is_killed_after_the_grace() -> None:
    scope = InterruptScope()
    proc = scope.popen(
        ["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"],
        stdout=-1,
        grace=0.2,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    scope.cancel()
    assert scope.live()["processes"] == 1  # still within its grace
    assert scope.wait_quiescent(BOUND)
    assert group_members(proc.pid) == []
    proc.wait(BOUND)
    proc.stdout.close()


def _ignore_sigterm() -> None:
    # Runs in the child between fork and exec; an ignored signal stays
    # ignored across exec, so only SIGKILL (after the grace) could stop it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def test_popen_on_cancelled_scope_starts_nothing(tmp_path: Path) -> None:
    # A program that would survive the cut on entry long enough to leave a
    # mark: had it been started at all, the file would be there.
    marker = tmp_path / "started"
    scope = InterruptScope()
    scope.cancel()
    with pytest.raises(Interrupted):
        scope.popen(["touch", str(marker)], preexec_fn=_ignore_sigterm)
    with pytest.raises(Interrupted):
        ScopedPopen(scope, ["touch", str(marker)], grace=None, preexec_fn=_ignore_sigterm)
    assert scope.wait_quiescent(BOUND)
    assert not marker.exists()


def test_popen_cancelled_while_starting_is_killed_and_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scope = InterruptScope()
    register = scope.register_process

    def cancel_then_register(popen: Any, *, grace: float | None = None) -> Any:
        # The race in the wild: the program runs (and may already have done
        # its visible work) before the starting thread registers it.
        scope.cancel("user")
        return register(popen, grace=grace)

    monkeypatch.setattr(scope, "register_process", cancel_then_register)
    started: list[subprocess.Popen[bytes]] = []
    monkeypatch.setattr(
        ScopedPopen, "__init__", _recording(ScopedPopen.__init__, started), raising=True
    )
    with pytest.raises(Interrupted):
        scope.popen(["sleep", "300"], stdin=-1, stdout=-1)
    (proc,) = started
    assert proc.returncode is not None  # killed and reaped
    assert proc.stdin is not None
    assert proc.stdin.closed
    assert proc.stdout is not None
    assert proc.stdout.closed
    assert scope.wait_quiescent(BOUND)


def _recording(init: Any, started: list[Any]) -> Any:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        started.append(self)
        init(self, *args, **kwargs)

    return wrapper


def test_finished_popen_leaves_no_group_member_behind() -> None:
    scope = InterruptScope()
    with scope.popen(["sh", "-c", "sleep 300 & exit 0"]) as proc:
        proc.wait(BOUND)
    assert group_members(proc.pid) == []
    assert scope.live()["processes"] == 0


def test_kill_process_group_stops_the_group_and_reaps_the_leader() -> None:
    proc = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; sleep 300 & echo ready; while :; do sleep 1; done"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    with proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        assert len(group_members(proc.pid)) >= 2
        # The group ignores SIGTERM (the children inherit the ignored signal):
        # only the SIGKILL after the grace stops it.
        assert kill_process_group(proc, grace=0.2) == -signal.SIGKILL
        assert proc.returncode == -signal.SIGKILL  # reaped
        assert group_members(proc.pid) == []


def test_waiting_for_an_exit_without_a_pidfd_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    # Where the kernel has no pidfd: our child is asked with waitid (without
    # reaping it), any other process through /proc.
    monkeypatch.delattr(os, "pidfd_open")
    proc = subprocess.Popen(
        ["sh", "-c", "sleep 300 & echo $!; exec sleep 300"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    with proc:
        assert proc.stdout is not None
        member = int(proc.stdout.readline())
        assert wait_exited(proc.pid, 0) is False
        assert wait_exited(member, 0) is False
        assert kill_process_group(proc, grace=BOUND) == -signal.SIGTERM
        assert wait_exited(proc.pid, 0) is True  # reaped
        assert wait_exited(member, BOUND) is True
        assert group_members(proc.pid) == []


# -- sleep and wait -------------------------------------------------------------------


def test_sleep_and_wait_return_at_once_on_cancel() -> None:
    scope = InterruptScope()
    in_sleep = threading.Event()
    event = threading.Event()

    def sleeper() -> None:
        in_sleep.set()
        ws.sleep(300)

    def waiter() -> None:
        ws.wait(event, 300)

    sleeping = scope.spawn(sleeper)
    waiting = scope.spawn(waiter)
    assert in_sleep.wait(BOUND)
    scope.cancel("user")
    for future in (sleeping, waiting):
        with pytest.raises(Interrupted):
            future.result(BOUND)
    assert not event.is_set()  # the cancel woke the waiter without touching its event


def test_wait_returns_true_when_the_event_is_set() -> None:
    scope = InterruptScope()
    event = threading.Event()
    setter = threading.Timer(0.01, event.set)
    setter.start()
    assert scope.wait(event, BOUND) is True
    join(setter)
    assert scope.wait(threading.Event(), 0.01) is False


def test_wait_on_an_event_without_a_condition_is_a_clear_error() -> None:
    event = threading.Event()
    del event._cond  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="_cond"):
        InterruptScope().wait(event, 0)


# -- threads: spawn, executor, run ------------------------------------------------------


def test_spawn_binds_the_scope_in_the_new_thread() -> None:
    scope = InterruptScope()
    assert scope.spawn(current_scope).result(BOUND) is scope


def test_spawn_on_cancelled_scope_starts_nothing() -> None:
    scope = InterruptScope()
    scope.cancel()
    before = threading.active_count()
    with pytest.raises(Interrupted):
        scope.spawn(lambda: None)
    assert threading.active_count() == before


def test_executor_runs_tasks_with_the_submitting_scope() -> None:
    scope = InterruptScope("parent")
    child = scope.child("child")
    with scope.executor(2) as pool:
        assert pool.submit(current_scope).result(BOUND) is scope
        with bind_scope(child):
            assert pool.submit(current_scope).result(BOUND) is child


def test_executor_refuses_work_after_cancel() -> None:
    scope = InterruptScope()
    with scope.executor(1) as pool:
        scope.cancel()
        with pytest.raises(Interrupted):
            pool.submit(lambda: None)


def test_run_binds_and_owns_the_calling_thread() -> None:
    scope = InterruptScope()

    def body() -> dict[str, int]:
        assert current_scope() is scope
        return scope.live()

    assert scope.run(body)["threads"] == 1
    assert scope.live()["threads"] == 0


def test_wait_quiescent_tracks_owned_threads() -> None:
    scope = InterruptScope()
    release = threading.Event()
    future = scope.spawn(release.wait, BOUND)
    assert scope.live()["threads"] == 1
    assert scope.wait_quiescent(0.05) is False
    release.set()
    assert scope.wait_quiescent(BOUND) is True
    assert future.result(BOUND) is True


# -- child scopes -----------------------------------------------------------------------


def test_child_is_cancelled_with_its_parent() -> None:
    parent = InterruptScope()
    child = parent.child()
    grandchild = InterruptScope(parent=child)
    recorder = Recorder()
    with grandchild.register(recorder):
        parent.cancel("user")
    assert child.reason == "user"
    assert grandchild.reason == "user"
    assert recorder.reasons == ["user"]
    # The grandchild's cut is part of the parent's unwind.
    assert events(parent) == ["cancel_requested", "objects_interrupted", "children_cancelled"]


def test_child_can_be_cancelled_alone() -> None:
    parent = InterruptScope()
    child = parent.child()
    child.cancel("tool timeout")
    assert child.cancelled
    assert not parent.cancelled


def test_child_of_cancelled_parent_is_born_cancelled() -> None:
    parent = InterruptScope()
    parent.cancel("user")
    child = parent.child()
    assert child.reason == "user"


def test_parent_ledger_counts_its_children() -> None:
    parent = InterruptScope()
    child = parent.child()
    release = threading.Event()
    child.spawn(release.wait, BOUND)
    assert parent.live()["threads"] == 1
    release.set()
    assert parent.wait_quiescent(BOUND)


def _blocked_in_wait_quiescent(scope: InterruptScope) -> bool:
    # wait_quiescent() counts itself in under the scope's lock and holds the
    # lock until its wait releases it: once both, it is waiting.
    if scope._quiescence_waiters != 1:
        return False
    with scope._lock:
        return True


def test_an_ancestors_wait_quiescent_wakes_when_a_descendant_ends() -> None:
    grandparent = InterruptScope()
    grandchild = grandparent.child().child()
    release = threading.Event()
    worker = grandchild.spawn(release.wait, BOUND)
    returned = threading.Event()
    result: list[bool] = []

    def waiter() -> None:
        # Without a wakeup it would return only at this timeout.
        result.append(grandparent.wait_quiescent(60))
        returned.set()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    wait_until(lambda: _blocked_in_wait_quiescent(grandparent), "the waiter waits")
    release.set()
    assert worker.result(BOUND) is True
    assert returned.wait(BOUND), "the grandchild's end did not wake its grandparent"
    assert result == [True]
    join(thread)


DEPTH = 3000  # well past the recursion limit (1000)


def test_a_deep_chain_of_scopes_is_walked_without_recursion() -> None:
    assert sys.getrecursionlimit() < DEPTH
    clock = MockClock()
    root = leaf = InterruptScope("root", clock=clock)
    for _ in range(DEPTH):
        leaf = leaf.child()
    running = threading.Event()

    def spin() -> None:
        running.set()
        while True:
            pass

    with socket_pair() as (a, _b), leaf.register_socket(a):
        spinning = leaf.spawn(spin)
        assert running.wait(BOUND)
        assert root.live() == {"threads": 1, "sockets": 1, "processes": 0, "objects": 0}
        assert root.wait_quiescent(0) is False
        root.cancel("user", escalate_after=1)
        assert leaf.reason == "user"
        assert a.recv(1) == b""  # the cut reached the leaf's socket
        clock.jump(1)  # escalation walks down to the leaf's thread
        with pytest.raises(Interrupted):
            spinning.result(BOUND)
        assert root.live()["sockets"] == 1
    assert root.wait_quiescent(BOUND)
    assert events(root) == ["cancel_requested", "sockets_shut", "children_cancelled", "escalated"]
    assert events(leaf) == ["cancel_requested", "sockets_shut", "escalated"]
    # Every scope in between says its children were cancelled and its subtree was cut.
    middle = leaf.parent
    assert middle is not None
    assert events(middle) == ["cancel_requested", "sockets_shut", "children_cancelled", "escalated"]


# -- escalation ---------------------------------------------------------------------------


def test_escalation_stops_a_pure_python_loop() -> None:
    clock = MockClock()
    scope = InterruptScope(clock=clock)
    running = threading.Event()

    def spin() -> int:
        n = 0
        running.set()
        while True:
            n += 1

    future = scope.spawn(spin)
    assert running.wait(BOUND)
    scope.cancel("user", escalate_after=0.5)
    clock.jump(0.4)
    assert not future.done()
    clock.jump(0.1)
    with pytest.raises(Interrupted):
        future.result(BOUND)
    assert scope.wait_quiescent(BOUND)
    assert events(scope) == ["cancel_requested", "escalated"]


def test_escalation_passes_a_commit_section_by_and_the_scope_is_committed() -> None:
    clock = MockClock()
    parent = InterruptScope(clock=clock)
    scope = parent.child("turn")
    inside = threading.Event()
    release = threading.Event()

    def commit() -> str:
        with scope.committing():
            inside.set()
            while not release.is_set():  # pure Python: an escalation would land here
                pass
        return "committed"

    future = scope.spawn(commit)
    assert inside.wait(BOUND)
    parent.cancel("user", escalate_after=0.5)
    clock.jump(0.5)  # the escalation is due while the section runs
    release.set()
    assert future.result(BOUND) == "committed"
    assert scope.committed
    assert parent.committed  # the effect is the whole command's
    assert parent.cancelled  # the cancel was recorded all the same
    assert "escalated" not in events(parent)


def test_a_commit_section_of_a_cancelled_scope_raises_without_running() -> None:
    scope = InterruptScope()
    scope.cancel("user")
    ran: list[int] = []
    with pytest.raises(Interrupted), scope.committing():
        ran.append(1)
    assert ran == []
    assert not scope.committed


def test_a_commit_section_that_fails_commits_nothing() -> None:
    scope = InterruptScope()
    with pytest.raises(ValueError, match="disk full"), scope.committing():
        raise ValueError("disk full")
    assert not scope.committed
    with scope.committing():
        pass
    assert scope.committed


def test_committing_with_no_scope_bound_just_runs_the_block() -> None:
    ran: list[int] = []
    with ws.committing():
        ran.append(1)
    assert ran == [1]


def test_escalation_on_the_system_clock() -> None:
    scope = InterruptScope()
    running = threading.Event()

    def spin() -> None:
        running.set()
        while True:
            pass

    future = scope.spawn(spin)
    assert running.wait(BOUND)
    scope.cancel("user", escalate_after=0.01)
    with pytest.raises(Interrupted):
        future.result(BOUND)
    assert scope.wait_quiescent(BOUND)


def test_escalation_reaches_threads_of_child_scopes() -> None:
    clock = MockClock()
    parent = InterruptScope(clock=clock)
    child = parent.child()
    running = threading.Event()

    def spin() -> None:
        running.set()
        while True:
            pass

    future = child.spawn(spin)
    assert running.wait(BOUND)
    parent.cancel("user", escalate_after=1)
    clock.jump(1)
    with pytest.raises(Interrupted):
        future.result(BOUND)
    assert parent.wait_quiescent(BOUND)


def test_escalation_spares_threads_that_returned() -> None:
    # A host's pool thread runs a command under scope.run(); the command
    # returns at the cancel, and the thread goes on with other work. The
    # escalation, due later, must not land in that other work.
    clock = MockClock()
    scope = InterruptScope(clock=clock)
    in_command = threading.Event()
    left = threading.Event()
    stop = threading.Event()
    outcome: list[str] = []

    def pool_thread() -> None:
        with contextlib.suppress(Interrupted):
            scope.run(lambda: (in_command.set(), scope.sleep(300)))
        left.set()
        try:
            n = 0
            while not stop.is_set():  # pure Python: an async exception lands here
                n += 1
            outcome.append("spared")
        except Interrupted:
            outcome.append("hit")

    thread = threading.Thread(target=pool_thread)
    thread.start()
    assert in_command.wait(BOUND)
    scope.cancel("user", escalate_after=1)
    assert left.wait(BOUND)
    clock.jump(1)  # the escalation runs here, on this thread
    stop.set()
    join(thread)
    assert outcome == ["spared"]
    assert events(scope) == ["cancel_requested"]  # nobody was escalated


# -- timeline ---------------------------------------------------------------------------------


def test_timeline_events_keep_their_wire_values() -> None:
    assert {event.name: str(event) for event in TimelineEvent} == {
        "CANCEL_REQUESTED": "cancel_requested",
        "SOCKETS_SHUT": "sockets_shut",
        "OBJECTS_INTERRUPTED": "objects_interrupted",
        "PROCESSES_SIGNALLED": "processes_signalled",
        "PROCESSES_KILLED": "processes_killed",
        "CHILDREN_CANCELLED": "children_cancelled",
        "ESCALATED": "escalated",
    }


def test_timeline_is_ordered_in_ms_from_the_cancel() -> None:
    scope = InterruptScope()
    assert scope.timeline == []
    with socket_pair() as (a, _b), scope.register_socket(a), scope.register(Recorder()):
        scope.cancel()
    timeline = scope.timeline
    assert [event for event, _ in timeline] == [
        TimelineEvent.CANCEL_REQUESTED,
        TimelineEvent.SOCKETS_SHUT,
        TimelineEvent.OBJECTS_INTERRUPTED,
    ]
    times = [ms for _, ms in timeline]
    assert times[0] == 0.0
    assert times == sorted(times)


def test_cancel_never_blocks_on_the_work_it_cuts() -> None:
    scope = InterruptScope()
    proc = scope.popen(["sh", "-c", "trap '' TERM; echo ready; sleep 300"], stdout=-1, grace=5)
    assert proc.stdout is not None
    proc.stdout.readline()
    scope.cancel()
    # cancel() returned while the process, which ignores SIGTERM, still runs
    # within its 5 s grace: the grace is waited out on a helper thread.
    assert proc.poll() is None
    assert scope.live()["processes"] == 1
    proc.kill()
    proc.wait(BOUND)
    proc.stdout.close()
    assert scope.wait_quiescent(10)
