"""The simulator in a process of its own (``wirecut bench``'s provider), read over HTTP.

A real child process and real sockets: what it logs reaches this process, a
close it saw is stamped on this process's clock, it is reaped on stop, it
does not outlive a parent killed with SIGKILL, and a simulator that cannot
start says why in one line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from _loopback import Exchange, LoopbackServer
from _pids import exited
from _support import BOUND
from wirecut.proof import SimProcess
from wirecut.proof._sim_process import get_idempotent, poll_client
from wirecut.simulator import EventKind, SimConfig, SimEvent


def _chat(stream: bool) -> dict[str, object]:
    return {
        "model": SimConfig().model,
        "messages": [{"role": "user", "content": "tell me everything"}],
        "stream": stream,
    }


def test_a_chat_served_in_the_child_is_logged_here_and_the_child_is_reaped_on_stop() -> None:
    config = SimConfig(slots=1, tokens_per_second=200, prompt_ms=0, reply_tokens=3)
    with SimProcess(config) as sim:
        pid = sim.pid
        assert pid is not None
        assert pid != os.getpid()
        since = sim.next_seq()
        reply = httpx.post(sim.base_url + "/chat/completions", json=_chat(False), timeout=BOUND)
        assert reply.status_code == 200
        assert reply.json()["choices"][0]["message"]["content"]
        freed = sim.wait_for(lambda ev: ev.kind == EventKind.SLOT_FREED, timeout=BOUND, since=since)
        kinds = [ev.kind for ev in sim.events(since) if ev.request_id == freed.request_id]
        assert kinds.index(EventKind.REQUEST_RECEIVED) < kinds.index(EventKind.FIRST_TOKEN)
        assert kinds.index(EventKind.FIRST_TOKEN) < kinds.index(EventKind.SLOT_FREED)
        assert sim.next_seq() > freed.seq
    assert sim.pid is None
    assert not Path(f"/proc/{pid}").exists()  # exited and reaped: no zombie left


def test_a_close_the_child_saw_is_stamped_on_this_processes_clock() -> None:
    config = SimConfig(slots=1, tokens_per_second=50, prompt_ms=0, endless=True)
    with SimProcess(config) as sim, httpx.Client(timeout=BOUND) as client:
        since = sim.next_seq()
        with client.stream("POST", sim.base_url + "/chat/completions", json=_chat(True)) as r:
            # Held: a dropped iterator would close the response as it is collected.
            chunks = r.iter_raw()
            next(chunks)  # streaming
            closed_here = time.monotonic()
        # Leaving the block closed the response's connection.
        closed = sim.wait_for(
            lambda ev: ev.kind == EventKind.PEER_CLOSED, timeout=BOUND, since=since
        )
        seen = closed.detail["t_disconnect"]
        assert isinstance(seen, float)
        assert closed_here <= seen <= time.monotonic()


def test_a_wait_for_an_event_that_never_comes_times_out() -> None:
    def never(event: SimEvent) -> bool:
        return False

    with SimProcess(SimConfig()) as sim:
        with pytest.raises(TimeoutError, match=r"no matching simulator event within 0\.2 s"):
            sim.wait_for(never, timeout=0.2)


def test_a_simulator_that_cannot_start_says_why_and_leaves_no_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = SimProcess(SimConfig())
    argv = sim.argv()
    monkeypatch.setattr(sim, "argv", lambda: [*argv, "--no-such-flag"])
    said = r"exited \(2\) before it listened: .*No such option '--no-such-flag'"
    with pytest.raises(RuntimeError, match=said):
        sim.start()
    assert sim.pid is None


def test_a_model_the_command_line_cannot_set_is_refused() -> None:
    with pytest.raises(ValueError, match="serves 'wirecut-sim', not 'other'"):
        SimProcess(SimConfig(model="other"))


#: A bench in miniature: it starts a simulator process, says its pid, and waits.
_PARENT = """
import sys
from wirecut.proof import SimProcess
from wirecut.proof._sim_process import get_idempotent, poll_client
from wirecut.simulator import SimConfig
sim = SimProcess(SimConfig()).start()
print(sim.pid, flush=True)
sys.stdin.read()
"""


def test_a_simulator_does_not_outlive_a_parent_killed_with_sigkill() -> None:
    child = None
    with subprocess.Popen(
        [sys.executable, "-c", _PARENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as parent:
        try:
            assert parent.stdout is not None
            child = int(parent.stdout.readline())
            assert Path(f"/proc/{child}").exists()
            # SIGKILL: the parent runs no cleanup at all, so no stop() ever comes.
            parent.send_signal(signal.SIGKILL)
            assert parent.wait(BOUND) == -signal.SIGKILL
            assert exited(child, BOUND)
        finally:
            if parent.poll() is None:
                parent.kill()
            if child is not None and not exited(child, 0):
                os.kill(child, signal.SIGKILL)


def test_the_slots_the_child_reports_follow_a_request_from_busy_to_free() -> None:
    config = SimConfig(slots=1, tokens_per_second=50, prompt_ms=0, endless=True)
    with SimProcess(config) as sim, httpx.Client(timeout=BOUND) as client:
        assert [slot["is_processing"] for slot in sim.slots()] == [False]
        since = sim.next_seq()
        with client.stream("POST", sim.base_url + "/chat/completions", json=_chat(True)) as r:
            chunks = r.iter_raw()
            next(chunks)  # decoding
            (slot,) = sim.slots()
            first = sim.wait_for(
                lambda ev: ev.kind == EventKind.FIRST_TOKEN, timeout=BOUND, since=since
            )
            assert slot["is_processing"] is True
            assert slot["request_id"] == first.request_id
        sim.wait_for(lambda ev: ev.kind == EventKind.SLOT_FREED, timeout=BOUND, since=since)
        assert [slot["is_processing"] for slot in sim.slots()] == [False]


def test_a_reading_whose_kept_alive_connection_the_server_closed_under_it_is_sent_again() -> None:
    # The keep-alive race, made certain: the server reads the second request
    # on a connection it kept open, then closes it without an answer (as a
    # server whose idle timer fired just as the request came).
    def handler(exchange: Exchange) -> None:
        request = exchange.request
        if request.connection == 0 and len(exchange.server.requests) == 2:
            exchange.close()
            return
        exchange.json([{"seq": len(exchange.server.requests)}])

    with LoopbackServer(handler) as server, poll_client() as http:
        first = get_idempotent(http, f"{server.url}/sim/events", {"since": 0})
        again = get_idempotent(http, f"{server.url}/sim/events", {"since": 1})
        assert first.json() == [{"seq": 1}]
        assert again.json() == [{"seq": 3}]
        assert [r.connection for r in server.requests] == [0, 0, 1]
