"""``Proxy``: the state of one running proxy, shared by its routes.

Its configuration, the upstreams it serves (``Router``: a ``Backend`` each,
with its own admission FIFO), the client keys, the requests live now (by
id, for cancel by id), the record file and the metrics. Built in any
thread; everything else runs on the event loop: ``start()`` (the app's
startup) asks each upstream what it is, within a bound, and keeps asking
in the background until it says (a llama.cpp that is not up yet, or
loading its model); ``reload()`` rereads the config and keys files without
touching a live request; ``shutdown()`` cuts what is live.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from wirecut._json import JSONError, loads
from wirecut.proxy._config import ProxyConfig, UpstreamSpec
from wirecut.proxy._config_file import ConfigFileError, load_config_file
from wirecut.proxy._exchange import Exchange
from wirecut.proxy._keys import Keys, KeysFileError, load_keys_file
from wirecut.proxy._metrics import ProxyMetrics
from wirecut.proxy._parsing import ON_LOOP_BYTES, BodyParser
from wirecut.proxy._record import RECORD_FILE, RecordReason
from wirecut.proxy._record_log import RecordLog
from wirecut.proxy._request import ClientRequest
from wirecut.proxy._routing import Backend, Router
from wirecut.proxy._upstream import UpstreamInfo
from wirecut.serving import ConnectionGuard

__all__ = ["DuplicateId", "Proxy", "UnknownModel"]

_log = logging.getLogger("wirecut.proxy")

#: Seconds the start waits for the upstreams' first answers before it serves anyway.
FIRST_PROBE_BOUND = 3.0
#: Seconds between two probes of an upstream that has not said what it is (doubling up to the max).
REPROBE_FIRST, REPROBE_MAX = 0.5, 5.0


class DuplicateId(Exception):
    """A request with this id is live already."""


class UnknownModel(Exception):
    """No upstream serves the model a request names; ``known`` lists what is served."""

    def __init__(self, model: str | None, known: list[str]) -> None:
        super().__init__(model)
        self.model = model
        self.known = known

    def __str__(self) -> str:
        served = ", ".join(self.known)
        if self.model is None:
            return f"'model' is required: this proxy serves several upstreams (models: {served})"
        return f"the model {self.model!r} is not served here (models: {served})"


class Proxy:
    """One proxy's state (see the module docstring).

    ``say`` gets a line each time an upstream's admission changes, and for
    each reload (default: the ``wirecut.proxy`` logger, at INFO).
    """

    def __init__(self, config: ProxyConfig, *, say: Callable[[str], None] | None = None) -> None:
        self.config = config
        self._say = say or _log.info
        self.keys = Keys(config.token, config.keys)
        self.live: dict[str, Exchange] = {}
        #: The guard of its client connections (``wirecut.serving``), set by the server.
        self.guard: ConnectionGuard | None = None
        self.log = RecordLog(
            None if config.data_dir is None else config.data_dir / RECORD_FILE,
            max_bytes=config.records_max_bytes,
            backups=config.records_backups,
        )
        self.parser = BodyParser()
        self.router = Router(tuple(self._backend(spec) for spec in config.upstreams))
        #: Backends gone from the configuration whose last requests still run.
        self._retired: list[Backend] = []
        self.metrics = ProxyMetrics(
            self._gauges,
            lambda: (self.log.pending, self.log.dropped),
            lambda: self.guard,
            self._upstream_gauges,
        )
        #: The event loop the proxy runs on (set by ``start()``): where its
        #: requests live, and where ``Exchange.cancel`` may be called.
        self.loop: asyncio.AbstractEventLoop | None = None
        self._reloading = asyncio.Lock()
        self._reload_task: asyncio.Future[bool] | None = None

    @property
    def several(self) -> bool:
        """True if the upstreams come from a config file (the several-upstream form)."""
        return self.config.upstream is None

    # -- event loop ----------------------------------------------------------------

    async def start(self) -> None:
        """Ask each upstream what it is (``FIRST_PROBE_BOUND`` s at most); then ask on if needed."""
        self.loop = asyncio.get_running_loop()
        backends = self.router.backends
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FIRST_PROBE_BOUND):
                await asyncio.gather(*(self.probe(backend) for backend in backends))
        for backend in backends:
            self._keep_asking(backend)

    async def probe(self, backend: Backend | None = None) -> UpstreamInfo:
        """Ask an upstream (the first) what it is; ``"auto"`` slots follow its answer."""
        backend = backend or self.router.backends[0]
        info = await backend.upstream.probe()
        if backend.learnt(info) and not backend.retired:
            self._say(f"wirecut proxy: {backend.admission_line(named=self.several)}")
        return info

    def open(self, request_id: str, request: ClientRequest, key: str | None = None) -> Exchange:
        """A new live request, routed by its model.

        Raises ``DuplicateId`` if one with ``request_id`` is live, and
        ``UnknownModel`` if no upstream serves its model.
        """
        if request_id in self.live:
            raise DuplicateId(request_id)
        backend = self.router.route(request.model)
        if backend is None:
            raise UnknownModel(request.model, self.router.known())
        exchange = Exchange(backend.context, request_id, request, key=key)
        backend.live += 1
        self.live[request_id] = exchange
        return exchange

    def request_reload(self) -> None:
        """Reload soon (``reload``), in a task of its own. Event loop only."""
        self._reload_task = asyncio.ensure_future(self.reload())

    async def reload(self) -> bool:
        """Reread ``--config`` and ``--keys-file``; live requests go on as they were.

        A file with an error changes nothing: one line says so, and what was
        loaded before stays in force. False then.
        """
        config = self.config
        async with self._reloading:
            try:
                specs = None
                if config.config_file is not None:
                    specs = await asyncio.to_thread(load_config_file, config.config_file)
                keys = None
                if config.keys_file is not None:
                    keys = await asyncio.to_thread(load_keys_file, config.keys_file)
            except (ConfigFileError, KeysFileError) as exc:
                self._say(f"wirecut proxy: reload refused, still serving what was loaded: {exc}")
                return False
            said = []
            if specs is not None:
                self._follow(specs)
                said.append(f"{len(specs)} upstream(s) serving {', '.join(self.router.known())}")
            if keys is not None:
                self.keys = Keys(None, keys)
                said.append(f"{len(keys)} key(s)")
            self._say(f"wirecut proxy: reloaded: {'; '.join(said) or 'nothing to reload'}")
            return True

    def finished(self, exchange: Exchange, backend: Backend) -> None:
        """``exchange`` has its record: write it, count it, forget the request."""
        if self.live.get(exchange.id) is exchange:
            del self.live[exchange.id]
        backend.live -= 1
        assert exchange.record is not None
        self.log.append(exchange.record)
        self.metrics.observe(exchange.record, started_after_cut=exchange.tally.sent_after_cut)
        if backend.retired and backend.live == 0:
            backend.close()
            with contextlib.suppress(ValueError):
                self._retired.remove(backend)

    async def health(self) -> dict[str, Any]:
        """``GET /health`` (docs/protocol.md); never waits for an upstream."""
        in_flight, queued, _ = self._gauges()
        first = self.router.backends[0]
        health: dict[str, Any] = {
            "status": "ok",
            "upstream": {
                "url": first.url,
                "kind": str(first.info.kind),
                "slots": first.admission.slots,
            },
            "requests": {"in_flight": in_flight, "queued": queued},
        }
        if self.several:
            health["upstreams"] = [
                {
                    "url": backend.url,
                    "kind": str(backend.info.kind),
                    "slots": backend.admission.slots,
                    "models": list(backend.spec.models),
                    "requests": {
                        "in_flight": backend.admission.in_flight,
                        "queued": backend.admission.queued,
                    },
                }
                for backend in self.router.backends
            ]
        return health

    def admission_lines(self) -> list[str]:
        """One line per upstream saying which admission is in force, and why."""
        return [backend.admission_line(named=self.several) for backend in self.router.backends]

    async def shutdown(self) -> None:
        """Cut every live request (reason ``shutdown``) and wait for their records (bounded)."""
        for backend in self._all():
            if backend.learner is not None:
                backend.learner.cancel()
        live = list(self.live.values())
        for exchange in live:
            exchange.cancel(RecordReason.SHUTDOWN)
        pending = [e.finished.wait() for e in live if not e.finished.is_set()]
        if pending:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.unwind_timeout + 1.0):
                    await asyncio.gather(*pending)
        for backend in self._all():
            backend.close()

    async def load(self, raw: bytes) -> dict[str, Any] | None:
        """A request body parsed again (for its prompt's count): off the loop when large."""
        if len(raw) > ON_LOOP_BYTES:
            return await self.parser.load(raw)
        try:
            body = loads(raw)
        except JSONError:
            return None
        return body if isinstance(body, dict) else None

    # -- any thread ------------------------------------------------------------------

    def close(self) -> None:
        """Flush and close the record file, stop the body parser (after the loop stopped)."""
        self.parser.close()
        self.log.close()

    # -- internals ---------------------------------------------------------------------

    def _backend(self, spec: UpstreamSpec) -> Backend:
        config = self.config

        def finished(exchange: Exchange) -> None:
            self.finished(exchange, backend)

        backend = Backend(
            spec,
            request_timeout=config.request_timeout,
            connect_timeout=config.connect_timeout,
            connect_retries=config.connect_retries,
            limits=config.response_limits,
            finished=finished,
            load=self.load,
        )
        return backend

    def _follow(self, specs: tuple[UpstreamSpec, ...]) -> None:
        """Serve ``specs`` from now on (see ``_routing``: kept, new and retired backends)."""
        old = self.router.by_url()
        backends = []
        for spec in specs:
            backend = old.pop(spec.url, None)
            if backend is None:
                backend = self._backend(spec)
                if self.loop is not None:
                    backend.learner = asyncio.create_task(self._first_ask(backend))
            else:
                backend.update(spec)
            backends.append(backend)
        self.router = Router(tuple(backends))
        for gone in old.values():
            gone.retired = True
            if gone.live == 0:
                gone.close()
            else:
                self._retired.append(gone)

    async def _first_ask(self, backend: Backend) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FIRST_PROBE_BOUND):
                await self.probe(backend)
        if not backend.info.settled and not backend.retired:
            await self._learn(backend)

    def _keep_asking(self, backend: Backend) -> None:
        if not backend.info.settled:
            backend.learner = asyncio.create_task(self._learn(backend), name="wirecut-proxy-probe")

    async def _learn(self, backend: Backend) -> None:
        """Ask again until the upstream says what it is (unreachable or loading: not yet)."""
        pause = REPROBE_FIRST
        while not backend.info.settled and not backend.retired:
            await asyncio.sleep(pause)
            pause = min(pause * 2, REPROBE_MAX)
            await self.probe(backend)

    def _all(self) -> list[Backend]:
        return [*self.router.backends, *self._retired]

    def _gauges(self) -> tuple[int, int, int | None]:
        """Requests in flight and queued, over every upstream; the slots (None: unlimited)."""
        backends = self._all()
        slots = [backend.admission.slots for backend in self.router.backends]
        return (
            sum(backend.admission.in_flight for backend in backends),
            sum(backend.admission.queued for backend in backends),
            None if None in slots else sum(s for s in slots if s is not None),
        )

    def _upstream_gauges(self) -> list[tuple[str, int, int, int | None]]:
        return [
            (b.url, b.admission.in_flight, b.admission.queued, b.admission.slots)
            for b in self.router.backends
        ]
