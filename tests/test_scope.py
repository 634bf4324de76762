"""InterruptScope, tested with real threads, real sockets and real processes."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wirecut.scope as ws
from wirecut.scope import (
    Interrupted,
    InterruptScope,
    ScopedPopen,
    ScopeState,
    bind_scope,
    current_scope,
)

BOUND = 5.0  # seconds: generous bound for "promptly" on a shared, noisy machine


@contextlib.contextmanager
def socket_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


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


def test_check_raises_once_cancelled() -> None:
    scope = InterruptScope()
    scope.check()
    scope.cancel("user")
    with pytest.raises(Interrupted) as info:
        scope.check()
    assert info.value.reason == "user"


def test_timeout_cancels_with_reason_timeout() -> None:
    scope = InterruptScope(timeout=0.05)
    with pytest.raises(Interrupted):
        scope.sleep(BOUND)
    assert scope.reason == "timeout"


def test_closed_scope_does_not_time_out() -> None:
    with InterruptScope(timeout=0.05) as scope:
        pass
    # A second scope with the same timeout fires; by then the first would have.
    witness = InterruptScope(timeout=0.05)
    with pytest.raises(Interrupted):
        witness.sleep(BOUND)
    assert not scope.cancelled


# -- binding and the module-level helpers -------------------------------------------


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


def test_scope_does_not_cross_into_a_plain_thread() -> None:
    # DESIGN fact 5: the reason spawn() and executor() exist.
    seen: list[InterruptScope | None] = []
    with bind_scope(InterruptScope()):
        thread = threading.Thread(target=lambda: seen.append(current_scope()))
        thread.start()
        thread.join(BOUND)
    assert seen == [None]


# -- sockets ------------------------------------------------------------------------


def test_cut_socket_wakes_blocked_recv_and_peer_sees_eof() -> None:
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


_RECVFROM = {"x86_64": 45, "aarch64": 207}


def _wait_until_in_recvfrom(thread: threading.Thread) -> None:
    """Wait (bounded) until ``thread`` is blocked in the recvfrom system call.

    No event says "now blocked in the kernel"; the kernel's own record of the
    thread's current system call does.
    """
    number = _RECVFROM.get(os.uname().machine)
    if number is None:
        pytest.skip("recvfrom's system call number is unknown on this machine")
    path = Path(f"/proc/self/task/{thread.native_id}/syscall")
    deadline = time.monotonic() + BOUND
    while path.read_text().split()[0] != str(number):
        assert time.monotonic() < deadline, "the reader never blocked in recv"
        time.sleep(0.001)


def test_close_from_another_thread_does_not_wake_recv() -> None:
    # DESIGN fact 1, measured: the reason the cut is shutdown(), never close().
    a, b = socket.socketpair()
    returned = threading.Event()

    def reader() -> None:
        with contextlib.suppress(OSError):
            a.recv(100)
        returned.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    _wait_until_in_recvfrom(thread)
    a.close()
    assert not returned.wait(0.2)  # the reader sleeps on
    b.settimeout(0.2)
    with pytest.raises(TimeoutError):
        b.recv(1)  # and the peer saw no close
    b.close()  # only the peer leaving wakes the reader now
    assert returned.wait(BOUND)
    thread.join(BOUND)


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
    class Broken:
        def interrupt(self, reason: str) -> None:
            raise RuntimeError("broken cut")

    scope = InterruptScope()
    recorder = Recorder()
    with scope.register(Broken()), scope.register(recorder):
        scope.cancel()
    assert recorder.reasons == ["cancelled"]
    assert "broken cut" in caplog.text


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
    canceller.join(BOUND)
    unregisterer.join(BOUND)


@settings(
    max_examples=2000,
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
        thread.join(BOUND)
    assert scope.cancelled
    for recorder, outcome in outcomes:
        assert not recorder.cut_after_unregister
        if outcome in ("held", "refused"):
            assert recorder.reasons == ["cancelled"], outcome
        else:
            assert len(recorder.reasons) <= 1


# -- processes ------------------------------------------------------------------------


def _group_survivors(pgid: int) -> list[int]:
    """Processes of group ``pgid`` still alive; zombies are dead (DESIGN fact 8)."""
    survivors = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name, which is in parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            survivors.append(int(entry.name))
    return survivors


def test_cut_process_kills_the_whole_group() -> None:
    scope = InterruptScope()
    proc = scope.popen(["sh", "-c", "sleep 300 & sleep 300 & echo started; wait"], stdout=-1)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"started\n"
    assert len(_group_survivors(proc.pid)) == 3
    scope.cancel("user")
    assert proc.wait(BOUND) != 0
    assert scope.wait_quiescent(BOUND)
    assert _group_survivors(proc.pid) == []
    proc.stdout.close()
    events = [event for event, _ in scope.timeline]
    assert events == ["cancel_requested", "processes_signalled", "processes_killed"]


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
    assert _group_survivors(proc.pid) == []
    proc.wait(BOUND)
    proc.stdout.close()


def test_popen_on_cancelled_scope_starts_nothing() -> None:
    scope = InterruptScope()
    scope.cancel()
    with pytest.raises(Interrupted):
        scope.popen(["sleep", "300"])


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
    assert _group_survivors(proc.pid) == []
    assert scope.live()["processes"] == 0


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
    threading.Timer(0.01, event.set).start()
    assert scope.wait(event, BOUND) is True
    assert scope.wait(threading.Event(), 0.01) is False


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


# -- escalation ---------------------------------------------------------------------------


def test_escalation_stops_a_pure_python_loop() -> None:
    scope = InterruptScope()
    running = threading.Event()

    def spin() -> int:
        n = 0
        running.set()
        while True:
            n += 1

    future = scope.spawn(spin)
    assert running.wait(BOUND)
    scope.cancel("user", escalate_after=0.05)
    with pytest.raises(Interrupted):
        future.result(BOUND)
    assert scope.wait_quiescent(BOUND)
    assert [event for event, _ in scope.timeline] == ["cancel_requested", "escalated"]


def test_escalation_reaches_threads_of_child_scopes() -> None:
    parent = InterruptScope()
    child = parent.child()
    running = threading.Event()

    def spin() -> None:
        running.set()
        while True:
            pass

    future = child.spawn(spin)
    assert running.wait(BOUND)
    parent.cancel("user", escalate_after=0.01)
    with pytest.raises(Interrupted):
        future.result(BOUND)
    assert parent.wait_quiescent(BOUND)


def test_escalation_spares_threads_that_returned() -> None:
    scope = InterruptScope()
    assert scope.spawn(lambda: 42).result(BOUND) == 42
    scope.cancel("user", escalate_after=0)
    assert scope.wait_quiescent(BOUND)


# -- timeline ---------------------------------------------------------------------------------


def test_timeline_is_ordered_in_ms_from_the_cancel() -> None:
    scope = InterruptScope()
    assert scope.timeline == []
    with socket_pair() as (a, _b), scope.register_socket(a), scope.register(Recorder()):
        scope.cancel()
    timeline = scope.timeline
    assert [event for event, _ in timeline] == [
        "cancel_requested",
        "sockets_shut",
        "agents_interrupted",
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
