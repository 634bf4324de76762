"""``/metrics``: the proxy's Prometheus metrics (prometheus_client, a registry per proxy).

Counters and histograms are fed as each request ends (``observe``); the
gauges (in flight, queued, the upstream's slots) are read at scrape time, so
they are never stale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from wirecut.proxy._record import ProxyRecord
from wirecut.serving import ConnectionGuard, Dropped

__all__ = ["CONTENT_TYPE", "ProxyMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Milliseconds: a cut lands in well under one; a queue wait may take minutes.
_MS_BUCKETS = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 60000)


class ProxyMetrics:
    """The metrics of one proxy; ``gauges`` reads (in flight, queued, slots) at scrape time.

    ``records`` reads the record log's (pending, dropped) lines at scrape time.
    """

    def __init__(
        self,
        gauges: Callable[[], tuple[int, int, int | None]],
        records: Callable[[], tuple[int, int]] = lambda: (0, 0),
        guard: Callable[[], ConnectionGuard | None] = lambda: None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "wirecut_proxy_requests",
            "Proxied requests finished, by status and reason.",
            ["status", "reason"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "wirecut_proxy_rejected",
            "Requests answered by the proxy itself without a record (bad input, auth, Host).",
            ["why"],
            registry=self.registry,
        )
        self.upstream_requests = Counter(
            "wirecut_proxy_upstream_requests",
            "Requests sent to the upstream (a connect retry that never sent counts no request).",
            registry=self.registry,
        )
        self.completion_tokens = Counter(
            "wirecut_proxy_completion_tokens",
            "Completion tokens relayed (reported by the upstream, else counted from the deltas).",
            registry=self.registry,
        )
        self.cancel_to_upstream_close = Histogram(
            "wirecut_proxy_cancel_to_upstream_close_ms",
            "From the cut of a request to the shutdown of its upstream socket (ms).",
            buckets=_MS_BUCKETS,
            registry=self.registry,
        )
        self.queued = Histogram(
            "wirecut_proxy_queued_ms",
            "Time a request waited in the proxy's queue for an upstream slot (ms).",
            buckets=_MS_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Gauges(gauges, records, guard))

    def observe(self, record: ProxyRecord) -> None:
        self.requests.labels(str(record.status), str(record.reason or "none")).inc()
        self.upstream_requests.inc(record.usage.requests or 0)
        if record.usage.completion_tokens is not None:
            self.completion_tokens.inc(record.usage.completion_tokens)
        self.queued.observe(record.queued_ms)
        if record.cancel_to_upstream_close_ms is not None:
            self.cancel_to_upstream_close.observe(record.cancel_to_upstream_close_ms)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Gauges(Collector):
    def __init__(
        self,
        read: Callable[[], tuple[int, int, int | None]],
        records: Callable[[], tuple[int, int]],
        guard: Callable[[], ConnectionGuard | None],
    ) -> None:
        self._read = read
        self._records = records
        self._guard = guard

    def collect(self) -> Iterable[Metric]:
        in_flight, queued, slots = self._read()
        yield GaugeMetricFamily(
            "wirecut_proxy_in_flight", "Requests at the upstream now.", value=in_flight
        )
        yield GaugeMetricFamily(
            "wirecut_proxy_queued", "Requests waiting in the proxy's queue now.", value=queued
        )
        yield GaugeMetricFamily(
            "wirecut_proxy_upstream_slots",
            "Requests the proxy lets in flight at once (-1: unlimited).",
            value=-1 if slots is None else slots,
        )
        pending, dropped = self._records()
        yield GaugeMetricFamily(
            "wirecut_proxy_records_pending",
            "Records waiting for a write to proxy.jsonl that can succeed (a full disk).",
            value=pending,
        )
        yield CounterMetricFamily(
            "wirecut_proxy_records_dropped",
            "Records that could neither be written nor kept for a later write.",
            value=dropped,
        )
        guard = self._guard()
        if guard is not None:
            yield GaugeMetricFamily(
                "wirecut_connections_open", "Open client connections.", value=guard.open
            )
            ended = CounterMetricFamily(
                "wirecut_connections_dropped",
                "Client connections the proxy ended for a limit, by why.",
                labels=["why"],
            )
            for why in Dropped:
                ended.add_metric([why.value], guard.dropped[why])
            yield ended
