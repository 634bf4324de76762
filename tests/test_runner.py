"""The runner's parts on their own: the lifecycle table, the worker pool, the output buffer."""

from __future__ import annotations

import ast
import asyncio
import threading
from pathlib import Path

import pytest

from wirecut.console.runner import (
    TRANSITIONS,
    CommandEvent,
    CommandLifecycle,
    CommandState,
    LifecycleError,
    OutputBuffer,
    OutputFlusher,
    WorkerPool,
)

# -- the lifecycle table ---------------------------------------------------------------


def test_an_event_the_table_does_not_allow_names_the_state_and_event() -> None:
    lifecycle = CommandLifecycle("c1")
    lifecycle.fire(CommandEvent.START)
    with pytest.raises(LifecycleError, match=r"'c1'.*'drop'.*'running'"):
        lifecycle.fire(CommandEvent.DROP)
    assert lifecycle.state is CommandState.RUNNING


def test_every_state_is_reachable_and_done_is_the_end() -> None:
    reached = {CommandState.QUEUED}
    frontier = [CommandState.QUEUED]
    while frontier:
        state = frontier.pop()
        for (source, _), target in TRANSITIONS.items():
            if source is state and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(CommandState)
    assert all(
        target is CommandState.DONE
        for (source, _), target in TRANSITIONS.items()
        if source is CommandState.DONE
    )


def test_only_the_lifecycle_module_assigns_a_state() -> None:
    console = Path(__file__).parent.parent / "src" / "wirecut" / "console"
    offenders = []
    for path in console.rglob("*.py"):
        if path.name == "_lifecycle.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr == "_state":
                        offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


# -- the worker pool -------------------------------------------------------------------


def test_future_cancel_succeeds_only_for_queued_work() -> None:
    pool = WorkerPool(1)
    release = threading.Event()
    running = threading.Event()
    ran = threading.Event()

    def block() -> None:
        running.set()
        release.wait(10)

    first = pool.submit(block)
    assert running.wait(5)
    second = pool.submit(ran.set)
    assert pool.queued == 1
    assert pool.saturated
    assert first.cancel() is False
    assert second.cancel() is True
    release.set()
    first.result(5)
    third = pool.submit(lambda: "done")
    assert third.result(5) == "done"
    assert not ran.is_set()
    pool.shutdown()


def test_a_retired_thread_is_replaced_so_the_pool_keeps_its_size() -> None:
    pool = WorkerPool(1)
    stuck = threading.Event()
    started = threading.Event()
    captured: list[threading.Thread] = []

    def leak() -> None:
        captured.append(threading.current_thread())
        started.set()
        stuck.wait(10)

    leaked = pool.submit(leak)
    assert started.wait(5)
    waiting = pool.submit(lambda: threading.current_thread())
    pool.retire(captured[0])
    replacement = waiting.result(5)
    assert replacement is not captured[0]
    assert pool.busy == 1  # the retired one still runs its task
    stuck.set()
    leaked.result(5)
    captured[0].join(5)
    assert not captured[0].is_alive()  # a retired thread exits after its task
    pool.shutdown()


def test_a_burst_gets_a_thread_each_even_with_one_thread_idle() -> None:
    pool = WorkerPool(4)
    pool.submit(lambda: None).result(5)  # one thread exists, now idle
    release = threading.Event()
    started = threading.Semaphore(0)

    def block() -> None:
        started.release()
        release.wait(10)

    futures = [pool.submit(block) for _ in range(4)]
    try:
        for _ in range(4):
            assert started.acquire(timeout=5), "a task of the burst waited behind another"
        assert pool.busy == 4
    finally:
        release.set()
    for future in futures:
        future.result(5)
    pool.shutdown()


def test_a_shut_down_pool_refuses_work() -> None:
    pool = WorkerPool(2)
    pool.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(print)


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_the_pool_size_is_checked(workers: object) -> None:
    with pytest.raises(ValueError, match="workers"):
        WorkerPool(workers)  # type: ignore[arg-type]


# -- the output buffer -----------------------------------------------------------------


def test_output_is_capped_with_one_notice_and_dropped_after_close() -> None:
    sent: list[tuple[str, str]] = []
    dropped: list[int] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        buffer = OutputBuffer(
            loop, lambda s, d: sent.append((s, d)), on_dropped=dropped.append, cap=10
        )
        buffer.write("stdout", "12345")
        buffer.write("stdout", "67890abc")
        buffer.write("stdout", "more")
        buffer.write("token", "t")
        buffer.close()
        buffer.write("stdout", "late")

    asyncio.run(scenario())
    text = "".join(d for s, d in sent if s == "stdout")
    assert text == "1234567890"
    notices = [d for s, d in sent if s == "stderr"]
    assert len(notices) == 1
    assert "cut short" in notices[0]
    assert dropped == [4]


def test_output_of_one_stream_is_coalesced_in_order() -> None:
    sent: list[tuple[str, str]] = []

    async def scenario() -> None:
        buffer = OutputBuffer(asyncio.get_running_loop(), lambda s, d: sent.append((s, d)))
        for n in range(100):
            buffer.write("token", f"{n} ")
        buffer.write("stderr", "warn")
        buffer.write("token", "end")
        buffer.close()

    asyncio.run(scenario())
    assert sent == [
        ("token", "".join(f"{n} " for n in range(100))),
        ("stderr", "warn"),
        ("token", "end"),
    ]


def test_buffers_sharing_a_flusher_wake_the_loop_once_per_window_and_keep_their_order() -> None:
    sent: dict[int, list[str]] = {k: [] for k in range(8)}
    wakeups: list[object] = []

    def write_all(buffers: list[OutputBuffer], tag: str) -> None:
        # From worker threads, while the loop is blocked in this call: every
        # write of the window happens before the loop could flush anything.
        def worker(k: int) -> None:
            for n in range(50):
                buffers[k].write("token", f"{tag}{n} ")

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        real = loop.call_soon_threadsafe

        def counted(*args: object, **kwargs: object) -> object:
            wakeups.append(args[0])
            return real(*args, **kwargs)  # type: ignore[arg-type]

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        flusher = OutputFlusher(loop, delay=0.001)
        flushed = asyncio.Event()

        def emit(k: int, data: str) -> None:
            sent[k].append(data)
            if all(sent.values()):
                flushed.set()

        buffers = [
            OutputBuffer(loop, lambda s, d, k=k: emit(k, d), flusher=flusher) for k in range(8)
        ]
        write_all(buffers, "a")
        assert len(wakeups) == 1  # one for 8 commands and 400 writes
        await asyncio.wait_for(flushed.wait(), 5)  # by the flusher's own timer
        write_all(buffers, "b")
        assert len(wakeups) == 2
        for buffer in buffers:
            buffer.close()

    asyncio.run(scenario())
    for k in range(8):
        assert "".join(sent[k]) == "".join(f"{t}{n} " for t in "ab" for n in range(50))
