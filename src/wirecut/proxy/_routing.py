"""``Backend`` and ``Router``: the upstreams a proxy serves, and which one a request goes to.

A ``Backend`` is one upstream as the proxy serves it: its ``UpstreamSpec``,
its connection pool (``Upstream``), its own admission FIFO (a team's chat
model and coder do not wait for each other's slots), what its probe found
(``UpstreamInfo``: its kind and slots), its tokenizer when it offers one
(``TokenCounter``), and how many requests are live there. ``Router`` holds
the backends of the configuration in force and routes a request's
``model``: to the upstream that names it exactly, else to the one whose
longest prefix matches it; a request that names no model goes to the only
upstream, if there is one.

A reload builds a new ``Router`` (``Proxy.reload``): the backend of every URL
that stays is kept (its pool, its queue and its live requests untouched;
its models, slots, key and timeout follow the new spec), new URLs get new
backends, and the backends that are gone are retired: they take no new
request, and their pool is closed once their last live request ended.

Event loop only.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from wirecut.provider import ResponseLimits
from wirecut.proxy._admission import Admission
from wirecut.proxy._config import AUTO, UpstreamSpec
from wirecut.proxy._counting import TokenCounter
from wirecut.proxy._exchange import Exchange, ExchangeContext
from wirecut.proxy._upstream import Upstream, UpstreamInfo, UpstreamKind

__all__ = ["Backend", "Router"]


class Backend:
    """One upstream as the proxy serves it (see the module docstring)."""

    def __init__(
        self,
        spec: UpstreamSpec,
        *,
        request_timeout: float,
        connect_timeout: float,
        connect_retries: int,
        limits: ResponseLimits,
        finished: Callable[[Exchange], None],
        load: Callable[[bytes], Awaitable[dict[str, Any] | None]],
    ) -> None:
        self.spec = spec
        self.upstream = Upstream(spec.url, api_key=spec.api_key, connect_timeout=connect_timeout)
        self.info = UpstreamInfo(UpstreamKind.UNREACHABLE, None)
        self.admission = Admission(None if spec.slots == AUTO else spec.slots)
        self.counter = TokenCounter(self.upstream)
        #: Requests routed here whose record is not written yet.
        self.live = 0
        #: Gone from the configuration: takes no new request; closed when ``live`` is 0.
        self.retired = False
        self._default_timeout = request_timeout
        self.context = ExchangeContext(
            upstream=self.upstream,
            admission=self.admission,
            request_timeout=spec.timeout or request_timeout,
            connect_retries=connect_retries,
            limits=limits,
            finished=finished,
            counter=self.tokenizer,
            load=load,
        )
        #: The task asking an upstream that has not said what it is (``Proxy``).
        self.learner: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """The upstream's API base as shown anywhere (no credentials)."""
        return self.upstream.base_url

    def tokenizer(self) -> TokenCounter | None:
        """The upstream's own tokenizer, if it offers one (llama.cpp's /tokenize)."""
        return self.counter if self.info.kind is UpstreamKind.LLAMA_CPP else None

    def learnt(self, info: UpstreamInfo) -> bool:
        """Take what a probe found; True if it changed. ``"auto"`` slots follow it."""
        changed = info != self.info
        self.info = info
        if self.spec.slots == AUTO and info.settled:
            self.admission.resize(info.slots)
        return changed

    def update(self, spec: UpstreamSpec) -> None:
        """Follow a reloaded spec of the same URL; live requests go on as they were."""
        if spec.api_key != self.spec.api_key:
            self.upstream.authorize(spec.api_key)
        self.spec = spec
        if spec.slots == AUTO:
            self.admission.resize(self.info.slots if self.info.settled else None)
        else:
            self.admission.resize(spec.slots)
        self.context = dataclasses.replace(
            self.context, request_timeout=spec.timeout or self._default_timeout
        )

    def admission_line(self, *, named: bool) -> str:
        """One line saying which admission is in force here, and why (``named``: with the URL)."""
        kind = self.info.kind
        upstream = f"upstream {self.url}" if named else "upstream"
        slots = self.admission.slots
        if self.spec.slots != AUTO:
            limit = "unlimited" if slots is None else str(slots)
            source = "slots in the config" if named else "--upstream-slots"
            return f"{upstream} is {kind}, {limit} in flight at once ({source})"
        if slots is not None:
            return f"{upstream} is {kind}, {slots} in flight at once (from {self.info.source})"
        if not self.info.settled:
            return (
                f"{upstream} is {kind}, unlimited in flight at once "
                "until it says its slots (asking again)"
            )
        return f"{upstream} is {kind}, unlimited in flight at once (it does not say its slots)"

    def close(self) -> None:
        """Stop asking it what it is and close its idle connections."""
        if self.learner is not None:
            self.learner.cancel()
        self.upstream.close()


class Router:
    """The backends in force, and the way of a model to one of them."""

    def __init__(self, backends: tuple[Backend, ...]) -> None:
        self.backends = backends

    def route(self, model: str | None) -> Backend | None:
        """The backend that serves ``model`` (None: none does)."""
        if model is None:
            return self.backends[0] if len(self.backends) == 1 else None
        best: tuple[int, Backend] | None = None
        for backend in self.backends:
            closeness = backend.spec.match(model)
            if closeness is not None and (best is None or closeness > best[0]):
                best = (closeness, backend)
        return None if best is None else best[1]

    def known(self) -> list[str]:
        """Every model name and prefix served, in the configuration's order."""
        return [pattern for backend in self.backends for pattern in backend.spec.models]

    def by_url(self) -> dict[str, Backend]:
        return {backend.spec.url: backend for backend in self.backends}
