"""``connection_families``: a ``ConnectionGuard`` as Prometheus metric families.

The console's and the proxy's ``/metrics`` both show their guard's open
connections and the connections it ended for a limit, under the same names;
each says in its own words what a connection is there. Call it from a
collector at scrape time (the event loop's thread, or the scraping one: the
values are single reads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wirecut.serving._limits import ConnectionGuard, Dropped

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["connection_families"]


def connection_families(
    guard: ConnectionGuard, *, open_help: str, dropped_help: str
) -> tuple[GaugeMetricFamily, CounterMetricFamily]:
    """``guard``'s ``wirecut_connections_open`` and ``wirecut_connections_dropped`` (by why)."""
    # Imported here: most users of wirecut.serving never serve metrics.
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    opened = GaugeMetricFamily("wirecut_connections_open", open_help, value=guard.open)
    dropped = CounterMetricFamily("wirecut_connections_dropped", dropped_help, labels=["why"])
    for why in Dropped:
        dropped.add_metric([why.value], guard.dropped[why])
    return opened, dropped
