"""``/metrics``: the proxy's Prometheus metrics (prometheus_client, a registry per proxy).

Counters and histograms are fed as each request's record is written
(``observe``); the gauges (in flight, queued, the upstreams' slots) are read
at scrape time, so they are never stale. Per upstream and client key
(labels ``upstream``, its URL, and ``key``, the key's name, empty without
named keys): requests by outcome (``status``, ``reason``; the reason is
empty for a request that finished by itself: nobody ended it), tokens by
kind and by how they were counted, the time from a client leaving to the
upstream socket's shutdown, and requests sent upstream after their client
had left (which the cut should keep at 0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from wirecut.proxy._record import ProxyRecord, RecordReason
from wirecut.serving import ConnectionGuard, connection_families

#: (upstream URL, in flight, queued, slots or None) of each upstream, read at scrape time.
UpstreamGauges = Callable[[], list[tuple[str, int, int, int | None]]]

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
        upstreams: UpstreamGauges = lambda: [],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "wirecut_proxy_requests",
            "Proxied requests finished, by status and reason (empty: nobody ended it).",
            ["status", "reason"],
            registry=self.registry,
        )
        self.outcomes = Counter(
            "wirecut_proxy_outcomes",
            "Proxied requests finished, per upstream and client key, by status and reason.",
            ["upstream", "key", "status", "reason"],
            registry=self.registry,
        )
        self.tokens = Counter(
            "wirecut_proxy_tokens",
            "Tokens per upstream and client key, by kind (prompt, completion) and by how "
            "they were counted (upstream, tokenizer, chunks).",
            ["upstream", "key", "kind", "counted_by"],
            registry=self.registry,
        )
        self.client_left = Histogram(
            "wirecut_proxy_client_left_to_upstream_closed_ms",
            "From a client's disconnect to the shutdown of its upstream socket (ms).",
            ["upstream", "key"],
            buckets=_MS_BUCKETS,
            registry=self.registry,
        )
        self.started_after_left = Counter(
            "wirecut_proxy_started_after_client_left",
            "Requests sent to the upstream after their client had left (the cut keeps it 0).",
            ["upstream", "key"],
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
            "Completion tokens relayed, as the records count them (the upstream's or estimated).",
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
        self.registry.register(_Gauges(gauges, records, guard, upstreams))

    def observe(self, record: ProxyRecord, *, started_after_cut: bool = False) -> None:
        """Count a written record (``started_after_cut``: it went upstream after its cut)."""
        status, reason = str(record.status), "" if record.reason is None else str(record.reason)
        upstream, key = record.upstream or "", record.key or ""
        self.requests.labels(status, reason).inc()
        self.outcomes.labels(upstream, key, status, reason).inc()
        usage = record.usage
        self.upstream_requests.inc(usage.requests or 0)
        if usage.completion_tokens is not None:
            self.completion_tokens.inc(usage.completion_tokens)
            if usage.counted_by is not None:
                self.tokens.labels(upstream, key, "completion", str(usage.counted_by)).inc(
                    usage.completion_tokens
                )
        if usage.prompt_tokens is not None and usage.prompt_counted_by is not None:
            self.tokens.labels(upstream, key, "prompt", str(usage.prompt_counted_by)).inc(
                usage.prompt_tokens
            )
        self.queued.observe(record.queued_ms)
        close_ms = record.cancel_to_upstream_close_ms
        if close_ms is not None:
            self.cancel_to_upstream_close.observe(close_ms)
        left = record.reason is RecordReason.DISCONNECT
        if left and close_ms is not None:
            self.client_left.labels(upstream, key).observe(close_ms)
        # Touched for every request, so that its 0 shows for each upstream and key.
        self.started_after_left.labels(upstream, key).inc(1 if left and started_after_cut else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Gauges(Collector):
    def __init__(
        self,
        read: Callable[[], tuple[int, int, int | None]],
        records: Callable[[], tuple[int, int]],
        guard: Callable[[], ConnectionGuard | None],
        upstreams: UpstreamGauges,
    ) -> None:
        self._read = read
        self._records = records
        self._guard = guard
        self._upstreams = upstreams

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
        per = self._upstreams()
        families: tuple[tuple[str, str, list[int | None]], ...] = (
            ("in_flight", "Requests at this upstream now.", [row[1] for row in per]),
            (
                "queued",
                "Requests waiting in the proxy's queue for this upstream now.",
                [row[2] for row in per],
            ),
            (
                "slot_limit",
                "Requests the proxy lets in flight here at once (-1: unlimited).",
                [row[3] for row in per],
            ),
        )
        for name, help_text, values in families:
            family = GaugeMetricFamily(
                f"wirecut_proxy_upstream_{name}", help_text, labels=["upstream"]
            )
            for row, value in zip(per, values, strict=True):
                family.add_metric([row[0]], -1 if value is None else value)
            yield family
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
            yield from connection_families(
                guard,
                open_help="Open client connections.",
                dropped_help="Client connections the proxy ended for a limit, by why.",
            )
