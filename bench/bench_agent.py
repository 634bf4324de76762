"""Benchmark cutting an agent turn: ``host.cancel()`` -> ``run_conversation`` returned.

Run: ``python bench/bench_agent.py [--trials 100] [--warmup 1] [--out DIR]``.
Each trial runs a turn on
a thread owned by a host scope (as a host does), waits with a bound until the
turn is blocked at one point (the model streaming, the header wait of a
non-streaming call, a tool's subprocess, the same with a descendant that
escaped the process group and holds the output open, a tool's
``scope.sleep``, a thread the tool spawned through the scope, a delegated
child agent's stream), cancels,
and measures until ``run_conversation`` returned in that thread. Real sockets,
threads and processes against an in-process simulator.

Prints a Markdown table (``--out DIR`` writes it as ``DIR/bench_agent.json``
for docs/benchmarks.md); asserts nothing (the targets are in the table: p99
under 50 ms, except ``shell``, bounded by the SIGTERM -> SIGKILL grace).
"""

from __future__ import annotations

import argparse
import functools
import os
import select
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import wirecut.scope as ws
from _procs import percentile
from _report import Report
from wirecut.agent import AIAgent, ConversationResult, ConversationStatus, delegate_tool, shell_tool
from wirecut.provider import ChatClient
from wirecut.scope import InterruptScope
from wirecut.simulator import SimConfig, SimulatorServer

BLOCKED_WITHIN = 5.0  # seconds for a turn to reach its blocking point
RETURN_WITHIN = 10.0  # seconds for a cut turn to return before the trial counts as hung
CLOSE_WITHIN = 1.0  # seconds for the provider to log the close of the in-flight request
QUIESCENT_WITHIN = 2.0  # seconds for the host's ledger to drain after the return
SHELL_GRACE = 1.0  # seconds between SIGTERM and SIGKILL for the shell tool

Turn = Future[tuple[ConversationResult, float]]

# A program whose grandchild leaves its process group (a new session, a second
# fork) and keeps stdout open; the grandchild writes its pid into the FIFO.
ESCAPING_PROGRAM = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(sys.argv[1], "w") as fifo:
            fifo.write(str(os.getpid()))
        time.sleep(300)
    os._exit(0)
os.wait()
time.sleep(300)
"""


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A scripted assistant reply asking for one tool call."""
    return {"tool_calls": [{"id": "call_1", "function": {"name": name, "arguments": arguments}}]}


class Lab:
    """One simulator and one client per mode, shared by every trial.

    The simulator's replies depend on the last user message only: a tool call
    for the tool modes, an endless stream of words for everything else (the
    child agent's task included).
    """

    def __init__(self, fifo: str) -> None:
        self.fifo = fifo
        self.replies: dict[str, Mapping[str, Any]] = {
            "shell": _call("shell", {"argv": ["sh", "-c", f"echo up > {fifo}; sleep 300"]}),
            "escape": _call("shell", {"argv": [sys.executable, "-c", ESCAPING_PROGRAM, fifo]}),
            "nap": _call("nap", {"seconds": 300}),
            "crunch": _call("crunch", {}),
            "parent task": _call("delegate", {"task": "child task"}),
        }
        config = SimConfig(slots=8, tokens_per_second=200, prompt_ms=5, endless=True)
        self.server = SimulatorServer(config, responder=self._respond)
        self.clients: dict[str, ChatClient] = {}
        self.since = 0

    def _respond(self, request: dict[str, Any]) -> Mapping[str, Any] | None:
        last: dict[str, Any] = request["messages"][-1]
        if last["role"] != "user":
            return None
        return self.replies.get(last["content"])

    def client(self, mode: str, **kwargs: Any) -> ChatClient:
        if mode not in self.clients:
            self.clients[mode] = ChatClient(self.server.base_url, model="sim", **kwargs)
        return self.clients[mode]

    def next_trial(self) -> None:
        """Forget the previous trial's events, and look only at later ones."""
        self.server.reset()
        self.since = self.server.simulator.event_log.next_seq

    def nth_event(self, kind: str, nth: int = 1) -> str | None:
        """Wait for the ``nth`` event of ``kind`` in this trial; return its request id."""
        seen = 0

        def match(event: Any) -> bool:
            nonlocal seen
            seen += event.kind == kind
            return seen >= nth

        return self.server.wait_for(match, timeout=BLOCKED_WITHIN, since=self.since).request_id

    def __enter__(self) -> Lab:
        self.server.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        for client in self.clients.values():
            client.close()
        self.server.stop()


@dataclass
class Blocked:
    """A turn blocked where the mode wants it, about to be cut."""

    host: InterruptScope
    turn: Turn
    request_id: str | None  # the request in flight at the cut, if there is one
    escaped_pid: int | None = None  # a process outside the group, killed after the trial


def _run_turn(
    agent: AIAgent, text: str, on_token: Callable[[str], None] | None = None
) -> tuple[ConversationResult, float]:
    # The moment of return is taken here, in the worker, not when the
    # future's waiter happens to be scheduled.
    result = agent.run_conversation(text, on_token=on_token)
    return result, time.perf_counter()


def _start(agent: AIAgent, text: str, on_token: Callable[[str], None] | None = None) -> Blocked:
    host = InterruptScope("host")
    turn = host.spawn(functools.partial(_run_turn, agent, text, on_token))
    return Blocked(host, turn, None)


def _wait(event: threading.Event) -> None:
    if not event.wait(BLOCKED_WITHIN):
        raise TimeoutError(f"not blocked within {BLOCKED_WITHIN} s")


# -- the blocking points ------------------------------------------------------------


def while_streaming(lab: Lab) -> Blocked:
    received = 0
    three = threading.Event()

    def on_token(text: str) -> None:
        nonlocal received
        received += 1
        if received == 3:
            three.set()

    blocked = _start(AIAgent(lab.client("stream")), "stream", on_token)
    _wait(three)
    blocked.request_id = lab.nth_event("first_token")
    return blocked


def header_wait(lab: Lab) -> Blocked:
    client = lab.client("header", wire_stream=False)
    blocked = _start(AIAgent(client, stream=False), "no stream")
    # Decoding: a non-streaming response has no headers until the end.
    blocked.request_id = lab.nth_event("first_token")
    return blocked


def in_subprocess(lab: Lab) -> Blocked:
    # Opened for reading first, so that the program's open() for writing does
    # not block, and select() wakes on its write, not on a hang-up.
    fd = os.open(lab.fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        blocked = _start(
            AIAgent(lab.client("shell"), tools=[shell_tool(grace=SHELL_GRACE)]), "shell"
        )
        readable, _, _ = select.select([fd], [], [], BLOCKED_WITHIN)
        if not readable or os.read(fd, 16) != b"up\n":
            _abandon(blocked)
            raise TimeoutError(f"the program did not start within {BLOCKED_WITHIN} s")
    finally:
        os.close(fd)
    return blocked


def in_subprocess_with_an_escaped_descendant(lab: Lab) -> Blocked:
    fd = os.open(lab.fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        blocked = _start(
            AIAgent(lab.client("escape"), tools=[shell_tool(grace=SHELL_GRACE)]), "escape"
        )
        readable, _, _ = select.select([fd], [], [], BLOCKED_WITHIN)
        if not readable:
            _abandon(blocked)
            raise TimeoutError(f"the program did not start within {BLOCKED_WITHIN} s")
        blocked.escaped_pid = int(os.read(fd, 64))
    finally:
        os.close(fd)
    return blocked


def _kill_escaped(pid: int) -> None:
    # Outside the group, only its pid reaches it; wait (bounded) until it is gone.
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        select.select([pidfd], [], [], RETURN_WITHIN)
    finally:
        os.close(pidfd)


def in_scope_sleep(lab: Lab) -> Blocked:
    napping = threading.Event()

    def nap(seconds: float) -> str:
        """Sleep a while."""
        napping.set()
        ws.sleep(seconds)
        return "rested"

    blocked = _start(AIAgent(lab.client("sleep"), tools=[nap]), "nap")
    _wait_or_abandon(blocked, napping)
    return blocked


def in_spawned_thread(lab: Lab) -> Blocked:
    working = threading.Event()

    def crunch() -> str:
        """Work in a background thread."""

        def worker() -> str:
            working.set()
            ws.sleep(300)
            return "done"

        scope = ws.current_scope()
        assert scope is not None
        return scope.spawn(worker).result()

    blocked = _start(AIAgent(lab.client("thread"), tools=[crunch]), "crunch")
    _wait_or_abandon(blocked, working)
    return blocked


def in_child_agent(lab: Lab) -> Blocked:
    client = lab.client("delegate")
    parent = AIAgent(client, tools=[delegate_tool(lambda: AIAgent(client))])
    blocked = _start(parent, "parent task")
    blocked.request_id = lab.nth_event("first_token", nth=2)  # the child's stream
    return blocked


def _wait_or_abandon(blocked: Blocked, event: threading.Event) -> None:
    try:
        _wait(event)
    except TimeoutError:
        _abandon(blocked)
        raise


def _abandon(blocked: Blocked) -> None:
    blocked.host.cancel("abandoned")
    blocked.turn.result(RETURN_WITHIN)


@dataclass(frozen=True)
class Mode:
    name: str
    start: Callable[[Lab], Blocked]
    target: str
    in_flight: bool  # a request is in flight at the cut


MODES = [
    Mode("model streaming", while_streaming, "p99 < 50 ms", in_flight=True),
    Mode("header wait (non-streaming)", header_wait, "p99 < 50 ms", in_flight=True),
    Mode(
        "shell subprocess",
        in_subprocess,
        f"< SIGTERM->SIGKILL grace ({SHELL_GRACE:g} s); sh dies on SIGTERM",
        in_flight=False,
    ),
    Mode(
        "shell, a descendant escaped the group",
        in_subprocess_with_an_escaped_descendant,
        f"< SIGTERM->SIGKILL grace ({SHELL_GRACE:g} s); python dies on SIGTERM",
        in_flight=False,
    ),
    Mode("tool in scope.sleep", in_scope_sleep, "p99 < 50 ms", in_flight=False),
    Mode("thread spawned by the tool", in_spawned_thread, "p99 < 50 ms", in_flight=False),
    Mode("delegated child agent", in_child_agent, "p99 < 50 ms", in_flight=True),
]


# -- measuring ------------------------------------------------------------------------


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    trials: int = 0
    not_blocked: int = 0  # never reached the blocking point: not cut, not counted
    hung: int = 0  # did not return within RETURN_WITHIN
    interrupted: int = 0  # returned status "interrupted" with the host's reason
    provider_closed: int = 0
    ledger_zero: int = 0
    leftovers: list[dict[str, int]] = field(default_factory=list)


def one_trial(lab: Lab, mode: Mode, tally: Tally) -> None:
    lab.next_trial()
    tally.trials += 1
    try:
        blocked = mode.start(lab)
    except TimeoutError:
        tally.not_blocked += 1
        return
    try:
        measure(lab, blocked, tally)
    finally:
        if blocked.escaped_pid is not None:
            _kill_escaped(blocked.escaped_pid)


def measure(lab: Lab, blocked: Blocked, tally: Tally) -> None:
    cancelled_at = time.perf_counter()
    blocked.host.cancel("user")
    try:
        result, returned_at = blocked.turn.result(RETURN_WITHIN)
    except TimeoutError:
        tally.hung += 1
        return
    tally.latencies.append(returned_at - cancelled_at)
    if result.status is ConversationStatus.INTERRUPTED and result.reason == "user":
        tally.interrupted += 1
    if blocked.host.wait_quiescent(QUIESCENT_WITHIN):
        tally.ledger_zero += 1
    else:
        tally.leftovers.append(blocked.host.live())
    if blocked.request_id is not None:
        try:
            lab.server.wait_for_event(
                "peer_closed", blocked.request_id, timeout=CLOSE_WITHIN, since=lab.since
            )
        except TimeoutError:
            pass
        else:
            tally.provider_closed += 1


def _ms(samples: list[float], q: float | None) -> str:
    if not samples:
        return "-"
    value = max(samples) if q is None else percentile(samples, q)
    assert value is not None
    return f"{value * 1e3:.2f} ms"


def report(tallies: Mapping[str, Tally], trials: int, threads: tuple[int, int, int]) -> Report:
    """The table of ``tallies``, and what the run left (``threads``: before, with server, after)."""
    problems = [
        f"{mode.name}: {t.not_blocked} never blocked, {t.hung} hung (> {RETURN_WITHIN:g} s), "
        f"ledger left: {t.leftovers[:3]}."
        for mode in MODES
        if (t := tallies[mode.name]).not_blocked or t.hung or t.leftovers
    ]
    made = Report(
        "bench_agent",
        "Cutting an agent turn",
        "A turn on a thread of a host scope, blocked at one point (the model streaming, a "
        "non-streaming call's header wait, a tool's subprocess, one whose descendant "
        "escaped the group, `scope.sleep`, a thread the tool spawned, a delegated child "
        "agent), cancelled by the host: cancel -> `run_conversation` returned, whether "
        "the provider (an in-process simulator) saw the close, and whether the host's "
        "ledger drained.",
    )
    table = made.table(
        f"host.cancel() -> run_conversation returned, {trials} trials a row",
        [
            "blocked in",
            "p50",
            "p99",
            "max",
            "target",
            "interrupted",
            "provider saw close",
            "ledger zero",
        ],
        note=" ".join(
            [
                *problems,
                f"Threads alive: {threads[0]} before, {threads[1]} with the server up, "
                f"{threads[2]} after the trials.",
            ]
        ),
    )
    for mode in MODES:
        t = tallies[mode.name]
        n = t.trials
        table.add(
            mode.name,
            _ms(t.latencies, 50),
            _ms(t.latencies, 99),
            _ms(t.latencies, None),
            mode.target,
            f"{t.interrupted}/{n}",
            f"{t.provider_closed}/{n}" if mode.in_flight else "n/a (none in flight)",
            f"{t.ledger_zero}/{n}",
        )
    made.data = {
        "settings": {"trials": trials, "shell_grace_s": SHELL_GRACE},
        "tallies": {name: asdict(tally) for name, tally in tallies.items()},
        "threads": {"before": threads[0], "with_server": threads[1], "after": threads[2]},
    }
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed trials per mode (connections, imports)"
    )
    parser.add_argument("--out", type=Path, help="write bench_agent.json into this folder")
    args = parser.parse_args()

    threads_before = threading.active_count()
    tallies = {mode.name: Tally() for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        fifo = os.path.join(tmp, "started")
        os.mkfifo(fifo)
        with Lab(fifo) as lab:
            threads_with_server = threading.active_count()
            for mode in MODES:
                print(f"{mode.name} ...", file=sys.stderr, flush=True)
                for _ in range(args.warmup):
                    one_trial(lab, mode, Tally())
                for _ in range(args.trials):
                    one_trial(lab, mode, tallies[mode.name])
            threads_after = threading.active_count()
    made = report(tallies, args.trials, (threads_before, threads_with_server, threads_after))
    made.print()
    if args.out:
        made.write(args.out)


if __name__ == "__main__":
    main()
