"""``Proxy``: the state of one running proxy, shared by its routes.

Its configuration, the upstream and what it is, the admission FIFO, the
requests live now (by id, for cancel by id), the record file and the
metrics. Built in any thread; everything else runs on the event loop:
``start()`` (the app's startup) asks the upstream what it is, within a
bound, and keeps asking in the background until it says (a llama.cpp that
is not up yet, or loading its model); ``shutdown()`` cuts what is live.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from wirecut.proxy._admission import Admission
from wirecut.proxy._config import AUTO, ProxyConfig
from wirecut.proxy._exchange import Exchange, ExchangeContext, ExchangeState
from wirecut.proxy._metrics import ProxyMetrics
from wirecut.proxy._parsing import BodyParser
from wirecut.proxy._record import RECORD_FILE, RecordReason
from wirecut.proxy._record_log import RecordLog
from wirecut.proxy._request import ClientRequest
from wirecut.proxy._upstream import Upstream, UpstreamInfo, UpstreamKind
from wirecut.serving import ConnectionGuard

__all__ = ["DuplicateId", "Proxy"]

_log = logging.getLogger("wirecut.proxy")

#: Seconds the start waits for the upstream's first answer before it serves anyway.
FIRST_PROBE_BOUND = 3.0
#: Seconds between two probes of an upstream that has not said what it is (doubling up to the max).
REPROBE_FIRST, REPROBE_MAX = 0.5, 5.0


class DuplicateId(Exception):
    """A request with this id is live already."""


class Proxy:
    """One proxy's state (see the module docstring).

    ``say`` gets a line each time the admission in force changes (default:
    the ``wirecut.proxy`` logger, at INFO).
    """

    def __init__(self, config: ProxyConfig, *, say: Callable[[str], None] | None = None) -> None:
        self.config = config
        self._say = say or _log.info
        self.upstream = Upstream(
            config.upstream, api_key=config.api_key, connect_timeout=config.connect_timeout
        )
        self.info = UpstreamInfo(UpstreamKind.UNREACHABLE, None)
        self.admission = Admission(None if config.upstream_slots == AUTO else config.upstream_slots)
        self.live: dict[str, Exchange] = {}
        #: The guard of its client connections (``wirecut.serving``), set by the server.
        self.guard: ConnectionGuard | None = None
        self.log = RecordLog(
            None if config.data_dir is None else config.data_dir / RECORD_FILE,
            max_bytes=config.records_max_bytes,
            backups=config.records_backups,
        )
        self.metrics = ProxyMetrics(
            self._gauges,
            lambda: (self.log.pending, self.log.dropped),
            lambda: self.guard,
        )
        self.parser = BodyParser()
        self._context = ExchangeContext(
            upstream=self.upstream,
            admission=self.admission,
            request_timeout=config.request_timeout,
            connect_retries=config.connect_retries,
            limits=config.response_limits,
            finished=self.finished,
        )
        self._learner: asyncio.Task[None] | None = None
        #: The event loop the proxy runs on (set by ``start()``): where its
        #: requests live, and where ``Exchange.cancel`` may be called.
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- event loop ----------------------------------------------------------------

    async def start(self) -> None:
        """Ask the upstream what it is (``FIRST_PROBE_BOUND`` s at most); go on asking if needed."""
        self.loop = asyncio.get_running_loop()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FIRST_PROBE_BOUND):
                await self.probe()
        if not self.info.settled:
            self._learner = asyncio.create_task(self._learn(), name="wirecut-proxy-probe")

    async def probe(self) -> UpstreamInfo:
        """Ask the upstream what it is; ``"auto"`` slots follow its answer."""
        info = await self.upstream.probe()
        self._learnt(info)
        return info

    def open(self, request_id: str, request: ClientRequest) -> Exchange:
        """A new live request; ``DuplicateId`` if one with ``request_id`` is live."""
        if request_id in self.live:
            raise DuplicateId(request_id)
        exchange = Exchange(self._context, request_id, request)
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
        """``GET /health`` (docs/protocol.md); never waits for the upstream."""
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

    def admission_line(self) -> str:
        """One line saying which admission is in force, and why."""
        slots = self.admission.slots
        if self.config.upstream_slots != AUTO:
            limit = "unlimited" if slots is None else str(slots)
            return f"upstream is {self.info.kind}, {limit} in flight at once (--upstream-slots)"
        if slots is not None:
            return (
                f"upstream is {self.info.kind}, {slots} in flight at once (from {self.info.source})"
            )
        if not self.info.settled:
            return (
                f"upstream is {self.info.kind}, unlimited in flight at once "
                "until it says its slots (asking again)"
            )
        return (
            f"upstream is {self.info.kind}, unlimited in flight at once (it does not say its slots)"
        )

    async def shutdown(self) -> None:
        """Cut every live request (reason ``shutdown``) and wait for their records (bounded)."""
        if self._learner is not None:
            self._learner.cancel()
        live = list(self.live.values())
        for exchange in live:
            exchange.cancel(RecordReason.SHUTDOWN)
        pending = [e.finished.wait() for e in live if e.state is not ExchangeState.DONE]
        if pending:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.unwind_timeout + 1.0):
                    await asyncio.gather(*pending)
        self.upstream.close()

    # -- any thread ------------------------------------------------------------------

    def close(self) -> None:
        """Flush and close the record file, stop the body parser (after the loop stopped)."""
        self.parser.close()
        self.log.close()

    # -- internals ---------------------------------------------------------------------

    def _learnt(self, info: UpstreamInfo) -> None:
        changed = info != self.info
        self.info = info
        if self.config.upstream_slots == AUTO and info.settled:
            self.admission.slots = info.slots
        if changed:
            self._say(f"wirecut proxy: {self.admission_line()}")

    async def _learn(self) -> None:
        """Ask again until the upstream says what it is (unreachable or loading: not yet)."""
        pause = REPROBE_FIRST
        while not self.info.settled:
            await asyncio.sleep(pause)
            pause = min(pause * 2, REPROBE_MAX)
            await self.probe()

    def _gauges(self) -> tuple[int, int, int | None]:
        return self.admission.in_flight, self.admission.queued, self.admission.slots
