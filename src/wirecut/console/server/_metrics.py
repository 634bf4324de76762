"""``/metrics``: the console's Prometheus metrics (prometheus_client, a registry per server).

Counters and histograms are fed by the runner (``RunnerObserver``); the gauges
(busy, queued and leaked workers, open requests and processes) are read from
the runner's health at scrape time, so they are never stale.
"""

from __future__ import annotations

import gc
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from wirecut.console.runner import Runner
from wirecut.console.server._slot_watch import SlotWatch
from wirecut.record import CompleteFacts

__all__ = ["CONTENT_TYPE", "ConsoleMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Milliseconds: a cut should land in well under one; a leak shows as the bound.
_MS_BUCKETS = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)


class ConsoleMetrics:
    """The metrics of one console server; an observer of its runner."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.commands = Counter(
            "wirecut_commands",
            "Commands completed, by status and reason.",
            ["status", "reason"],
            registry=self.registry,
        )
        self.cancel_to_complete = Histogram(
            "wirecut_cancel_to_complete_ms",
            "From the cancel to the complete frame of a cancelled or timed-out command (ms).",
            buckets=_MS_BUCKETS,
            registry=self.registry,
        )
        self.cancel_to_provider_close = Histogram(
            "wirecut_cancel_to_provider_close_ms",
            "From the cancel to the shutdown of the command's provider sockets (ms).",
            buckets=_MS_BUCKETS,
            registry=self.registry,
        )
        self.leaked_total = Counter(
            "wirecut_workers_leaked",
            "Commands whose worker was still running at the unwind bound.",
            registry=self.registry,
        )
        self.dropped = Counter(
            "wirecut_output_dropped_characters",
            "Output a worker wrote after its command's complete (dropped, never sent).",
            registry=self.registry,
        )
        self._runner: Runner | None = None
        #: Watches the provider's slots after a cut, when set (``build_state``).
        self.slot_watch: SlotWatch | None = None
        self.registry.register(_HealthCollector(self))

    def attach(self, runner: Runner) -> None:
        self._runner = runner

    # -- RunnerObserver -------------------------------------------------------------

    def completed(self, facts: CompleteFacts, cancel_to_complete_ms: float | None) -> None:
        self.commands.labels(str(facts.status), facts.reason or "none").inc()
        lifecycle = facts.lifecycle
        if cancel_to_complete_ms is not None:
            self.cancel_to_complete.observe(max(0.0, cancel_to_complete_ms))
        shut = lifecycle.step_ms("sockets_shut")
        if shut is not None:
            self.cancel_to_provider_close.observe(shut)
        if lifecycle.worker_exited is False:
            self.leaked_total.inc()
        if self.slot_watch is not None:
            self.slot_watch.completed(facts, cancel_to_complete_ms)

    def output_dropped(self, characters: int) -> None:
        self.dropped.inc(characters)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def health(self) -> dict[str, Any] | None:
        return None if self._runner is None else self._runner.health()


class _HealthCollector(Collector):
    def __init__(self, metrics: ConsoleMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Any:
        yield GaugeMetricFamily(
            "wirecut_gc_frozen_objects",
            "Objects this process froze at startup (gc.freeze): full collections skip them.",
            value=gc.get_freeze_count(),
        )
        health = self._metrics.health()
        if health is None:
            return
        workers = health["workers"]
        for key, help in (
            ("max", "Worker threads the console keeps for commands."),
            ("busy", "Worker threads running a command (leaked ones included)."),
            ("queued", "Commands waiting for a worker."),
            ("leaked", "Workers past the unwind bound that have not exited."),
        ):
            yield GaugeMetricFamily(f"wirecut_workers_{key}", help, value=workers[key])
        yield GaugeMetricFamily(
            "wirecut_open_requests",
            "Provider requests (sockets) owned by commands.",
            value=health["requests"]["open"],
        )
        yield GaugeMetricFamily(
            "wirecut_open_processes",
            "Processes owned by commands.",
            value=health["processes"]["open"],
        )
