"""``Proxy``: the state of one running proxy, shared by its routes.

Its configuration, the upstream and what it is, the admission FIFO, the
requests live now (by id, for cancel by id), the record file and the
metrics. Built in any thread; ``start()``, ``open()``, ``finished()``,
``health()`` and ``shutdown()`` run on the event loop, ``probe()`` in a
thread (it blocks on the network).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from wirecut.aio import run_sync
from wirecut.proxy._admission import Admission
from wirecut.proxy._config import AUTO, ProxyConfig
from wirecut.proxy._exchange import Exchange, ExchangeState
from wirecut.proxy._lanes import Lanes
from wirecut.proxy._metrics import ProxyMetrics
from wirecut.proxy._record import RECORD_FILE, RecordLog, RecordReason
from wirecut.proxy._request import ClientRequest
from wirecut.proxy._upstream import Upstream, UpstreamInfo, UpstreamKind

__all__ = ["DuplicateId", "Proxy"]

#: Seconds between two probes of an upstream that was unreachable.
REPROBE_INTERVAL = 5.0
#: Worker threads at most (requests beyond it wait for one, cancellable).
WORKERS_UNLIMITED = 1024


class DuplicateId(Exception):
    """A request with this id is live already."""


class Proxy:
    """One proxy's state (see the module docstring)."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.upstream = Upstream(
            config.upstream, api_key=config.api_key, connect_timeout=config.connect_timeout
        )
        self.info = UpstreamInfo(UpstreamKind.UNREACHABLE, None)
        self.admission = Admission(None if config.upstream_slots == AUTO else config.upstream_slots)
        self.live: dict[str, Exchange] = {}
        self.metrics = ProxyMetrics(self._gauges)
        self.log = RecordLog(None if config.data_dir is None else config.data_dir / RECORD_FILE)
        self.lanes = Lanes()
        # The threads the upstream requests run on: kept warm between requests.
        # At most as many run at once as are admitted; an upstream without a
        # slot count gets WORKERS_UNLIMITED.
        self.workers = ThreadPoolExecutor(WORKERS_UNLIMITED, thread_name_prefix="wirecut-proxy")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._probed_at = 0.0

    # -- any thread ---------------------------------------------------------------

    def probe(self) -> UpstreamInfo:
        """Ask the upstream what it is (blocks); ``"auto"`` slots follow its answer."""
        info = self.upstream.probe()
        self._probed_at = time.monotonic()
        self.info = info
        if self.config.upstream_slots == AUTO and info.kind is not UpstreamKind.UNREACHABLE:
            self.admission.slots = info.slots
        return info

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the proxy's loop (from a worker thread)."""
        if self._loop is None:
            raise RuntimeError("Proxy.start() was not called on the event loop")
        with contextlib.suppress(RuntimeError):  # The loop is closed: the server is gone.
            self._loop.call_soon_threadsafe(fn)

    def close(self) -> None:
        self.workers.shutdown(wait=False, cancel_futures=True)
        self.upstream.close()
        self.log.close()

    # -- event loop ----------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    def open(self, request_id: str, request: ClientRequest) -> Exchange:
        """A new live request; ``DuplicateId`` if one with ``request_id`` is live."""
        if request_id in self.live:
            raise DuplicateId(request_id)
        exchange = Exchange(self, request_id, request)
        self.live[request_id] = exchange
        return exchange

    def finished(self, exchange: Exchange) -> None:
        """``exchange`` has its record: write it, count it, forget the request."""
        if self.live.get(exchange.id) is exchange:
            del self.live[exchange.id]
        assert exchange.record is not None
        self.log.append(exchange.record)
        self.metrics.observe(exchange.record)

    async def health(self) -> dict[str, Any]:
        """``GET /health`` (docs/protocol.md); probes again an upstream that was unreachable."""
        if (
            self.info.kind is UpstreamKind.UNREACHABLE
            and time.monotonic() - self._probed_at >= REPROBE_INTERVAL
        ):
            await run_sync(self.probe, unwind_timeout=1.0)
        in_flight, queued, slots = self._gauges()
        return {
            "status": "ok",
            "upstream": {
                "url": self.upstream.base_url,
                "kind": str(self.info.kind),
                "slots": slots,
            },
            "requests": {"in_flight": in_flight, "queued": queued},
        }

    async def shutdown(self) -> None:
        """Cut every live request (reason ``shutdown``) and wait for their records (bounded)."""
        live = list(self.live.values())
        for exchange in live:
            exchange.cancel(RecordReason.SHUTDOWN)
        pending = [e.finished.wait() for e in live if e.state is not ExchangeState.DONE]
        if pending:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.unwind_timeout + 1.0):
                    await asyncio.gather(*pending)

    def _gauges(self) -> tuple[int, int, int | None]:
        return self.admission.in_flight, self.admission.queued, self.admission.slots
