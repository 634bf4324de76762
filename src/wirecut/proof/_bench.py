"""``wirecut bench``: cancellation, measured, for wirecut and what hosts do today.

Systems (``SYSTEMS``):

- ``wirecut``: commands over a real console server's WebSocket, the
  console in a process of its own (``_console_process``); one ``cancel``
  frame (no id) cancels them all;
- ``naive``: ``loop.run_in_executor`` and cancel the waiter (``_naive``);
- ``anyio-abandon``: ``anyio.to_thread.run_sync(abandon_on_cancel=True)``;
- ``openai-close``: the official ``openai`` SDK, and ``client.close()`` from
  the host before cancelling the waiter.

Scenarios (``SCENARIOS``): ``stream`` (a streamed chat; the console's
``chat``), ``non-stream`` (a real non-streaming request; for wirecut a
bench-only console command through the console's scoped ``ChatClient`` with
``wire_stream=False``), ``curator`` (``curator run --consolidate --yes`` over
seeded notes; the baselines' naive curator streams the same kind of plan
request with a plain client).

A *batch* starts ``concurrency`` commands on the simulator (``slots=64``,
``--endless``), waits until every request is decoding, cancels them all at
one instant, and reads: cancel -> the host's ``complete`` per command; cancel
-> the simulator's server saw the peer close (``t_disconnect``, watched for
``window`` seconds; "never" past it); slot-seconds held after the cancel
(until freed, or the window's end: a lower bound for what never closed);
workers still running at the window's end ("leaked"). Each baseline batch
gets a fresh simulator with the same settings, stopped after the window so
that its leftovers (which the host cannot stop) end and hold no slot of the
next batch. wirecut's batches of a cell share one simulator and console.

Also measured on wirecut's console: throughput of ``sleep 0`` (commands per
second) and resident memory per command in flight.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wirecut import __version__
from wirecut.client import ConsoleClient
from wirecut.proof._console_process import (
    MAX_TOKENS,
    NON_STREAM_COMMAND,
    ConsoleProcess,
    bench_commands,
)
from wirecut.proof._naive import AnyioHost, BaselineJob, ExecutorHost, openai_job, plain_job
from wirecut.proof._seed import seed_notes
from wirecut.proof._sim_process import SimProcess
from wirecut.proof._sim_watch import ProviderSide, provider_side, wait_decoding
from wirecut.simulator import SimConfig

__all__ = [
    "CONCURRENCY",
    "SCENARIOS",
    "SYSTEMS",
    "BenchReport",
    "BenchSettings",
    "Row",
    "bench_commands",
    "plan",
    "run_bench",
]

SYSTEMS = ("wirecut", "naive", "anyio-abandon", "openai-close")
SCENARIOS = ("stream", "non-stream", "curator")
CONCURRENCY = (1, 16, 64)
#: How long all commands of a batch may take to reach their first token, for
#: one command on an idle machine (``bound`` scales it with the batch and the load).
START_BOUND = 30.0
#: How long wirecut's complete frames may take (the console's unwind bound, and
#: a margin), scaled the same way.
COMPLETE_BOUND = 15.0
#: Seconds a bound grows by for each command of the batch.
PER_COMMAND = 0.25


def bound(base: float, commands: int, load: float | None = None) -> float:
    """``base`` seconds, more for each of ``commands`` at once and for a busy machine.

    ``load`` is the run queue per CPU (default: the 1-minute load average
    over the CPUs); above 1 the bound grows in proportion: a batch of 64 on
    a machine that other work keeps busy takes longer to start and to unwind,
    and that is no failure of what is measured.
    """
    if load is None:
        try:
            load = os.getloadavg()[0] / (os.cpu_count() or 1)
        except OSError:  # no load average on this platform
            load = 1.0
    return (base + PER_COMMAND * commands) * max(1.0, load)


@dataclass(frozen=True)
class BenchSettings:
    """What one bench run measures, and how hard."""

    concurrency: tuple[int, ...] = CONCURRENCY
    systems: tuple[str, ...] = SYSTEMS
    scenarios: tuple[str, ...] = SCENARIOS
    #: Seconds the provider's side is watched after a cancel.
    window: float = 1.0
    #: Batches per cell: wirecut's, by concurrency (at least one), and the baselines'.
    wirecut_repeats: tuple[tuple[int, int], ...] = ((1, 20), (16, 4), (64, 2))
    baseline_repeats: tuple[tuple[int, int], ...] = ((1, 3),)
    #: ``sleep 0`` commands for the throughput figure.
    throughput_commands: int = 1000
    sim: SimConfig = field(
        default_factory=lambda: SimConfig(
            slots=64, endless=True, tokens_per_second=20, prompt_ms=50
        )
    )

    @classmethod
    def quick(cls, **overrides: Any) -> BenchSettings:
        """``--quick``: one batch a cell (five for one command), a 0.5 s window."""
        base: dict[str, Any] = {
            "window": 0.5,
            "wirecut_repeats": ((1, 5),),
            "baseline_repeats": (),
            "throughput_commands": 200,
        }
        base.update(overrides)
        return cls(**base)

    def repeats(self, system: str, concurrency: int) -> int:
        table = dict(self.wirecut_repeats if system == "wirecut" else self.baseline_repeats)
        return max(1, table.get(concurrency, 1))

    def to_json(self) -> dict[str, Any]:
        return {
            "window_s": self.window,
            "simulator": {
                "slots": self.sim.slots,
                "tokens_per_second": self.sim.tokens_per_second,
                "prompt_ms": self.sim.prompt_ms,
                "endless": self.sim.endless,
            },
            "max_tokens": MAX_TOKENS,
        }


def _percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 < q <= 1), or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class Row:
    """One system x scenario x concurrency: docs/protocol.md's ``rows`` entry."""

    system: str
    scenario: str
    concurrency: int
    complete_ms: list[float] = field(default_factory=list)
    close_ms: list[float] = field(default_factory=list)
    trials: int = 0
    never: int = 0
    slot_seconds: float = 0.0
    leaked: int = 0

    def add(self, batch: _Batch) -> None:
        self.trials += len(batch.sides)
        self.complete_ms += [(t - batch.cancelled_at) * 1000 for t in batch.completed_at]
        end = batch.cancelled_at + batch.window
        for side in batch.sides:
            if side.close_ms is None:
                self.never += 1
            else:
                self.close_ms.append(side.close_ms)
            held_until = side.freed_at if side.freed_at is not None else end
            self.slot_seconds += max(0.0, held_until - batch.cancelled_at)
        self.leaked += batch.leaked

    def to_json(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "scenario": self.scenario,
            "concurrency": self.concurrency,
            "trials": self.trials,
            "cancel_to_complete_ms": {
                "p50": _round(_percentile(self.complete_ms, 0.5)),
                "p99": _round(_percentile(self.complete_ms, 0.99)),
            },
            "cancel_to_provider_close_ms": {
                "p50": _round(_percentile(self.close_ms, 0.5)),
                "p99": _round(_percentile(self.close_ms, 0.99)),
                "never": self.never,
            },
            "slot_seconds_after_cancel": round(self.slot_seconds, 3),
            "leaked": self.leaked,
        }


@dataclass
class BenchReport:
    """A bench run: its rows, the console's own figures, and where it ran."""

    settings: BenchSettings
    rows: list[Row] = field(default_factory=list)
    console: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "machine": _machine(),
            "rows": [row.to_json() for row in self.rows],
            "console": self.console,
            "settings": self.settings.to_json(),
            "seconds": round(self.seconds, 1),
        }


def _machine() -> dict[str, Any]:
    """Where a run happened: CPUs, Python, platform, the commit of this wirecut, the date.

    ``commit`` is the short hash of the git checkout this ``wirecut`` package
    was imported from (an editable install), or None when it was not imported
    from one: a package installed into some other project's tree would
    otherwise report that project's commit. ``date`` is today's (UTC).
    """
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": _commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
    }


def _commit() -> str | None:
    package = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(package), *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()

    try:
        top = Path(git("rev-parse", "--show-toplevel")).resolve()
        if top / "src" / "wirecut" != package:
            return None
        return git("rev-parse", "--short", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None


@dataclass
class _Batch:
    cancelled_at: float
    window: float
    completed_at: list[float]
    sides: list[ProviderSide]
    leaked: int


# -- wirecut, through the console -------------------------------------------------------


def _line(scenario: str, index: int) -> str:
    if scenario == "stream":
        return f"chat Tell me a long story about lighthouse number {index}."
    if scenario == "non-stream":
        return f"{NON_STREAM_COMMAND} Tell me a long story about lighthouse number {index}."
    return "curator run --consolidate --yes"


def _received_since(sim: SimProcess, since: int) -> list[str]:
    return [
        ev.request_id
        for ev in sim.events(since)
        if ev.kind == "request_received" and ev.request_id is not None
    ]


def _wirecut_batch(url: str, sim: SimProcess, scenario: str, n: int, window: float) -> _Batch:
    with ConsoleClient(url) as client:
        since = sim.next_seq()
        ids = {client.run(_line(scenario, i)) for i in range(n)}
        wait_decoding(sim, n, since, bound(START_BOUND, n))
        cancelled_at = client.cancel()
        done = client.completes(ids, bound(COMPLETE_BOUND, n))
        sides = provider_side(sim, _received_since(sim, since), since, cancelled_at, window)
    leaked = (
        n - len(done) + sum(1 for r in done.values() if r.facts.lifecycle.worker_exited is not True)
    )
    return _Batch(cancelled_at, window, [r.at for r in done.values()], sides, leaked)


# -- the baselines --------------------------------------------------------------------------


def _baseline_jobs(
    system: str, scenario: str, n: int, base_url: str, model: str, data_dir: Path
) -> list[BaselineJob]:
    if system == "openai-close":
        return [
            openai_job(base_url, scenario, model=model, max_tokens=MAX_TOKENS, data_dir=data_dir)
            for _ in range(n)
        ]
    return [
        plain_job(base_url, scenario, model=model, max_tokens=MAX_TOKENS, data_dir=data_dir)
        for _ in range(n)
    ]


def _baseline_batch(
    system: str, settings: BenchSettings, scenario: str, n: int, data_dir: Path
) -> _Batch:
    sim = SimProcess(settings.sim)
    sim.start()
    host: ExecutorHost | AnyioHost
    if system == "anyio-abandon":
        host = AnyioHost(n)
    else:
        host = ExecutorHost(n, close_clients=system == "openai-close")
    jobs = _baseline_jobs(system, scenario, n, sim.base_url, settings.sim.model, data_dir)
    try:
        since = sim.next_seq()
        host.start(jobs)
        wait_decoding(sim, n, since, bound(START_BOUND, n))
        cancelled_at = host.cancel_all()
        deadline = time.monotonic() + bound(COMPLETE_BOUND, n)
        for job in jobs:
            job.completed.wait(max(0.0, deadline - time.monotonic()))
        sides = provider_side(
            sim, _received_since(sim, since), since, cancelled_at, window=settings.window
        )
        # Still running when the window closed: what the host left behind.
        leaked = sum(1 for job in jobs if not job.work.exited.is_set())
        completed = [job.completed_at for job in jobs if job.completed_at is not None]
        return _Batch(cancelled_at, settings.window, completed, sides, leaked)
    finally:
        # The cleanup, not measured: stopping the simulator ends every stream it
        # serves, so the abandoned workers return; then the host lets go.
        sim.stop()
        deadline = time.monotonic() + 10
        for job in jobs:
            job.work.exited.wait(max(0.0, deadline - time.monotonic()))
        host.close()


# -- the console's own figures ------------------------------------------------------------


def _throughput(url: str, count: int) -> float:
    """``sleep 0`` commands per second through the console, over four connections."""
    connections = 4
    per = max(1, count // connections)
    clients = [ConsoleClient(url) for _ in range(connections)]
    try:
        started = time.monotonic()
        ids = [{client.run("sleep 0") for _ in range(per)} for client in clients]
        finished = started
        limit = bound(60.0, 0)
        for client, mine in zip(clients, ids, strict=True):
            done = client.completes(mine, limit)
            if len(done) != len(mine):
                raise TimeoutError(
                    f"only {len(done)} of {len(mine)} `sleep 0` completed in {limit:.0f} s"
                )
            finished = max([finished, *(r.at for r in done.values())])
        return per * connections / max(finished - started, 1e-9)
    finally:
        for client in clients:
            client.close()


def _memory_per_command(console: ConsoleProcess, n: int) -> tuple[float | None, float]:
    """Per command in flight (``sleep 60``): KiB of resident memory, and of Python heap.

    Resident memory is the whole console process's (``/proc/PID/statm``; None
    where there is none): thread stacks and all. Run first, before other work
    has left freed memory for the commands to reuse. The Python heap part is
    what ``tracemalloc`` sees allocated while the commands are in flight.
    """
    with ConsoleClient(console.ws_url) as client:
        before, _ = console.memory()
        console.trace()
        ids = {client.run("sleep 60") for _ in range(n)}
        deadline = time.monotonic() + bound(START_BOUND, n)
        for id in ids:
            client.wait_for(_started, max(0.0, deadline - time.monotonic()), id=id)
        after, heap = console.memory()
        assert heap is not None  # traced since trace()
        client.cancel()
        client.completes(ids, bound(COMPLETE_BOUND, n))
    resident = None if before is None or after is None else max(0.0, (after - before) / n / 1024)
    return resident, max(0.0, heap / n / 1024)


def _started(frame: dict[str, Any]) -> bool:
    return bool(frame["type"] == "started")


# -- the run ----------------------------------------------------------------------------------


def plan(settings: BenchSettings) -> list[tuple[str, str, int, int]]:
    """Every (system, scenario, concurrency, batches) the run will measure, in order."""
    return [
        (system, scenario, n, settings.repeats(system, n))
        for scenario in settings.scenarios
        for n in settings.concurrency
        for system in settings.systems
    ]


def run_bench(
    settings: BenchSettings,
    *,
    on_batch: Callable[[str], None] = lambda label: None,
) -> BenchReport:
    """Measure every cell of ``settings``; ``on_batch`` gets a label before each batch.

    Runs in the calling thread; starts and stops every simulator, console and
    host it uses. Raises TimeoutError when a batch does not start within its
    bound (``bound``: it grows with the batch and the machine's load),
    RuntimeError when a simulator or console cannot start, and
    ``httpx.HTTPError`` or ``wirecut.client.LinkError`` when one stops
    answering; each with a one-line message.

    Cancellation: on an exception or a Ctrl+C, the batch under way stops its
    simulator (ending the streams its leftovers block on) and its host, and
    the console stops with its commands cancelled.
    """
    began = time.monotonic()
    report = BenchReport(settings)
    workers = max(settings.concurrency)
    with tempfile.TemporaryDirectory(prefix="wirecut-bench-") as tmp:
        data_dir = Path(tmp)
        seed_notes(data_dir)
        on_batch("console: memory per command, `sleep 0` throughput")
        with (
            SimProcess(settings.sim) as sim,
            ConsoleProcess(sim.base_url, data_dir, workers) as console,
        ):
            url = console.ws_url
            # First, while the process is fresh (see _memory_per_command).
            resident, heap = _memory_per_command(console, workers)
            report.console = {
                "sleep0_commands_per_second": round(
                    _throughput(url, settings.throughput_commands), 1
                ),
                "memory_per_command_kib": _round(resident, 1),
                "python_heap_per_command_kib": round(heap, 1),
                "workers": workers,
            }
        for system, scenario, n, batches in plan(settings):
            row = Row(system, scenario, n)
            if system == "wirecut":
                with (
                    SimProcess(settings.sim) as sim,
                    ConsoleProcess(sim.base_url, data_dir, workers) as console,
                ):
                    for i in range(batches):
                        on_batch(f"{system} {scenario} x{n} ({i + 1}/{batches})")
                        row.add(_wirecut_batch(console.ws_url, sim, scenario, n, settings.window))
            else:
                for i in range(batches):
                    on_batch(f"{system} {scenario} x{n} ({i + 1}/{batches})")
                    row.add(_baseline_batch(system, settings, scenario, n, data_dir))
            report.rows.append(row)
    report.seconds = time.monotonic() - began
    return report
