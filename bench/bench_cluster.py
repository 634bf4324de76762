"""Benchmark cancel on a Ray cluster: the cluster runner, the local runner, ``ray.cancel`` alone.

Run: ``python bench/bench_cluster.py [--samples 64]`` (needs the extra ``ray``
and the ``ray`` command). It starts a two-node Ray cluster on loopback
(``tests/_ray_cluster.py``: 127.0.0.2 and 127.0.0.3, 1 CPU each), and the
simulator as its own process (``wirecut provider``). For each system and
each concurrency it starts that many chat requests, waits until every one of
them is where the scenario wants it, cancels them all in one burst, and
measures:

- cancel -> complete: from the cancel to the system's answer (the console's
  ``complete`` frame; for ``ray.cancel``, the moment ``ray.get`` raises);
- cancel -> provider close: from the cancel to the simulator's
  ``t_disconnect`` (CLOCK_MONOTONIC, one clock for every process of the
  machine; the k-th cancel of a burst is paired with the k-th close). A close
  not seen within ``WINDOW`` seconds counts in "never";
- false cancelled: answers that said cancelled while the provider went on
  (its close never came within the window, or the facts said the worker or a
  request was still there).

The systems:

- ``local``: ``wirecut serve`` (the ``CommandRunner``: threads in the serve process);
- ``cluster``: ``wirecut serve --ray HEAD`` (the ``ClusterRunner``: command
  hosts on both nodes, cancel through their control group);
- ``ray.cancel actor``: a threaded actor on the second node streams with
  httpx; ``ray.cancel(ref)``, as one would with Ray alone;
- ``ray.cancel task``: the same in a plain task (``num_cpus=0``, one worker
  process each: not run at 64).

The rows of ``ray.cancel`` run after wirecut's: their requests run on
after the cancel and Ray starts worker processes for them, and a console
row measured right after one shared the machine with that work.

The scenarios: ``stream`` (tokens are flowing) and ``prefill`` (the request
waits for its first token, 8 s of simulated prompt: no byte arrives).
Prints a Markdown table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _console import ConsoleClient
from _procs import Process, percentile
from _ray_cluster import WORKER_IP, RayCluster
from wirecut.proof import SimProcess
from wirecut.simulator import SimConfig

CONCURRENCY = (1, 16, 64)
#: How long after a cancel a provider close still counts as seen, in seconds.
WINDOW = 5.0
#: The simulated prompt time of the prefill scenario: longer than ``WINDOW``.
PREFILL_MS = 8000
#: ``max_tokens`` of the baselines' requests: they end by themselves after ~3 s.
BASELINE_MAX_TOKENS = 150


class Sim:
    """The simulator as a process (``SimProcess``), and counts read from its event log."""

    def __init__(self, prompt_ms: int) -> None:
        config = SimConfig(slots=256, endless=True, tokens_per_second=50, prompt_ms=prompt_ms)
        self.process = SimProcess(config).start()
        self.prompt_s = prompt_ms / 1000
        self.base_url = self.process.base_url
        self.next_seq = self.process.next_seq

    def wait_count(self, kind: str, since: int, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while sum(1 for e in self.process.events(since) if e.kind == kind) < count:
            if time.monotonic() > deadline:
                kinds = [str(e.kind) for e in self.process.events(since)]
                raise TimeoutError(f"fewer than {count} {kind} events: {kinds}")
            time.sleep(0.02)

    def closes(self, since: int, count: int, after: float) -> list[float]:
        """``t_disconnect`` of the peer closes since ``since`` within ``WINDOW`` of ``after``.

        Waits until the ``count`` requests since ``since`` have ended: in its
        prompt the simulator logs a close only once the prompt time is over
        (with the time it happened), so a burst is read once all are done.
        """
        deadline = after + WINDOW + self.prompt_s + 5
        while True:
            events = self.process.events(since)
            ended = sum(1 for e in events if e.kind == "request_finished")
            if ended >= count or time.monotonic() > deadline:
                found = sorted(
                    float(e.detail["t_disconnect"])  # type: ignore[arg-type]
                    for e in events
                    if e.kind == "peer_closed"
                )
                return [t for t in found if t <= after + WINDOW][:count]
            time.sleep(0.05)

    def stop(self) -> None:
        self.process.stop()


Burst = dict[str, Any]


def console_burst(sim: Sim, client: ConsoleClient, n: int, rnd: int, scenario: str) -> Burst:
    since = sim.next_seq()
    ids = [client.run("chat tell me everything", id=f"b{rnd}-{k}") for k in range(n)]
    if scenario == "stream":
        for id in ids:
            client.wait_for(lambda f: f["type"] == "output", 30, id=id)
    else:
        sim.wait_count("slot_acquired", since, n)
    cancelled_at = {}
    for id in ids:
        cancelled_at[id] = time.monotonic()
        client.cancel(id)
    completes = client.completes(ids, 60)
    closes = sim.closes(since, n, max(cancelled_at.values()))
    false = sum(
        1
        for c in completes.values()
        if c["status"] == "cancelled"
        and not (c["lifecycle"]["worker_exited"] is True and c["lifecycle"]["open_requests"] == 0)
    ) + min(n - len(closes), sum(1 for c in completes.values() if c["status"] == "cancelled"))
    return {
        "to_complete": [(completes[id]["_received"] - cancelled_at[id]) * 1000 for id in ids],
        "to_close": [(t - cancelled_at[id]) * 1000 for t, id in zip(closes, ids, strict=False)],
        "never": n - len(closes),
        "false": false,
    }


def run_console(
    sim: Sim, scenario: str, n: int, samples: int, extra: list[str]
) -> dict[str, list[Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        console = Process(
            "serve",
            "--port",
            "0",
            "--workers",
            str(n),
            "--data-dir",
            tmp,
            "--provider-url",
            sim.base_url,
            *extra,
        )
        ws_url = console.url.replace("http://", "ws://").replace("/?token=", "/api/console?token=")
        try:
            with ConsoleClient(ws_url) as client:
                # Warm up: n commands running at once, started one by one, so
                # that every worker thread (and every command host) exists.
                warm = [client.run("sleep 60", id=f"warm-{k}") for k in range(n)]
                for id in warm:
                    client.wait_for(lambda f: f["type"] == "started", 120, id=id)
                client.cancel()
                for id in warm:
                    client.complete(id, 60)
                return collect(
                    lambda rnd: console_burst(sim, client, n, rnd, scenario),
                    bursts(scenario, n, samples),
                )
        finally:
            console.stop()


def bursts(scenario: str, n: int, samples: int) -> int:
    """How many bursts make ``samples`` cancels (fewer in prefill: each waits out the prompt)."""
    if scenario == "prefill":
        return 4 if n == 1 else 2
    return max(2, samples // n)


def collect(burst: Callable[[int], Burst], count: int) -> dict[str, list[Any]]:
    totals: dict[str, list[Any]] = {"to_complete": [], "to_close": [], "never": [], "false": []}
    for rnd in range(count):
        result = burst(rnd)
        for key in ("to_complete", "to_close"):
            totals[key] += result[key]
        totals["never"].append(result["never"])
        totals["false"].append(result["false"])
    return totals


# -- ray.cancel alone --------------------------------------------------------------------------


def naive_chat(base_url: str) -> int:
    """What one would run on Ray without wirecut: stream a chat with httpx, count the chunks."""
    body = {
        "messages": [{"role": "user", "content": "tell me everything"}],
        "stream": True,
        "max_tokens": BASELINE_MAX_TOKENS,
    }
    chunks = 0
    with httpx.stream("POST", f"{base_url}/chat/completions", json=body, timeout=60) as response:
        for _ in response.iter_lines():
            chunks += 1
    return chunks


class NaiveHost:
    def chat(self, base_url: str) -> int:
        return naive_chat(base_url)


def ray_burst(sim: Sim, submit: Callable[[], Any], n: int, scenario: str) -> Burst:
    import ray
    from ray.exceptions import TaskCancelledError

    since = sim.next_seq()
    refs = [submit() for _ in range(n)]
    sim.wait_count("first_token" if scenario == "stream" else "slot_acquired", since, n)
    done_at: dict[int, float] = {}
    for i, ref in enumerate(refs):
        ref.future().add_done_callback(lambda _, i=i: done_at.setdefault(i, time.monotonic()))
    cancelled_at = []
    for ref in refs:
        cancelled_at.append(time.monotonic())
        ray.cancel(ref)
    closes = sim.closes(since, n, cancelled_at[-1])
    # Let every request end before the next burst (they run to max_tokens otherwise).
    ray.wait(refs, num_returns=n, timeout=30)
    said_cancelled = 0
    for ref in refs:
        try:
            ray.get(ref, timeout=0)
        except TaskCancelledError:
            said_cancelled += 1
        except Exception:
            pass  # A KeyboardInterrupt turned into another error, or no answer: not "cancelled".
    return {
        "to_complete": [(done_at[i] - cancelled_at[i]) * 1000 for i in sorted(done_at)],
        "to_close": [(t - c) * 1000 for t, c in zip(closes, cancelled_at, strict=False)],
        "never": n - len(closes),
        "false": min(said_cancelled, n - len(closes)),
    }


def run_ray(sim: Sim, kind: str, scenario: str, n: int, samples: int, second: str) -> Any:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    strategy = NodeAffinitySchedulingStrategy(second, soft=False)
    if kind == "actor":
        actor = (
            ray.remote(NaiveHost)
            .options(num_cpus=0, max_concurrency=max(n, 1), scheduling_strategy=strategy)
            .remote()
        )

        def submit() -> Any:
            return actor.chat.remote(sim.base_url)
    else:
        task = ray.remote(naive_chat).options(num_cpus=0, scheduling_strategy=strategy)

        def submit() -> Any:
            return task.remote(sim.base_url)

    # Its requests are not cut, so each burst waits for them to end: a few bursts are enough.
    count = min(8, bursts(scenario, n, samples))
    try:
        return collect(lambda rnd: ray_burst(sim, submit, n, scenario), count)
    finally:
        if kind == "actor":
            ray.kill(actor)


# -- the table ---------------------------------------------------------------------------------


def row(system: str, scenario: str, n: int, totals: dict[str, list[Any]]) -> dict[str, Any]:
    def ms(value: float | None) -> float | None:
        return None if value is None else round(value, 2)

    return {
        "system": system,
        "scenario": scenario,
        "concurrency": n,
        "trials": len(totals["never"]) * n,
        "complete_p50": ms(
            statistics.median(totals["to_complete"]) if totals["to_complete"] else None
        ),
        "complete_p99": ms(percentile(totals["to_complete"], 99)),
        "complete_never": len(totals["never"]) * n - len(totals["to_complete"]),
        "close_p50": ms(statistics.median(totals["to_close"]) if totals["to_close"] else None),
        "close_p99": ms(percentile(totals["to_close"], 99)),
        "close_never": sum(totals["never"]),
        "false_cancelled": sum(totals["false"]),
    }


def run(
    samples: int, systems: list[str], scenarios: list[str], sizes: tuple[int, ...]
) -> list[dict[str, Any]]:
    import ray

    rows = []
    cluster = RayCluster().start()
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.ERROR)
        second = next(n["NodeID"] for n in ray.nodes() if n["NodeManagerAddress"] == WORKER_IP)
        for scenario, prompt_ms in (("stream", 5), ("prefill", PREFILL_MS)):
            if scenario not in scenarios:
                continue
            sim = Sim(prompt_ms)
            cells = [
                (n, system)
                for n in (sizes if scenario == "stream" else [n for n in sizes if n <= 16])
                for system in systems
                if not (system == "ray.cancel task" and n > 16)
            ]
            measured: dict[tuple[int, str], dict[str, Any]] = {}
            try:
                # wirecut's rows first: ``ray.cancel`` leaves work behind (its
                # requests run to their end, Ray starts worker processes), and
                # a console row right after one shared the machine with that.
                for n, system in sorted(cells, key=lambda cell: cell[1].startswith("ray.")):
                    print(f"{scenario} {system} x{n} ...", file=sys.stderr, flush=True)
                    if system == "local":
                        totals = run_console(sim, scenario, n, samples, [])
                    elif system == "cluster":
                        extra = ["--ray", cluster.address]
                        totals = run_console(sim, scenario, n, samples, extra)
                    else:
                        kind = system.split()[-1]
                        totals = run_ray(sim, kind, scenario, n, samples, second)
                    measured[n, system] = row(system, scenario, n, totals)
            finally:
                sim.stop()
            rows += [measured[cell] for cell in cells if cell in measured]
    finally:
        ray.shutdown()
        cluster.stop()
    return rows


def fmt(value: float | None, never: int) -> str:
    if value is None:
        return "never"
    return f"{value:.1f} ms" + (f" ({never} never)" if never else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=64, help="cancels per concurrency")
    parser.add_argument(
        "--systems",
        default="local,cluster,ray.cancel actor,ray.cancel task",
        help="comma-separated: local, cluster, ray.cancel actor, ray.cancel task",
    )
    parser.add_argument("--scenarios", default="stream,prefill", help="stream, prefill")
    parser.add_argument("--concurrency", default="1,16,64", help="commands at once")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args()
    rows = run(
        args.samples,
        [s.strip() for s in args.systems.split(",")],
        [s.strip() for s in args.scenarios.split(",")],
        tuple(int(n) for n in args.concurrency.split(",")),
    )
    print(
        "| scenario | system | at once | trials | cancel -> complete p50 | p99 "
        "| cancel -> provider close p50 | p99 | close never seen | false cancelled |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['scenario']} | {r['system']} | {r['concurrency']} | {r['trials']} "
            f"| {fmt(r['complete_p50'], r['complete_never'])} | {fmt(r['complete_p99'], 0)} "
            f"| {fmt(r['close_p50'], 0)} | {fmt(r['close_p99'], 0)} "
            f"| {r['close_never']} | {r['false_cancelled']} |"
        )
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
