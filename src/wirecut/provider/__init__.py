"""The OpenAI-compatible chat client (stream and non-stream, retries, cuts).

Imports ``wirecut.scope`` and ``wirecut.http`` only. ``ChatClient.chat()``
obeys the scope bound in the calling thread: a cancel cuts the request at
once, and what was received is returned, never lost. What one response may
make it hold is bounded (``ResponseLimits``). ``identify_provider`` says
what answers at a URL (llama.cpp, vLLM, Ollama, another OpenAI API, or not
one), within a bound.
"""

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
from wirecut.provider._spec import DEFAULT_MAX_TOKENS, Chat, ProviderSpec
from wirecut.provider._sse import ServerSentEvent, SseDecoder, iter_lines, iter_sse

__all__ = [
    "DEFAULT_MAX_TOKENS",
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
    "SseDecoder",
    "ToolCall",
    "Usage",
    "base_url_problem",
    "identify_provider",
    "iter_lines",
    "iter_sse",
]
