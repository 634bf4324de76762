"""``wirecut proxy`` side by side with direct requests and with LiteLLM's proxy.

Run: ``python bench/bench_proxy.py [--quick] [--no-litellm]
[--only overhead|scale|burst|cuts] [--levels 1,64,256,1000] [--out FILE]``.
Prints Markdown tables (and, with ``--out``, writes them as JSON) and asserts
nothing.

Every system runs as its own process on loopback in front of the same
upstream, the simulator (``wirecut provider``, its own process): direct
requests (no proxy), ``wirecut proxy``, and LiteLLM's proxy (``litellm[proxy]``
1.108.7, installed by this script into a venv of its own, ``--litellm-venv``,
never a wirecut dependency; its config points at the loopback simulator; its
remote cost map is off, so it makes no request off this machine).

1. Overhead: time to first token added to the direct one (p50/p99, streamed
   requests one at a time, the systems taking turns); CPU per 1,000 streamed
   tokens (the proxy process's user+system time over 8 concurrent streams);
   RSS after that load; start-up time (spawn to its health answer).
2. Scale: 1, 64, 256 and 1,000 concurrent streams (the simulator at 20
   tokens/s a stream, ``--prompt-ms 0``), the systems taking turns at each
   level, each load opened at once by one cheap asyncio client process
   (``_stream_load.py``): streams that had a first token within the start
   bound, time to first token p50 (and what the system added to direct),
   tokens/s relayed over a window once all had started (and the ratio to
   direct), the system's CPU per 1,000 tokens over that window, its RSS and
   threads at the end of it. Then ``wirecut proxy`` gets SIGTERM with 1,000
   streams open: how long until it exited.
3. At 64 and 256 concurrent streams: every client closes its socket at once;
   cancel -> upstream close is the time from that moment to the simulator
   noticing each close (its ``t_disconnect``), p50/p99.
4. The cut table of issue 19, on the simulator (one slot): a client that
   leaves while streaming, while waiting for a whole answer, while queued
   behind another request, during a 5 s prompt phase; whether the slot was
   freed, whether the dead queued client reached the engine, how many
   requests reached the upstream after the client left. (On the embedded
   llama.cpp the same cuts are checked by the ``local`` test of
   tests/test_proxy.py.) Then the same cut, in decoding and in the prompt
   phase, stream and not, for ``/v1/responses`` and ``/v1/messages``:
   direct, ``wirecut proxy`` and LiteLLM (which serves both routes; the
   table says which route each asked the upstream on).

The machine is shared: the script prints the load average with the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx

from _procs import Process, percentile, status_kib
from _report import Report

LITELLM = "litellm[proxy]==1.108.7"
BOUND = 10.0
TICK = os.sysconf("SC_CLK_TCK")


# -- processes ---------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def cpu_seconds(pid: int) -> float:
    total = 0
    for each in _tree(pid):
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def threads(pid: int) -> int:
    """Threads of ``pid`` and its descendants."""
    total = 0
    for each in _tree(pid):
        try:
            total += len(os.listdir(f"/proc/{each}/task"))
        except OSError:
            continue
    return total


def rss_mib(pid: int) -> float:
    total = 0
    for each in _tree(pid):
        try:
            total += status_kib(each, "VmRSS")
        except (OSError, KeyError):  # gone meanwhile, or a zombie with no VmRSS
            continue
    return total / 1024


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


@dataclass
class System:
    """One way to the upstream: its API base, and its process (None: direct)."""

    name: str
    base_url: str
    proc: subprocess.Popen[bytes] | None = None
    startup_s: float | None = None
    stop: Callable[[], None] = lambda: None

    @property
    def port(self) -> int:
        return int(self.base_url.split(":")[2].split("/")[0])


def _wait_health(url: str, proc: subprocess.Popen[bytes], bound: float = 180.0) -> None:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited {proc.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url} did not answer within {bound} s")


def _stopper(proc: subprocess.Popen[bytes]) -> Callable[[], None]:
    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    return stop


def start_wirecut(upstream: str, data_dir: Path) -> System:
    port = _free_port()
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wirecut",
            "proxy",
            "--port",
            str(port),
            "--upstream",
            upstream,
            "--data-dir",
            str(data_dir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_health(f"http://127.0.0.1:{port}/health", proc)
    return System(
        "wirecut proxy",
        f"http://127.0.0.1:{port}/v1",
        proc,
        time.monotonic() - started,
        _stopper(proc),
    )


def ensure_litellm(venv: Path) -> Path:
    """The ``litellm`` program of ``venv``, installing LiteLLM there first if needed."""
    program = venv / "bin" / "litellm"
    if not program.exists():
        print(f"installing {LITELLM} into {venv} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", LITELLM], check=True)
    return program


def start_litellm(
    program: Path, upstream: str, work: Path, *, cancel_on_disconnect: bool
) -> System:
    config = work / f"litellm-{cancel_on_disconnect}.yaml"
    settings = "general_settings:\n  cancel_on_disconnect: true\n" if cancel_on_disconnect else ""
    config.write_text(
        "model_list:\n"
        "  - model_name: m\n"
        "    litellm_params:\n"
        "      model: openai/wirecut-sim\n"
        f"      api_base: {upstream}\n"
        "      api_key: none\n" + settings
    )
    port = _free_port()
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch off this machine
        "LITELLM_TELEMETRY": "False",
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
    }
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            str(program),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=work,
    )
    _wait_health(f"http://127.0.0.1:{port}/health/liveliness", proc)
    name = "LiteLLM, cancel_on_disconnect" if cancel_on_disconnect else "LiteLLM, default"
    return System(
        name, f"http://127.0.0.1:{port}/v1", proc, time.monotonic() - started, _stopper(proc)
    )


class Sim:
    """``wirecut provider`` as a process, read through ``/sim/events`` and ``/slots``."""

    def __init__(self, *args: str) -> None:
        self.process = Process("provider", "--port", "0", *args)
        self.base_url = self.process.url
        self.root = self.base_url.removesuffix("/v1")
        self.http = httpx.Client(timeout=BOUND)

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        return self.http.get(f"{self.root}/sim/events", params={"since": since}).json()  # type: ignore[no-any-return]

    def mark(self) -> int:
        """Forget the log so far (``/sim/reset``); the ``since`` of what comes next: 0.

        The log keeps an event per token: reading it all each time would
        cost more than the trial.
        """
        self.http.post(f"{self.root}/sim/reset").raise_for_status()
        return 0

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], since: int, bound: float = BOUND
    ) -> dict[str, Any] | None:
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            for event in self.events(since):
                if predicate(event):
                    return event
            time.sleep(0.01)
        return None

    def busy_after(self, bound: float) -> int:
        """Slots still processing once ``bound`` seconds passed (0 as soon as all are idle)."""
        deadline = time.monotonic() + bound
        while True:
            slots = self.http.get(f"{self.root}/slots").json()
            busy = sum(1 for s in slots if s["is_processing"])
            if not busy or time.monotonic() > deadline:
                return busy
            time.sleep(0.05)

    def wait_idle(self, bound: float = 30.0) -> None:
        deadline = time.monotonic() + bound
        while any(s["is_processing"] for s in self.http.get(f"{self.root}/slots").json()):
            if time.monotonic() > deadline:
                raise RuntimeError("the simulator never went idle")
            time.sleep(0.02)

    def stop(self) -> None:
        self.http.close()
        self.process.stop()


CHAT = "/v1/chat/completions"
#: The routes of the second cut table, beside chat's.
ROUTES = ("/v1/responses", "/v1/messages")


def body(
    stream: bool, max_tokens: int, prompt: str = "tell me a long story", route: str = CHAT
) -> bytes:
    """A request of ``route``'s API (chat, Responses or Messages) for model ``m``."""
    payload: dict[str, Any] = {"model": "m", "stream": stream}
    if route == "/v1/responses":
        payload |= {"input": prompt, "max_output_tokens": max_tokens}
    else:
        payload |= {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    return json.dumps(payload).encode()


def open_request(system: System, data: bytes, route: str = CHAT) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", system.port), timeout=30)
    head = (
        f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1:{system.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    conn.sendall(head.encode() + data)
    return conn


def read_until(conn: socket.socket, marker: bytes) -> bytes:
    seen = b""
    while marker not in seen:
        data = conn.recv(65536)
        if not data:
            raise RuntimeError(f"the response ended before {marker!r}: {seen[-200:]!r}")
        seen += data
    return seen


def _ms(values: list[float], q: float) -> str:
    found = percentile(values, q)
    return "never" if found is None else f"{found:.2f}"


def table(report: Report, title: str, head: list[str], rows: list[list[str]]) -> None:
    """Print a table now (a long run shows its progress) and keep it in ``report``."""
    made = report.table(title, head)
    for row in rows:
        made.add(*row)
    print(f"### {title}\n")
    print(made.markdown())
    print()


# -- 1. overhead -------------------------------------------------------------------------


def ttft(systems: list[System], trials: int) -> dict[str, list[float]]:
    """Time to first content byte of a streamed request, ms, per system (taking turns)."""
    found: dict[str, list[float]] = {s.name: [] for s in systems}
    clients = {s.name: httpx.Client(base_url=s.base_url, timeout=BOUND) for s in systems}
    data = body(True, 2)
    try:
        for trial in range(trials + 5):
            order = list(systems)
            random.shuffle(order)
            for system in order:
                started = time.perf_counter()
                with clients[system.name].stream(
                    "POST",
                    "/chat/completions",
                    content=data,
                    headers={"Content-Type": "application/json"},
                ) as response:
                    raw = response.iter_raw()
                    for chunk in raw:
                        if b'"content"' in chunk:
                            elapsed = (time.perf_counter() - started) * 1000
                            break
                    for _ in raw:
                        pass
                if trial >= 5:  # warm-up first
                    found[system.name].append(elapsed)
    finally:
        for client in clients.values():
            client.close()
    return found


def stream_load(system: System, streams: int, tokens: int) -> int:
    """``streams`` concurrent streams of ``tokens`` each; the content chunks received."""
    counts = [0] * streams

    def one(i: int) -> None:
        with httpx.Client(base_url=system.base_url, timeout=60) as client:
            with client.stream(
                "POST",
                "/chat/completions",
                content=body(True, tokens),
                headers={"Content-Type": "application/json"},
            ) as response:
                for line in response.iter_lines():
                    counts[i] += '"content":"' in line

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts)


def overhead(report: Report, sim: Sim, systems: list[System], quick: bool) -> None:
    direct = System("direct", sim.base_url)
    times = ttft([direct, *systems], 40 if quick else 200)
    base50 = percentile(times["direct"], 50) or 0.0
    base99 = percentile(times["direct"], 99) or 0.0
    rows = [["direct", f"{base50:.2f} / {base99:.2f}", "-", "-", "-", "-"]]
    for system in systems:
        assert system.proc is not None
        t50 = percentile(times[system.name], 50) or 0.0
        t99 = percentile(times[system.name], 99) or 0.0
        per_1000: list[float] = []
        for _ in range(1 if quick else 3):
            before = cpu_seconds(system.proc.pid)
            tokens = stream_load(system, 8, 300 if quick else 600)
            per_1000.append((cpu_seconds(system.proc.pid) - before) / tokens * 1000 * 1000)
        rows.append(
            [
                system.name,
                f"{t50:.2f} / {t99:.2f}",
                f"{t50 - base50:+.2f} / {t99 - base99:+.2f}",
                f"{min(per_1000):.1f} ms",
                f"{rss_mib(system.proc.pid):.0f} MiB",
                f"{system.startup_s:.2f} s",
            ]
        )
    table(
        report,
        f"Overhead (load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)",
        [
            "through",
            "time to first token p50 / p99 (ms)",
            "added p50 / p99 (ms)",
            "CPU per 1,000 streamed tokens",
            "RSS after the load",
            "start-up",
        ],
        rows,
    )


# -- 2. scale ------------------------------------------------------------------------------------

LOAD = Path(__file__).resolve().parent / "_stream_load.py"
#: Seconds a level's streams may take to have their first token, all of them.
START_BOUND = 60.0


@dataclass
class Level:
    """One system at one level of concurrent streams."""

    system: str
    streams: int
    started: int = 0
    ttft_p50: float | None = None
    tokens_per_s: float = 0.0
    cpu_ms_per_1000: float | None = None
    rss_mib: float | None = None
    threads: int | None = None
    busy_after: int = 0


def run_level(system: System, streams: int, window: float) -> Level:
    """``streams`` streams through ``system``; measured over ``window`` s once all started."""
    load = subprocess.Popen(
        [sys.executable, str(LOAD), system.base_url, str(streams), str(window), str(START_BOUND)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert load.stdout is not None
    level = Level(system.name, streams)
    try:
        first = json.loads(load.stdout.readline())
        cpu_before = None if system.proc is None else cpu_seconds(system.proc.pid)
        second = json.loads(load.stdout.readline())
        cpu_after = None if system.proc is None else cpu_seconds(system.proc.pid)
        level.started = first["started"]
        level.ttft_p50 = percentile(first["ttft_ms"], 50)
        level.tokens_per_s = second["tokens"] / second["seconds"]
        if system.proc is not None and cpu_before is not None and cpu_after is not None:
            level.cpu_ms_per_1000 = (
                (cpu_after - cpu_before) * 1000 / max(second["tokens"], 1) * 1000
            )
            level.rss_mib = rss_mib(system.proc.pid)
            level.threads = threads(system.proc.pid)
    finally:
        load.wait(60)
    return level


def sigterm_exit(upstream: str, work: Path, streams: int) -> tuple[int, float, int | None]:
    """(streams started, seconds from SIGTERM to exit, exit code) of a proxy serving ``streams``."""
    system = start_wirecut(upstream, work)
    assert system.proc is not None
    load = subprocess.Popen(
        [sys.executable, str(LOAD), system.base_url, str(streams), "60", str(START_BOUND)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert load.stdout is not None
    try:
        started = json.loads(load.stdout.readline())["started"]
        signalled = time.monotonic()
        system.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = system.proc.wait(60)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - signalled
    finally:
        load.kill()
        load.wait()
        system.stop()
    return started, took, code


#: Seconds after a level's clients left within which the upstream's slots must be free.
LEFT_BOUND = 60.0


def scale(
    report: Report,
    sim: Sim,
    start: Callable[[], list[System]],
    levels: list[int],
    window: float,
) -> list[dict[str, Any]]:
    """Every level through fresh systems (``start()``), direct beside them, in turns."""
    found: list[Level] = []
    for streams in levels:
        systems = start()
        try:
            order = [System("direct", sim.base_url), *systems]
            random.shuffle(order)
            for system in order:
                print(f"scale: {system.name} x {streams}", file=sys.stderr)
                level = run_level(system, streams, window)
                # A system that goes on decoding for clients that left is
                # stopped (its connections close) before the next one runs.
                level.busy_after = sim.busy_after(LEFT_BOUND)
                if level.busy_after:
                    system.stop()
                    sim.wait_idle(120)
                found.append(level)
        finally:
            for system in systems:
                system.stop()
    rows = []
    for level in found:
        base = next(x for x in found if x.system == "direct" and x.streams == level.streams)
        added = (
            None
            if level.ttft_p50 is None or base.ttft_p50 is None or level is base
            else level.ttft_p50 - base.ttft_p50
        )
        rows.append(
            {
                "system": level.system,
                "streams": level.streams,
                "started": level.started,
                "ttft_p50_ms": level.ttft_p50,
                "ttft_added_p50_ms": added,
                "tokens_per_s": round(level.tokens_per_s, 1),
                "vs_direct": round(level.tokens_per_s / base.tokens_per_s, 3)
                if base.tokens_per_s
                else None,
                "cpu_ms_per_1000_tokens": level.cpu_ms_per_1000,
                "rss_mib": level.rss_mib,
                "threads": level.threads,
                "slots_busy_after_left": level.busy_after,
            }
        )

    def fmt(value: float | None, spec: str, unit: str = "") -> str:
        return "-" if value is None else f"{value:{spec}}{unit}"

    table(
        report,
        f"Scale (load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)",
        [
            "through",
            "streams",
            "started",
            "time to first token p50",
            "added p50",
            "tokens/s",
            "vs direct",
            "CPU per 1,000 tokens",
            "RSS",
            "threads",
            f"slots decoding {LEFT_BOUND:.0f} s after the clients left",
        ],
        [
            [
                r["system"],
                str(r["streams"]),
                f"{r['started']}/{r['streams']}",
                fmt(r["ttft_p50_ms"], ".2f", " ms"),
                fmt(r["ttft_added_p50_ms"], "+.2f", " ms"),
                f"{r['tokens_per_s']:.0f}",
                fmt(r["vs_direct"], ".1%"),
                fmt(r["cpu_ms_per_1000_tokens"], ".1f", " ms"),
                fmt(r["rss_mib"], ".0f", " MiB"),
                fmt(r["threads"], "d"),
                str(r["slots_busy_after_left"]),
            ]
            for r in sorted(rows, key=lambda r: (r["streams"], r["system"] != "direct"))
        ],
    )
    return rows


# -- 3. streams cancelled at once ---------------------------------------------------------------


def burst(report: Report, sim: Sim, systems: list[System], streams: int, bursts: int) -> None:
    rows = []
    for system in [System("direct", sim.base_url), *systems]:
        print(f"burst: {system.name}", file=sys.stderr)
        latencies: list[float] = []
        never = 0
        streaming = 0
        still_busy = 0
        for _ in range(bursts):
            conns = [open_request(system, body(True, 100_000)) for _ in range(streams)]
            deadline = time.monotonic() + 30.0  # for the whole burst to be streaming
            for conn in conns:
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    read_until(conn, b'"content"')
                    streaming += 1
                except (TimeoutError, RuntimeError):
                    pass  # No first token by the deadline.
            since = sim.mark()
            cancelled_at = time.monotonic()
            for conn in conns:
                conn.close()
            deadline = time.monotonic() + 5.0
            closes: list[float] = []
            while time.monotonic() < deadline and len(closes) < streams:
                closes = [
                    float(e["detail"]["t_disconnect"])
                    for e in sim.events(since)
                    if e["kind"] == "peer_closed"
                ]
                time.sleep(0.1)
            latencies += [(t - cancelled_at) * 1000 for t in closes]
            never += streams - len(closes)
            still_busy += sim.busy_after(10.0)
            if still_busy:
                break  # Those decode on without a reader: the next burst would not fit.
        rows.append(
            [
                system.name,
                f"{streaming}/{streams * bursts}",
                f"{_ms(latencies, 50)} / {_ms(latencies, 99)} ms",
                str(never),
                str(still_busy),
            ]
        )
    table(
        report,
        f"{streams} streams cancelled at once (load average {os.getloadavg()[0]:.2f})",
        [
            "through",
            "streams that had a first token",
            "cancel -> upstream close p50 / p99",
            "closes never seen (5 s)",
            "upstream slots still decoding 10 s later",
        ],
        rows,
    )


# -- 4. the cut table --------------------------------------------------------------------------


@dataclass
class Cuts:
    trials: int = 0
    freed: int = 0
    reached: int = 0
    retried: int = 0
    freed_after: list[float] = field(default_factory=list)
    #: The routes the upstream was asked on (a gateway may translate the API).
    upstream_routes: set[str] = field(default_factory=set)


def _new_requests(sim: Sim, since: int) -> list[str]:
    return [e["request_id"] for e in sim.events(since) if e["kind"] == "request_received"]


def cut_running(
    sim: Sim, system: System, stream: bool, trials: int, *, prompt: bool, route: str = CHAT
) -> Cuts:
    """The client leaves while its request runs (decoding, or in the prompt phase)."""
    cuts = Cuts()
    for _ in range(trials):
        since = sim.mark()
        conn = open_request(system, body(stream, 150, route=route), route)
        kind = "slot_acquired" if prompt else "first_token"
        started = sim.wait_for(lambda e, kind=kind: e["kind"] == kind, since)
        if started is None:
            conn.close()
            continue
        request_id = started["request_id"]
        cuts.upstream_routes.update(
            e["detail"]["route"]
            for e in sim.events(since)
            if e["kind"] == "request_received" and e["request_id"] == request_id
        )
        left_at = time.monotonic()
        after = sim.mark()
        conn.close()
        cuts.trials += 1
        closed = sim.wait_for(
            lambda e, rid=request_id: e["kind"] == "peer_closed" and e["request_id"] == rid,
            since,
            bound=8.0 if prompt else 2.0,
        )
        if closed is not None:
            cuts.freed += 1
            cuts.freed_after.append(closed["t"] - left_at)
        time.sleep(1.0)  # Anything sent after the client left shows up here.
        cuts.retried += len([r for r in _new_requests(sim, after) if r != request_id])
        sim.wait_idle()
    return cuts


def cut_queued(sim: Sim, system: System, stream: bool, trials: int) -> Cuts:
    """The client leaves while its request waits behind another one (one slot)."""
    cuts = Cuts()
    for _ in range(trials):
        since = sim.mark()
        first = open_request(system, body(True, 100))
        running = sim.wait_for(lambda e: e["kind"] == "first_token", since)
        assert running is not None
        queued = open_request(system, body(stream, 100))
        if system.proc is not None and "wirecut" in system.name:
            health = system.base_url.removesuffix("/v1") + "/health"
            deadline = time.monotonic() + BOUND
            while (
                httpx.get(health).json()["requests"]["queued"] < 1 and time.monotonic() < deadline
            ):
                time.sleep(0.01)
        else:
            # LiteLLM sends it on: it is queued in the engine once the engine says so.
            sim.wait_for(lambda e: e["kind"] == "request_queued", since, bound=2.0)
        after = sim.mark()
        queued.close()
        time.sleep(0.3)  # The proxy's time to act on the close.
        first.close()
        cuts.trials += 1
        time.sleep(2.0)
        events = sim.events(since)
        started = {e["request_id"] for e in events if e["kind"] == "slot_acquired"}
        cuts.reached += len(started - {running["request_id"]})
        cuts.retried += len([r for r in _new_requests(sim, after) if r != running["request_id"]])
        sim.wait_idle()
    return cuts


# -- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials")
    parser.add_argument("--no-litellm", action="store_true", help="wirecut proxy and direct only")
    parser.add_argument("--litellm-venv", type=Path, default=Path("/tmp/litellm-venv"))
    parser.add_argument("--only", choices=["overhead", "scale", "burst", "cuts"], default=None)
    parser.add_argument(
        "--levels", default="1,64,256,1000", help="the scale's numbers of concurrent streams"
    )
    parser.add_argument("--window", type=float, default=10.0, help="seconds measured a level")
    parser.add_argument("--bursts", default="64,256", help="the burst's numbers of streams")
    parser.add_argument("--out", type=Path, help="write the tables as DIR/bench_proxy.json")
    args = parser.parse_args()
    program = None if args.no_litellm else ensure_litellm(args.litellm_venv)
    print(
        f"`uptime`: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}\n"
    )
    work = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    trials = 4 if args.quick else 10
    levels = [int(n) for n in args.levels.split(",")]
    report = Report(
        "bench_proxy",
        "wirecut proxy beside direct requests and LiteLLM",
        "Each system its own process in front of the same simulator (bench/bench_proxy.py).",
    )
    bursts = [int(n) for n in args.bursts.split(",")]

    def systems_for(upstream: str, *, both_litellm: bool = False) -> list[System]:
        found = [start_wirecut(upstream, work)]
        if program is not None:
            found.append(start_litellm(program, upstream, work, cancel_on_disconnect=False))
            if both_litellm:
                found.append(start_litellm(program, upstream, work, cancel_on_disconnect=True))
        return found

    if args.only in (None, "overhead", "scale", "burst"):
        # Fast for the overhead; 20 tokens/s for the scale and the burst, as
        # a team's streams come (and so that a thousand of them do not take
        # the simulator's log over).
        fast = Sim("--slots", "64", "--tokens-per-second", "500", "--prompt-ms", "0", "--endless")
        slots = str(max([*levels, *bursts]) + 16)
        slow = Sim("--slots", slots, "--tokens-per-second", "20", "--prompt-ms", "0", "--endless")
        systems: list[System] = []
        try:
            if args.only in (None, "overhead"):
                systems = systems_for(fast.base_url)
                overhead(report, fast, systems, args.quick)
                for system in systems:
                    system.stop()
                systems = []
            if args.only in (None, "scale"):
                report.data["scale"] = scale(
                    report, slow, lambda: systems_for(slow.base_url), levels, args.window
                )
                most = max(levels)
                started, took, code = sigterm_exit(slow.base_url, work, most)
                slow.wait_idle(120)
                report.data["sigterm"] = {"streams": started, "exit_s": took, "code": code}
                table(
                    report,
                    f"SIGTERM to wirecut proxy with {most} streams open",
                    ["streams that had a first token", "exited after", "exit code"],
                    [[f"{started}/{most}", f"{took:.2f} s", str(code)]],
                )
            if args.only in (None, "burst"):
                systems = systems_for(slow.base_url)
                for streams in bursts:
                    burst(report, slow, systems, streams, 1 if args.quick else 2)
        finally:
            for system in systems:
                system.stop()
            fast.stop()
            slow.stop()
    if args.only in (None, "cuts"):
        decode_sim = Sim(
            "--slots", "1", "--tokens-per-second", "50", "--prompt-ms", "5", "--endless"
        )
        prompt_sim = Sim(
            "--slots", "1", "--tokens-per-second", "50", "--prompt-ms", "5000", "--endless"
        )
        systems = []
        try:
            # The two simulators differ only in the prompt phase; each system
            # runs against the one whose behaviour a row needs.
            decode_systems = systems_for(decode_sim.base_url, both_litellm=True)
            prompt_systems = systems_for(prompt_sim.base_url, both_litellm=True)
            systems = decode_systems + prompt_systems
            sims = (decode_sim, prompt_sim)
            _cut_rows(report, decode_systems, prompt_systems, sims, trials)
            _route_cut_rows(report, decode_systems, prompt_systems, sims, trials)
        finally:
            for system in systems:
                system.stop()
            decode_sim.stop()
            prompt_sim.stop()
    if args.out:
        print(f"wrote {report.write(args.out)}", file=sys.stderr)


def _cut_rows(
    report: Report,
    decode_systems: list[System],
    prompt_systems: list[System],
    sims: tuple[Sim, Sim],
    trials: int,
) -> None:
    decode_sim, prompt_sim = sims
    rows = []
    for decode, prompt in zip(decode_systems, prompt_systems, strict=True):
        for stream in (True, False):
            c = cut_running(decode_sim, decode, stream, trials, prompt=False)
            mode = "stream" if stream else "non-stream"
            rows.append([decode.name, mode, f"{c.freed}/{c.trials}", "-", str(c.retried)])
        for stream in (True, False):
            c = cut_queued(decode_sim, decode, stream, max(2, trials // 2))
            mode = "queued, " + ("stream" if stream else "non-stream")
            rows.append([decode.name, mode, "-", f"{c.reached}/{c.trials}", str(c.retried)])
        for stream in (True, False):
            c = cut_running(prompt_sim, prompt, stream, max(2, trials // 3), prompt=True)
            after = percentile(c.freed_after, 50)
            when = "" if after is None else f" (at {after:.1f} s)"
            mode = "cut during a 5 s prompt phase, " + ("stream" if stream else "non-stream")
            rows.append([prompt.name, mode, f"{c.freed}/{c.trials}{when}", "-", str(c.retried)])
    table(
        report,
        f"The cut table, on the simulator (load average {os.getloadavg()[0]:.2f})",
        [
            "through",
            "mode",
            "slot freed after the client left",
            "dead queued client reached the engine",
            "requests retried after the client left",
        ],
        rows,
    )


def _route_cut_rows(
    report: Report,
    decode_systems: list[System],
    prompt_systems: list[System],
    sims: tuple[Sim, Sim],
    trials: int,
) -> None:
    """The cut in decoding and in the prompt phase for the Responses and Messages APIs.

    Direct requests beside the gateways: the simulator, like llama.cpp, frees
    the slot of a client that closed its connection, so direct is the
    reference a gateway should match.
    """
    decode_sim, prompt_sim = sims
    decode_systems = [System("direct", decode_sim.base_url), *decode_systems]
    prompt_systems = [System("direct", prompt_sim.base_url), *prompt_systems]
    rows = []
    for route in ROUTES:
        for decode, prompt in zip(decode_systems, prompt_systems, strict=True):
            for phase, sim, system, count in (
                ("decoding", decode_sim, decode, trials),
                ("5 s prompt phase", prompt_sim, prompt, max(2, trials // 3)),
            ):
                for stream in (True, False):
                    c = cut_running(
                        sim, system, stream, count, prompt=phase != "decoding", route=route
                    )
                    share = f"{c.freed / c.trials:.0%}" if c.trials else "-"
                    mode = f"{phase}, " + ("stream" if stream else "non-stream")
                    rows.append(
                        [
                            route,
                            system.name,
                            mode,
                            f"{c.freed}/{c.trials} ({share})",
                            ", ".join(sorted(c.upstream_routes)) or "-",
                            str(c.retried),
                        ]
                    )
    table(
        report,
        "The cut table of the Responses and Messages APIs, on the simulator "
        f"(load average {os.getloadavg()[0]:.2f})",
        [
            "route",
            "through",
            "client left during",
            "slot freed after the client left",
            "upstream asked on",
            "requests retried after the client left",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
