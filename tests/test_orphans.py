"""Nothing the console started outlives it, even when it is killed with SIGKILL.

``wirecut serve`` runs for real; ``probe subprocess`` starts ``sleep 3600``
in a session of its own through the WebSocket; then serve gets ``kill -9``,
which runs no cleanup at all. Every descendant it had must be gone within a
bound (polled in /proc with a deadline): the group reaper (``scope._reaper``)
killed the groups, and then exited itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _console import ConsoleClient
from _support import BOUND
from wirecut.scope import InterruptScope
from wirecut.scope._process import proc_stat, proc_stats
from wirecut.scope._reaper import reaper_pid
from wirecut.simulator import SimConfig, SimulatorServer

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def descendants(root: int) -> set[int]:
    """The live processes below ``root`` (by parent links, at this moment)."""
    children: dict[int, list[int]] = {}
    for stat in proc_stats():
        if stat.alive:
            children.setdefault(stat.ppid, []).append(stat.pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that have not exited (zombies have)."""
    stats = {pid: proc_stat(pid) for pid in pids}
    return {pid for pid, stat in stats.items() if stat is not None and stat.alive}


def wait_gone(pids: set[int], bound: float = BOUND) -> set[int]:
    """Poll until every one of ``pids`` has exited, or ``bound`` passed; those still alive."""
    deadline = time.monotonic() + bound
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.01)  # /proc has no change notification: a poll with a deadline.
    return left


@pytest.fixture
def leftovers() -> Iterator[set[int]]:
    """Pids a failing test must not leave running."""
    pids: set[int] = set()
    yield pids
    for pid in alive(pids):
        os.kill(pid, signal.SIGKILL)


def start_serve(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "wirecut", "serve", "--port", "0", "--no-token"),
            *("--data-dir", str(tmp_path), *args),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    banner = proc.stdout.readline()
    assert banner.startswith("wirecut console: http://"), banner
    info = json.loads((tmp_path / "serve.json").read_text())
    return proc, info["url"].replace("http://", "ws://") + "api/console"


def test_sigkill_of_serve_leaves_no_descendant(tmp_path: Path, leftovers: set[int]) -> None:
    with SimulatorServer(SimConfig(slots=1)) as sim:
        serve, ws_url = start_serve(tmp_path, "--provider-url", sim.base_url)
        try:
            with ConsoleClient(ws_url) as client:
                id = client.run("probe subprocess")
                client.wait_for(lambda f: f.get("id") == id and "(pid " in f.get("data", ""))
                sleep_pid = int(client.output(id).split("(pid ", 1)[1].split(",", 1)[0])
                below = descendants(serve.pid)
                leftovers.update(below)
                assert sleep_pid in below
                assert cmdline(sleep_pid).startswith("sleep 3600")
                # The sleep leads a session of its own: a group kill of serve misses it.
                assert os.getsid(sleep_pid) == sleep_pid != os.getsid(serve.pid)
                reapers = {pid for pid in below if "-I -S -c" in cmdline(pid)}
                assert len(reapers) == 1, [cmdline(pid) for pid in below]
                os.kill(serve.pid, signal.SIGKILL)
                assert serve.wait(BOUND) == -signal.SIGKILL
                killed_at = time.monotonic()
                assert wait_gone(below) == set()
                took = time.monotonic() - killed_at
        finally:
            if serve.poll() is None:
                serve.kill()
                serve.wait()
            assert serve.stdout is not None
            serve.stdout.close()
    # For the record (the bench's number); the bound is the reaper's grace and its poll.
    print(f"descendants gone {took * 1000:.0f} ms after the SIGKILL")


def test_a_reaper_that_was_killed_is_replaced_and_watches_every_live_group(
    leftovers: set[int],
) -> None:
    # In this (test) process: a group started, its reaper killed, another group started.
    # Then this process's reaper must know both, so end one by hand and ask the
    # reaper to do its job by closing its pipe as our death would.
    scope = InterruptScope("t")
    first = scope.popen(["sleep", "3600"])
    leftovers.add(first.pid)
    old = reaper_pid()
    assert old is not None
    os.kill(old, signal.SIGKILL)
    assert wait_gone({old}) == set()
    second = scope.popen(["sleep", "3600"])
    leftovers.add(second.pid)
    new = reaper_pid()
    assert new not in (None, old)
    assert new is not None
    leftovers.add(new)
    # The new reaper's pipe is ours alone: closing it is what our death does.
    from wirecut.scope import _reaper

    proc = _reaper._REAPER._proc
    assert proc is not None
    assert proc.stdin is not None
    proc.stdin.close()
    assert wait_gone({first.pid, second.pid, new}) == set()
    proc.wait(BOUND)
    _reaper._REAPER._proc = None  # Let the next group start a fresh one.
    first.wait(BOUND)
    second.wait(BOUND)
    scope.close()


def test_groups_that_ended_are_forgotten(leftovers: set[int]) -> None:
    scope = InterruptScope("t")
    done = scope.popen(["true"])
    done.wait(BOUND)
    from wirecut.scope import _reaper

    assert done.pid not in _reaper._REAPER._groups
    scope.cancel("user")
    assert scope.wait_quiescent(BOUND)


@pytest.mark.local
def test_sigkill_of_serve_also_ends_the_embedded_llama_cpp(
    tmp_path: Path, leftovers: set[int]
) -> None:
    serve, _ = start_serve(tmp_path)
    try:
        below = descendants(serve.pid)
        leftovers.update(below)
        assert any("wirecut.local._child" in cmdline(pid) for pid in below)
        os.kill(serve.pid, signal.SIGKILL)
        serve.wait(BOUND)
        assert wait_gone(below) == set()
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        assert serve.stdout is not None
        serve.stdout.close()


FORK_SCRIPT = r"""
import os, signal, subprocess
from wirecut.scope import InterruptScope
null = subprocess.DEVNULL
sleeper = InterruptScope("t").popen(["sleep", "3600"], stdin=null, stdout=null, stderr=null)
r, w = os.pipe()
child = os.fork()
if child == 0:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # Let the test read our output to its end.
    os.dup2(null, 2)
    os.read(r, 1)  # Never answered (it holds the write end itself): it outlives us.
    os._exit(0)
print(sleeper.pid, child, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_forked_child_that_outlives_us_does_not_keep_the_reaper_waiting(
    leftovers: set[int],
) -> None:
    # os.fork() copies every descriptor, the reaper's pipe too: a child that
    # kept it open would hide our death from the reaper.
    proc = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=BOUND
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    sleep_pid, forked = map(int, proc.stdout.split())
    leftovers.update({sleep_pid, forked})
    assert wait_gone({sleep_pid}) == set()
    assert alive({forked}) == {forked}  # It still runs, and still holds the pipe's copy.


STUBBORN_SCRIPT = """
import os, signal, subprocess
from wirecut.scope import InterruptScope

scope = InterruptScope("stubborn")
# SIGTERM is ignored, and exec keeps it ignored: only SIGKILL ends it.
child = scope.popen(
    ["sh", "-c", "trap '' TERM; echo ready; exec sleep 3600"], stdout=subprocess.PIPE
)
assert child.stdout.readline() == b"ready\\n"
print(child.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_reaper_kills_a_group_that_ignores_sigterm_with_sigkill(
    leftovers: set[int],
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", STUBBORN_SCRIPT], capture_output=True, text=True, timeout=BOUND
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    stubborn = int(proc.stdout)
    leftovers.add(stubborn)
    assert "sleep" in cmdline(stubborn) or not alive({stubborn})
    assert wait_gone({stubborn}) == set()
