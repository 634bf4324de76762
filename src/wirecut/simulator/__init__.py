"""A llama.cpp-like OpenAI-compatible provider, for tests, repro and bench.

It serves llama.cpp's generation APIs (chat and text completions, the
Responses API, Anthropic's Messages API) and its ``/tokenize``,
``/detokenize``, ``/apply-template`` and ``/props``, with one tokenizer for
every count.

A separate program that shares no code with wirecut's client side (it must not
import ``wirecut.scope``, ``wirecut.http`` or ``wirecut.provider``): it is the
other end of the wire that those are tested against. See docs/protocol.md, "The
simulator", and ``wirecut provider``.

In-process use (tests, benchmarks)::

    from wirecut.simulator import SimConfig, SimulatorServer

    with SimulatorServer(SimConfig(slots=1, tokens_per_second=100, prompt_ms=10)) as sim:
        ...  # point a client at sim.base_url ("http://127.0.0.1:PORT/v1")
        ev = sim.wait_for(lambda ev: ev.kind == "peer_closed", timeout=5)

Scripted replies: pass ``responder=`` (see ``Responder``), or
``responder=directive_responder`` to let a ``#sim-reply {...}`` user message
choose the reply.
"""

from wirecut.simulator._app import Simulator
from wirecut.simulator._config import SimConfig
from wirecut.simulator._events import EventKind, EventLog, SimEvent
from wirecut.simulator._requests import RequestState, RequestSummary
from wirecut.simulator._script import (
    DIRECTIVE_PREFIX,
    Responder,
    ScriptedReply,
    ScriptedToolCall,
    directive_responder,
)
from wirecut.simulator._server import ServerState, SimulatorServer, serve_forever

__all__ = [
    "DIRECTIVE_PREFIX",
    "EventKind",
    "EventLog",
    "RequestState",
    "RequestSummary",
    "Responder",
    "ScriptedReply",
    "ScriptedToolCall",
    "ServerState",
    "SimConfig",
    "SimEvent",
    "Simulator",
    "SimulatorServer",
    "directive_responder",
    "serve_forever",
]
