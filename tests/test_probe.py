"""``probe POINT``: each point blocks until the cut, ends with ``Interrupted``, leaves nothing.

Every test runs the command as the runner does: on a pool thread under
``scope.run`` with a real ``InterruptScope``, and a hand-built
``CommandContext`` whose output collects into a list; the command is made by
``probe_command(on_server=...)``, which shows the test each server it starts.
It waits (with a bound) until the probe is really blocked at its point,
cancels, and checks that the worker ended with ``Interrupted``, the scope's
ledger drained, and the probe's loopback servers are gone: their ports refuse
a connection, no ``wirecut-probe-*`` thread is left, and no socket the test
did not hold before is still open.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import pytest

from _support import BOUND
from wirecut.console.commands import (
    CommandContext,
    Session,
    Stream,
    UsageError,
    builtin_commands,
)
from wirecut.console.commands._probe import POINTS, probe, probe_command
from wirecut.loopback import FullBacklog, LoopbackServer
from wirecut.provider import Usage
from wirecut.scope import Interrupted, InterruptScope, TimelineEvent


class Output:
    """A command's output and usage, recorded; waiting on them is bounded."""

    def __init__(self, *, fail_on_token: bool = False) -> None:
        self._cond = threading.Condition()
        self.frames: list[tuple[Stream, str]] = []
        self.usage: list[Usage] = []
        self._fail_on_token = fail_on_token

    def __call__(self, stream: Stream, data: str) -> None:
        if stream == "token" and self._fail_on_token:
            raise RuntimeError("the client went away")
        with self._cond:
            self.frames.append((stream, data))
            self._cond.notify_all()

    def add_usage(self, usage: Usage) -> None:
        with self._cond:
            self.usage.append(usage)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = BOUND) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def text(self, stream: Stream = "stdout") -> str:
        with self._cond:
            return "".join(data for s, data in self.frames if s == stream)

    def tokens(self) -> list[str]:
        with self._cond:
            return [data for s, data in self.frames if s == "token"]

    def wait_line(self) -> str:
        """The first stdout line, once written."""
        assert self.wait_for(lambda: "\n" in self.text()), self.frames
        return self.text().split("\n", 1)[0]


class Run:
    """One ``probe POINT`` command running on a pool thread under its own scope."""

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        point: str,
        servers: list[Served],
        output: Output | None = None,
    ) -> None:
        self.scope = InterruptScope("cmd")
        self.out = output or Output()
        self.sockets_before = open_sockets()
        ctx = CommandContext(
            id="p1",
            line=f"probe {point}",
            scope=self.scope,
            session=Session(),
            services=cast(Any, None),  # a probe needs no service: touching one fails the test
            output=self.out,
            confirm=lambda message: True,
            add_usage=self.out.add_usage,
        )
        command = probe_command(on_server=servers.append)
        self.future: Future[None] = pool.submit(self.scope.run, command, ctx, [point])
        _started.append((self.scope, self.future))

    def cut(self, *, escalate_after: float | None = None) -> BaseException:
        """Cancel, and return what the worker ended with."""
        self.scope.cancel("user", escalate_after=escalate_after)
        exc = self.future.exception(timeout=BOUND)
        assert exc is not None
        return exc

    def events(self) -> list[str]:
        return [event for event, _ in self.scope.timeline]


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    p = ThreadPoolExecutor(1, thread_name_prefix="test-worker")
    try:
        yield p
    finally:
        # A failed test may leave its probe blocked: cut it, and do not let
        # a probe that ignores the cut hang the whole run.
        for scope, _ in _started:
            scope.cancel("test over", escalate_after=0.2)
        concurrent.futures.wait([future for _, future in _started], timeout=BOUND)
        _started.clear()
        p.shutdown(wait=False)


#: The commands the running test started, for the pool fixture to clean up.
_started: list[tuple[InterruptScope, Future[None]]] = []


Served = LoopbackServer | FullBacklog


@pytest.fixture
def servers() -> list[Served]:
    """The loopback servers and listeners the test's probe starts, in order."""
    return []


def probe_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("wirecut-probe")]


def open_sockets() -> set[str]:
    """The sockets this process holds open, by inode (Linux), or an empty set."""
    if not os.path.isdir("/proc/self/fd"):
        return set()
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed while listed
        if target.startswith("socket:"):
            found.add(target)
    return found


def assert_left_nothing(run: Run, servers: list[Served]) -> None:
    """No probe thread or socket remains, every server's port refuses, the ledger drained.

    Called as soon as the command returned: it stops what it started before
    it returns, so nothing here waits for threads or sockets to go.
    """
    assert probe_threads() == []
    assert open_sockets() <= run.sockets_before
    for server in servers:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", server.port), timeout=BOUND).close()
    assert run.scope.wait_quiescent(5), run.scope.live()


def only_server(servers: list[Served]) -> LoopbackServer:
    assert len(servers) == 1
    server = servers[0]
    assert isinstance(server, LoopbackServer)
    return server


def syn_sent_to(port: int) -> int:
    """How many sockets on this host wait in SYN_SENT for 127.0.0.1:``port`` (Linux)."""
    remote = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return sum(1 for row in rows if row[2] == remote and row[3] == "02")


# -- the points -------------------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads the TCP table of Linux")
def test_connect_blocks_in_the_connect_to_a_full_backlog_until_cut(
    pool: ThreadPoolExecutor, servers: list[Served]
) -> None:
    run = Run(pool, "connect", servers)
    line = run.out.wait_line()
    assert len(servers) == 1
    port = servers[0].port
    assert line.startswith(f"probe connect: connecting to 127.0.0.1:{port}")
    # Really blocked: the kernel holds the probe's connect in SYN_SENT. No
    # event reaches user space from there, so poll the table, bounded.
    waited = threading.Event()
    for _ in range(int(BOUND / 0.01)):
        if syn_sent_to(port):
            break
        waited.wait(0.01)
    assert syn_sent_to(port) == 1
    assert not run.future.done()

    assert isinstance(run.cut(), Interrupted)
    # The cut reached the connect itself (wirecut.http waits on it beside a
    # wakeup socket the scope shuts), not only its timeout.
    assert TimelineEvent.SOCKETS_SHUT in run.events()
    assert_left_nothing(run, servers)


def test_ttfb_blocks_waiting_for_headers_and_the_cut_reaches_the_server(
    pool: ThreadPoolExecutor, servers: list[Served]
) -> None:
    run = Run(pool, "ttfb", servers)
    line = run.out.wait_line()
    server = only_server(servers)
    assert line.startswith(
        f"probe ttfb: waiting for the response headers from 127.0.0.1:{server.port}"
    )
    assert server.wait_for(lambda: server.open_requests == 1, BOUND)

    assert isinstance(run.cut(), Interrupted)
    assert len(server.requests) == 1
    # The client closed it, before the server stopped (a stop's close is not recorded).
    assert server.closes == [server.requests[0].connection]
    assert "the server saw the close" in run.out.text()
    assert [u.requests for u in run.out.usage] == [1]
    assert run.out.tokens() == []
    assert TimelineEvent.SOCKETS_SHUT in run.events()
    assert_left_nothing(run, servers)


def test_stream_reads_tokens_until_cut_and_counts_every_token_received(
    pool: ThreadPoolExecutor, servers: list[Served]
) -> None:
    run = Run(pool, "stream", servers)
    line = run.out.wait_line()
    server = only_server(servers)
    assert line == (
        f"probe stream: reading a stream from 127.0.0.1:{server.port};"
        " cancel to see where the cut lands"
    )
    assert run.out.wait_for(lambda: len(run.out.tokens()) >= 2)

    assert isinstance(run.cut(), Interrupted)
    tokens = run.out.tokens()
    assert [(u.requests, u.completion_tokens) for u in run.out.usage] == [(1, len(tokens))]
    assert server.closes == [server.requests[0].connection]
    # On a line of its own, after the tokens.
    report = [data for _, data in run.out.frames if "saw the close" in data]
    assert len(report) == 1
    assert report[0].startswith("\nprobe stream: the server saw the close")
    assert TimelineEvent.SOCKETS_SHUT in run.events()
    assert_left_nothing(run, servers)


def test_subprocess_waits_for_sleep_until_the_cut_kills_it(
    pool: ThreadPoolExecutor, servers: list[Served]
) -> None:
    run = Run(pool, "subprocess", servers)
    match = re.search(r"\(pid (\d+),", run.out.wait_line())
    assert match is not None
    pid = int(match.group(1))
    assert run.scope.live()["processes"] == 1
    os.kill(pid, 0)  # alive

    assert isinstance(run.cut(), Interrupted)
    assert TimelineEvent.PROCESSES_SIGNALLED in run.events()
    assert_left_nothing(run, servers)
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(pid, 0)


def test_sleep_blocks_in_scope_sleep_until_cut(
    pool: ThreadPoolExecutor, servers: list[Served]
) -> None:
    run = Run(pool, "sleep", servers)
    assert run.out.wait_line().startswith("probe sleep: in scope.sleep(3600)")

    assert isinstance(run.cut(), Interrupted)
    assert servers == []
    assert_left_nothing(run, servers)


def test_python_loop_ends_only_by_escalation(
    pool: ThreadPoolExecutor, servers: list[Served]
) -> None:
    run = Run(pool, "python-loop", servers)
    assert run.out.wait_line().startswith("probe python-loop: spinning in pure Python")

    assert isinstance(run.cut(escalate_after=0.2), Interrupted)
    assert TimelineEvent.ESCALATED in run.events()
    assert_left_nothing(run, servers)


def test_nested_thread_blocks_until_the_cut_ends_both_threads(
    pool: ThreadPoolExecutor, servers: list[Served]
) -> None:
    run = Run(pool, "nested-thread", servers)
    match = re.search(r"waiting for thread (\S+),", run.out.wait_line())
    assert match is not None
    assert match.group(1) in probe_threads()
    assert run.scope.live()["threads"] == 2  # the worker and the nested thread

    assert isinstance(run.cut(), Interrupted)
    assert_left_nothing(run, servers)  # the command joined its nested thread


def test_child_agent_blocks_in_the_childs_stream_and_counts_both_requests(
    pool: ThreadPoolExecutor, servers: list[Served]
) -> None:
    run = Run(pool, "child-agent", servers)
    run.out.wait_line()
    server = only_server(servers)
    assert run.out.wait_for(lambda: len(run.out.tokens()) >= 2)
    # The parent's request offered `delegate`; the child's (streaming now) offered nothing.
    assert [bool(r.json().get("tools")) for r in server.requests] == [True, False]
    assert run.scope.live()["objects"] == 2  # the parent's turn, and the child's inside it

    assert isinstance(run.cut(), Interrupted)
    tokens = run.out.tokens()
    assert sum(u.requests for u in run.out.usage) == 2
    # The tokens the user saw, and the parent's one tool-call delta (`delegate`).
    assert sum(u.completion_tokens or 0 for u in run.out.usage) == len(tokens) + 1
    assert server.requests[-1].connection in server.closes  # the child's stream was cut
    assert TimelineEvent.OBJECTS_INTERRUPTED in run.events()
    assert_left_nothing(run, servers)


# -- ending otherwise ---------------------------------------------------------------------


def test_a_probe_that_fails_uncut_still_stops_its_server(
    pool: ThreadPoolExecutor, servers: list[Served]
) -> None:
    run = Run(pool, "stream", servers, Output(fail_on_token=True))
    exc = run.future.exception(timeout=BOUND)
    assert isinstance(exc, RuntimeError)
    assert not run.scope.cancelled
    assert len(servers) == 1
    assert_left_nothing(run, servers)


@pytest.mark.parametrize("args", [["nowhere"], [], ["sleep", "extra"]])
def test_anything_but_one_known_point_is_a_usage_error_naming_the_points(
    pool: ThreadPoolExecutor, servers: list[Served], args: list[str]
) -> None:
    scope = InterruptScope("cmd")
    out = Output()
    ctx = CommandContext(
        id="p1",
        line="probe " + " ".join(args),
        scope=scope,
        session=Session(),
        services=cast(Any, None),
        output=out,
        confirm=lambda message: True,
        add_usage=out.add_usage,
    )
    command = probe_command(on_server=servers.append)
    with pytest.raises(UsageError) as info:
        pool.submit(scope.run, command, ctx, args).result(timeout=BOUND)
    message = str(info.value)
    assert "\n" not in message
    assert all(point in message for point in POINTS)
    assert out.frames == []
    assert servers == []


def test_probe_is_a_builtin_command_with_every_point_in_its_usage() -> None:
    registered = builtin_commands()["probe"]
    assert registered is probe
    assert registered.usage == "probe " + "|".join(POINTS)
    assert set(POINTS) == {
        "connect",
        "ttfb",
        "stream",
        "subprocess",
        "sleep",
        "python-loop",
        "nested-thread",
        "child-agent",
    }
