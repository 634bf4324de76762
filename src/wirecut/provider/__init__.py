"""The OpenAI-compatible chat client (stream and non-stream, retries, cuts).

Imports ``wirecut.scope`` and ``wirecut.http`` only. ``ChatClient.chat()``
obeys the scope bound in the calling thread: a cancel cuts the request at
once, and what was received is returned, never lost. What one response may
make it hold is bounded (``ResponseLimits``). ``identify_provider`` says
what answers at a URL (llama.cpp, vLLM, Ollama, another OpenAI API, or not
one), within a bound. ``SlotGate`` keeps no more requests in flight than
the provider has slots (``provider_slots`` asks llama.cpp how many): the
others wait in line, and one cancelled there never reaches the provider.
"""

from wirecut.provider._admission import AdmissionHost, AdmissionLine, SlotGate
from wirecut.provider._chat_client import ChatClient, ClientState
from wirecut.provider._errors import (
    ProviderConnectionError,
    ProviderError,
    ProviderResponseError,
    ProviderStatusError,
    ProviderTimeout,
)
from wirecut.provider._identify import (
    ProviderIdentity,
    ProviderKind,
    base_url_problem,
    identify_provider,
)
from wirecut.provider._limits import ResponseLimits
from wirecut.provider._result import ChatResult, ToolCall, Usage
from wirecut.provider._slots import SlotCount, provider_slots, slots_in_listing, slots_in_props
from wirecut.provider._spec import DEFAULT_MAX_TOKENS, Chat, ProviderSpec
from wirecut.provider._sse import ServerSentEvent, SseDecoder, iter_lines, iter_sse

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "AdmissionHost",
    "AdmissionLine",
    "Chat",
    "ChatClient",
    "ChatResult",
    "ClientState",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderIdentity",
    "ProviderKind",
    "ProviderResponseError",
    "ProviderSpec",
    "ProviderStatusError",
    "ProviderTimeout",
    "ResponseLimits",
    "ServerSentEvent",
    "SlotCount",
    "SlotGate",
    "SseDecoder",
    "ToolCall",
    "Usage",
    "base_url_problem",
    "identify_provider",
    "iter_lines",
    "iter_sse",
    "provider_slots",
    "slots_in_listing",
    "slots_in_props",
]
