"""A plain program that uses wirecut's library layers as a host would, for test_process_state.

Run: ``python tests/_plain_host.py BASE_URL``. It reads this process's
state (each thread's scheduling policy and CPUs, the switch interval, the
signal handlers, the environment), then imports ``scope``, ``http``,
``provider``, ``adapters`` and ``aio``, cancels a scoped stream, cuts 64
streams in one pass, starts and cancels a subprocess tree and an
``aio.run_sync`` call, and prints one JSON object: the state before, the
state of every thread while the 64 were being cut and after, and the
reaper's policy.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from typing import Any


def thread_state() -> dict[str, Any]:
    """Each thread of this process: its policy, nice value and CPUs, by native id."""
    found = {}
    for entry in os.listdir("/proc/self/task"):
        tid = int(entry)
        try:
            found[entry] = {
                "policy": os.sched_getscheduler(tid),
                "cpus": sorted(os.sched_getaffinity(tid)),
            }
        except OSError:
            continue  # it ended meanwhile
    return found


def process_state() -> dict[str, Any]:
    return {
        "switch_interval": sys.getswitchinterval(),
        "signals": {
            sig.name: repr(signal.getsignal(sig))
            for sig in signal.valid_signals()
            if isinstance(sig, signal.Signals) and sig not in (signal.SIGKILL, signal.SIGSTOP)
        },
        "environ": dict(os.environ),
        "main": thread_state()[str(threading.get_native_id())],
    }


def main(base_url: str) -> None:
    before = process_state()
    seen: list[dict[str, Any]] = []

    from wirecut import adapters, aio, http, provider, scope  # the library layers

    del adapters, http  # imported for their side effects, which must be none
    client = provider.ChatClient(base_url, model="sim", max_retries=0)
    messages = [{"role": "user", "content": "tell me everything"}]

    # One scoped stream, cancelled while it streams.
    streaming = threading.Event()
    one = scope.InterruptScope("one")
    future = one.spawn(client.chat, messages, on_token=lambda _: streaming.set())
    assert streaming.wait(30)
    one.cancel("user")
    assert future.result(30).interrupted
    assert one.wait_quiescent(30)

    # 64 streams cut in one pass; the threads are looked at while they unwind.
    scopes = [scope.InterruptScope(f"burst-{k}") for k in range(64)]
    events = [threading.Event() for _ in scopes]
    futures = [
        s.spawn(client.chat, messages, on_token=lambda _, e=e: e.set())
        for s, e in zip(scopes, events, strict=True)
    ]
    for event in events:
        assert event.wait(30)
    seen.append(thread_state())
    for s in scopes:
        s.cancel("user")
    seen.append(thread_state())
    for s, f in zip(scopes, futures, strict=True):
        f.result(30)
        assert s.wait_quiescent(30)
    seen.append(thread_state())

    # A subprocess tree, cut; the group reaper runs from the first one on.
    tree = scope.InterruptScope("tree")

    opened = threading.Event()

    def run_tree() -> None:
        with tree.popen(["sh", "-c", "sleep 60 & sleep 60"]) as child:
            opened.set()
            child.wait()

    started = tree.spawn(run_tree)
    assert opened.wait(30)
    reaper_policy = None
    for pid in _children():
        if _cmdline(pid).split("\0")[1:3] == ["-I", "-S"]:  # the group reaper
            reaper_policy = {
                "policy": os.sched_getscheduler(pid),
                "cpus": sorted(os.sched_getaffinity(pid)),
            }
    tree.cancel("user")
    try:
        started.result(30)
    except scope.Interrupted:
        pass
    assert tree.wait_quiescent(30)

    # aio.run_sync, cancelled from its task.
    async def cancelled_run_sync() -> None:
        gate = threading.Event()

        def blocked() -> None:
            scope.wait(gate)

        task = asyncio.create_task(aio.run_sync(blocked))
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(cancelled_run_sync())
    client.close()
    seen.append(thread_state())
    after = process_state()
    print(json.dumps({"before": before, "after": after, "seen": seen, "reaper": reaper_policy}))


def _children() -> list[int]:
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            found.append(int(entry))
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read()
    except OSError:
        return ""


if __name__ == "__main__":
    main(sys.argv[1])
