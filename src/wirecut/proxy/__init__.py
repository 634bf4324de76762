"""``wirecut proxy``: a gateway for OpenAI and Anthropic APIs whose disconnect cuts the upstream.

Sits beside the console, above ``provider`` and ``http``: every request runs
on the event loop, under its own ``InterruptScope``, through one keep-alive
pool per upstream (``wirecut.http.AsyncH1Client``); its upstream request
always streams on the wire, and a client that leaves in any phase (queued
here, connecting, prompt, decoding) has its upstream socket shut down at
once. A request goes to the upstream that serves its model; at most as many
requests as an upstream has slots are in flight there, the rest wait in its
FIFO, which a leaving client never gets out of onto the upstream. Every
record carries billable usage. See docs/proxy.md.

The modules: ``_config`` (the settings), ``_config_file`` (``--config``),
``_keys`` (client keys), ``_server`` (uvicorn, SIGHUP), ``_app`` (routes,
Host/Origin/key checks), ``_proxy`` (the shared state, reload),
``_routing`` (the upstreams and a model's way), ``_exchange`` (one
request's life) and ``_lifecycle`` (its states), ``_admission`` (the FIFO,
on ``wirecut.provider.AdmissionLine``), ``_relay`` (the upstream request),
``_dialects`` (the four APIs: ``_responses``, ``_messages``),
``_events`` (the stream's events), ``_assemble`` (the chat non-stream
answer), ``_tally`` (what the upstream produced), ``_usage`` and
``_counting`` (billable usage, the upstream's tokenizer), ``_request`` (the
boundary), ``_upstream`` (what the upstream is), ``_record``
(proxy.jsonl), ``_metrics`` (/metrics), ``_wire``.
"""

from wirecut.proxy._app import create_app
from wirecut.proxy._config import (
    AUTO,
    PROXY_CONNECTION_LIMITS,
    ClientKey,
    ProxyConfig,
    UpstreamSpec,
)
from wirecut.proxy._config_file import ConfigFileError, load_config_file
from wirecut.proxy._dialects import Endpoint
from wirecut.proxy._exchange import ExchangeState
from wirecut.proxy._keys import KeysFileError, load_keys_file
from wirecut.proxy._proxy import Proxy
from wirecut.proxy._record import RECORD_FILE, ProxyRecord, RecordReason
from wirecut.proxy._server import ProxyServer, serve_forever
from wirecut.proxy._upstream import UpstreamInfo, UpstreamKind
from wirecut.proxy._usage import BilledUsage, CountedBy

__all__ = [
    "AUTO",
    "PROXY_CONNECTION_LIMITS",
    "RECORD_FILE",
    "BilledUsage",
    "ClientKey",
    "ConfigFileError",
    "CountedBy",
    "Endpoint",
    "ExchangeState",
    "KeysFileError",
    "Proxy",
    "ProxyConfig",
    "ProxyRecord",
    "ProxyServer",
    "RecordReason",
    "UpstreamInfo",
    "UpstreamKind",
    "UpstreamSpec",
    "create_app",
    "load_config_file",
    "load_keys_file",
    "serve_forever",
]
