"""``wirecut bench``'s console in a process of its own, driven over its WebSocket and its stdin.

A real child process and real sockets: the console serves commands from
another process, reports its memory on request, is reaped on stop with the
commands it ran cancelled, and a console that cannot start says why in one
line.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _support import BOUND
from wirecut.client import ConsoleClient
from wirecut.proof import ConsoleProcess

#: No provider listens here: the commands these tests run never ask one.
NO_PROVIDER = "http://127.0.0.1:9/v1"


def test_the_console_serves_from_its_own_process_and_is_reaped_on_stop(tmp_path: Path) -> None:
    with ConsoleProcess(NO_PROVIDER, tmp_path, workers=2) as console:
        pid = console.pid
        assert pid is not None
        assert pid != os.getpid()
        with ConsoleClient(console.ws_url) as client:
            done = client.completes({client.run("sleep 0")}, BOUND)
            assert [r.facts.status.value for r in done.values()] == ["ok"]
    assert console.pid is None
    assert not Path(f"/proc/{pid}").exists()  # exited and reaped: no zombie left


def test_a_stop_cancels_the_commands_in_flight(tmp_path: Path) -> None:
    console = ConsoleProcess(NO_PROVIDER, tmp_path, workers=2).start()
    try:
        with ConsoleClient(console.ws_url) as client:
            id = client.run("sleep 60")
            client.wait_for(lambda frame: frame["type"] == "started", BOUND, id=id)
            console.stop()  # its stdin closes: the server shuts down
            done = client.completes({id}, BOUND)
    finally:
        console.stop()
    assert done[id].facts.status.value == "cancelled"
    assert done[id].facts.lifecycle.worker_exited is True


def test_the_console_reports_its_memory_and_the_heap_only_while_traced(tmp_path: Path) -> None:
    with ConsoleProcess(NO_PROVIDER, tmp_path, workers=2) as console:
        resident, heap = console.memory()
        assert heap is None  # not traced
        assert resident is not None
        assert resident > 1 << 20  # a Python process with a server: megabytes
        console.trace()
        with ConsoleClient(console.ws_url) as client:
            client.completes({client.run("sleep 0") for _ in range(4)}, BOUND)
        resident, heap = console.memory()
        assert heap is not None
        assert heap > 0  # the commands allocated while it traced
        assert console.memory()[1] is None  # the tracing ended with that answer


def test_a_console_that_cannot_start_says_why_and_leaves_no_child(tmp_path: Path) -> None:
    occupied = tmp_path / "a-file"
    occupied.write_text("not a directory")
    console = ConsoleProcess(NO_PROVIDER, occupied, workers=2)
    with pytest.raises(RuntimeError, match=r"the console exited \(1\) before it listened: .+"):
        console.start()
    assert console.pid is None
