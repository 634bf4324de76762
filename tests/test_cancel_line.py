"""A host's cancel line, both ends, through real sockets and threads in this process.

The host's end (``CancelLine``): the token first, one answer per request in
order, and the bounds on what a connection can make it do or hold. The serve process's end
(``LineClient``): a ``cancelling`` answer goes to the job, and whatever the
line cannot settle (``dropped``, ``done``, no answer in time, a line that
broke) goes by the control call, once. The host with its runner and Ray is
in tests/test_cluster.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from _support import BOUND
from wirecut.console.cluster import HostConfig, ProviderSpec, _line
from wirecut.console.cluster._line import CancelLine, LineClient, LineRequest
from wirecut.console.runner import RunnerLimits

TOKEN = "s3cret-token"


class Host:
    """The host's cancel as the line calls it: records each call, answers ``kind``."""

    def __init__(self, kind: str = "cancelling") -> None:
        self.kind = kind
        self.calls: list[list[LineRequest]] = []
        self.gate: threading.Event | None = None

    def __call__(self, requests: list[LineRequest]) -> list[str]:
        if self.gate is not None:
            self.gate.wait(BOUND)
        self.calls.append(list(requests))
        return [self.kind] * len(requests)

    @property
    def requests(self) -> list[LineRequest]:
        return [request for call in self.calls for request in call]


@pytest.fixture
def host() -> Host:
    return Host()


@pytest.fixture
def line(host: Host) -> Iterator[CancelLine]:
    line = CancelLine("127.0.0.1", TOKEN, host)
    try:
        yield line
    finally:
        line.close()


def connect(line: CancelLine) -> socket.socket:
    return socket.create_connection(line.address, timeout=BOUND)


def request(job_id: str, reason: str = "user") -> bytes:
    return json.dumps([job_id, reason]).encode() + b"\n"


def read_lines(sock: socket.socket, count: int) -> list[str]:
    data = b""
    while data.count(b"\n") < count:
        chunk = sock.recv(4096)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data.decode().splitlines()


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the host closed ``sock``; ``TimeoutError`` if it stays open for ``BOUND``."""
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def send_until_refused(sock: socket.socket, data: bytes) -> None:
    for _ in range(1000):
        sock.sendall(data)


# -- the host's end ------------------------------------------------------------------------------


def test_after_the_token_each_cancel_is_answered_in_order(line: CancelLine, host: Host) -> None:
    with connect(line) as sock:
        sock.sendall(TOKEN.encode() + b"\n" + request("a") + request("b ☃\n\t", "timeout"))
        assert read_lines(sock, 2) == ["cancelling", "cancelling"]
        sock.sendall(request("c", "disconnect"))
        assert read_lines(sock, 1) == ["cancelling"]
    assert host.requests == [("a", "user"), ("b ☃\n\t", "timeout"), ("c", "disconnect")]


def _ipv6_loopback() -> bool:
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_a_host_on_an_ipv6_address_has_a_line_too(host: Host) -> None:
    line = CancelLine("::1", TOKEN, host)

    async def main() -> Job:
        job = Job("v6")
        client = await LineClient.connect(line.address, TOKEN, Ray())
        assert client.send(job, "user")
        await wait_for(lambda: job.answers == ["cancelling"])
        client.close()
        await client.wait_closed()
        return job

    try:
        asyncio.run(main())
    finally:
        line.close()
    assert host.requests == [("v6", "user")]


def test_the_token_is_not_in_a_host_configs_repr() -> None:
    config = HostConfig(
        ProviderSpec("http://127.0.0.1:9/v1"), RunnerLimits(), 5.0, line_token=TOKEN
    )
    assert TOKEN not in repr(config)


def test_the_hosts_answer_kinds_reach_the_wire(host: Host, line: CancelLine) -> None:
    host.kind = "dropped"
    with connect(line) as sock:
        sock.sendall(TOKEN.encode() + b"\n" + request("gone"))
        assert read_lines(sock, 1) == ["dropped"]


@pytest.mark.parametrize(
    "first", [b"wrong-token\n", b"\n", TOKEN.encode() + b"x\n", request("a")], ids=repr
)
def test_a_connection_without_the_right_token_is_closed_and_cancels_nothing(
    line: CancelLine, host: Host, first: bytes
) -> None:
    with connect(line) as sock:
        sock.sendall(first + request("a"))
        assert closed_by_peer(sock)
    assert host.calls == []


@pytest.mark.parametrize(
    "bad",
    [
        b"not json\n",
        b'["a"]\n',
        b'["a", "user", 3]\n',
        b'[1, "user"]\n',
        b'["a", "because I say so"]\n',
        b'{"id": "a"}\n',
    ],
    ids=repr,
)
def test_a_line_that_is_not_a_request_closes_the_connection_after_the_good_ones(
    line: CancelLine, host: Host, bad: bytes
) -> None:
    with connect(line) as sock:
        sock.sendall(TOKEN.encode() + b"\n" + request("good") + bad + request("after"))
        assert read_lines(sock, 1) == ["cancelling"]
        assert closed_by_peer(sock)
    assert host.requests == [("good", "user")]


@pytest.mark.parametrize("authenticated", [False, True])
def test_a_line_longer_than_the_bound_closes_the_connection(
    line: CancelLine, host: Host, authenticated: bool
) -> None:
    with connect(line) as sock:
        if authenticated:
            sock.sendall(TOKEN.encode() + b"\n")
        sock.sendall(b"x" * (_line.MAX_LINE + 1))  # and no end of line
        assert closed_by_peer(sock)
    assert host.calls == []


def test_a_cancel_that_raises_on_the_host_closes_its_connection_not_the_line(
    host: Host,
) -> None:
    def cancel(requests: list[LineRequest]) -> list[str]:
        if requests[0][0] == "bug":
            raise RuntimeError("planted: the host's cancel failed")
        return host(requests)

    line = CancelLine("127.0.0.1", TOKEN, cancel)
    try:
        with connect(line) as first:
            first.sendall(TOKEN.encode() + b"\n" + request("bug"))
            assert closed_by_peer(first)
        with connect(line) as second:
            second.sendall(TOKEN.encode() + b"\n" + request("after"))
            assert read_lines(second, 1) == ["cancelling"]
    finally:
        line.close()
    assert host.requests == [("after", "user")]


def test_a_connection_beyond_the_limit_is_closed_and_the_others_still_cancel(
    line: CancelLine, host: Host
) -> None:
    socks = [connect(line) for _ in range(_line.MAX_CONNECTIONS)]
    try:
        socks[0].sendall(TOKEN.encode() + b"\n" + request("first"))
        assert read_lines(socks[0], 1) == ["cancelling"]  # every one was accepted by now
        with connect(line) as extra:
            extra.sendall(TOKEN.encode() + b"\n" + request("extra"))
            assert closed_by_peer(extra)
        socks[-1].sendall(TOKEN.encode() + b"\n" + request("last"))
        assert read_lines(socks[-1], 1) == ["cancelling"]
    finally:
        for sock in socks:
            sock.close()
    assert host.requests == [("first", "user"), ("last", "user")]


def test_a_connection_that_never_sends_the_token_is_closed_after_its_time(host: Host) -> None:
    line = CancelLine("127.0.0.1", TOKEN, host, token_seconds=0.2)
    try:
        with connect(line) as sock:
            assert closed_by_peer(sock)  # recv would wait BOUND if it stayed open
    finally:
        line.close()


def test_a_connection_that_does_not_read_its_answers_is_closed(
    line: CancelLine, host: Host
) -> None:
    with connect(line) as sock:
        sock.sendall(TOKEN.encode() + b"\n")
        # Cancels and never a read: the answers fill both socket buffers.
        chunk = b"".join(request(f"j{k}") for k in range(1000))
        with pytest.raises((BrokenPipeError, ConnectionResetError)):  # the host closed it
            send_until_refused(sock, chunk)
    # It answered what fitted, and then stopped reading that connection.
    assert 0 < len(host.requests) < 1_000_000


# -- the serve process's end ---------------------------------------------------------------------


@dataclass(eq=False)
class Job:
    id: str
    answers: list[str] = field(default_factory=list)

    def on_cancel_answer(self, kind: str, receipt: Any) -> None:
        assert receipt is None
        self.answers.append(kind)


@dataclass
class Ray:
    """The control call, as ``LineClient`` sees it: the jobs it was given, in order."""

    jobs: list[tuple[str, str]] = field(default_factory=list)
    sent: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, job: Job, reason: str) -> None:
        self.jobs.append((job.id, reason))
        self.sent.set()


async def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, "the state was never reached"
        await asyncio.sleep(0.005)


def test_the_client_gives_cancelling_to_the_job_and_the_rest_to_ray(host: Host) -> None:
    kinds = iter(["cancelling", "dropped", "done", "cancelling"])

    def answers(requests: list[LineRequest]) -> list[str]:
        host.calls.append(list(requests))
        return [next(kinds) for _ in requests]

    line = CancelLine("127.0.0.1", TOKEN, answers)

    async def main() -> tuple[list[Job], Ray]:
        ray = Ray()
        client = await LineClient.connect(line.address, TOKEN, ray)
        jobs = [Job(f"j{k}") for k in range(4)]
        for job in jobs:
            assert client.send(job, "user")
        await wait_for(lambda: len(host.requests) == 4 and len(ray.jobs) == 2)
        await wait_for(lambda: jobs[3].answers == ["cancelling"])
        client.close()
        assert not client.send(Job("after"), "user")  # closed: the caller goes by Ray
        await client.wait_closed()
        return jobs, ray

    try:
        jobs, ray = asyncio.run(main())
    finally:
        line.close()
    assert [job.answers for job in jobs] == [["cancelling"], [], [], ["cancelling"]]
    assert ray.jobs == [("j1", "user"), ("j2", "user")]
    assert host.requests == [(f"j{k}", "user") for k in range(4)]


def test_a_cancel_the_line_does_not_answer_in_time_goes_by_ray_once(host: Host) -> None:
    host.gate = threading.Event()  # the host's cancel does not return until set
    line = CancelLine("127.0.0.1", TOKEN, host)

    async def main() -> tuple[Job, Ray]:
        ray = Ray()
        client = await LineClient.connect(line.address, TOKEN, ray, answer_timeout=0.2)
        job = Job("slow")
        assert client.send(job, "timeout")
        await asyncio.wait_for(ray.sent.wait(), BOUND)  # late: sent by Ray as well
        assert host.gate is not None
        host.gate.set()
        await wait_for(lambda: bool(host.calls))
        # The late answer is read and dropped: the job had its answer from Ray.
        second = Job("second")
        assert client.send(second, "user")
        await wait_for(lambda: second.answers == ["cancelling"])
        assert not client.closed  # a slow answer is not a broken line
        client.close()
        await client.wait_closed()
        return job, ray

    try:
        job, ray = asyncio.run(main())
    finally:
        line.close()
    assert ray.jobs == [("slow", "timeout")]
    assert job.answers == []


@pytest.mark.parametrize("reply", [b"", b"what?\n"], ids=["closed", "garbage"])
def test_when_the_line_breaks_its_unanswered_cancels_go_by_ray(reply: bytes) -> None:
    # A host end that reads the token and one cancel, then closes or answers garbage.
    server = socket.create_server(("127.0.0.1", 0))
    read = threading.Event()

    def host_end() -> None:
        conn, _ = server.accept()
        with conn:
            data = b""
            while data.count(b"\n") < 2:
                data += conn.recv(4096)
            read.set()
            conn.sendall(reply)

    thread = threading.Thread(target=host_end, daemon=True)
    thread.start()

    async def main() -> tuple[Ray, list[Job]]:
        ray = Ray()
        client = await LineClient.connect(server.getsockname(), TOKEN, ray, answer_timeout=600)
        jobs = [Job("first"), Job("second")]
        for job in jobs:
            assert client.send(job, "user")
        await wait_for(lambda: client.closed)
        assert not client.send(Job("after"), "user")
        await client.wait_closed()
        return ray, jobs

    try:
        ray, jobs = asyncio.run(main())
    finally:
        server.close()
    assert read.is_set()
    assert ray.jobs == [("first", "user"), ("second", "user")]
    assert [job.answers for job in jobs] == [[], []]
