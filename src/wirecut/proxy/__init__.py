"""``wirecut proxy``: an OpenAI-compatible gateway whose disconnect cuts the upstream.

Sits beside the console, above ``provider`` and ``http``: every request runs
on the event loop, under its own ``InterruptScope``, through one keep-alive
pool to the upstream (``wirecut.http.AsyncH1Client``); its upstream request
always streams on the wire, and a client that leaves in any phase (queued
here, connecting, prompt, decoding) has its upstream socket shut down at
once. At most as many requests as the upstream has slots are in flight; the
rest wait in a FIFO that a leaving client never gets out of onto the
upstream. See docs/proxy.md.

The modules: ``_config`` (the settings), ``_server`` (uvicorn), ``_app``
(routes, Host/Origin/token checks), ``_proxy`` (the shared state),
``_exchange`` (one request's life) and ``_lifecycle`` (its states),
``_admission`` (the FIFO), ``_relay`` (the upstream request), ``_events``
(the stream's events), ``_assemble`` (counting and the non-stream answer),
``_request`` (the boundary), ``_upstream`` (what the upstream is),
``_record`` (proxy.jsonl), ``_metrics`` (/metrics), ``_wire`` (errors).
"""

from wirecut.proxy._app import create_app
from wirecut.proxy._config import AUTO, PROXY_CONNECTION_LIMITS, ProxyConfig
from wirecut.proxy._exchange import ExchangeState
from wirecut.proxy._proxy import Proxy
from wirecut.proxy._record import RECORD_FILE, ProxyRecord, RecordReason
from wirecut.proxy._server import ProxyServer, serve_forever
from wirecut.proxy._upstream import UpstreamInfo, UpstreamKind

__all__ = [
    "AUTO",
    "PROXY_CONNECTION_LIMITS",
    "RECORD_FILE",
    "ExchangeState",
    "Proxy",
    "ProxyConfig",
    "ProxyRecord",
    "ProxyServer",
    "RecordReason",
    "UpstreamInfo",
    "UpstreamKind",
    "create_app",
    "serve_forever",
]
