"""The OpenAI-compatible chat client (stream and non-stream, retries, cuts).

Imports ``wirecut.scope`` and ``wirecut.http`` only. ``ChatClient.chat()``
obeys the scope bound in the calling thread: a cancel cuts the request at
once, and what was received is returned, never lost.
"""

from wirecut.provider._chat_client import ChatClient, ClientState
from wirecut.provider._errors import (
    ProviderConnectionError,
    ProviderError,
    ProviderResponseError,
    ProviderStatusError,
    ProviderTimeout,
)
from wirecut.provider._result import ChatResult, ToolCall, Usage
from wirecut.provider._sse import ServerSentEvent, iter_sse

__all__ = [
    "ChatClient",
    "ChatResult",
    "ClientState",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderResponseError",
    "ProviderStatusError",
    "ProviderTimeout",
    "ServerSentEvent",
    "ToolCall",
    "Usage",
    "iter_sse",
]
