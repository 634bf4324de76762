"""``ProviderSpec``: which provider, once; and ``Chat``, what a caller needs of its client.

The console's services, its cluster hosts and ``wirecut serve``'s banner all
speak of the same provider; ``ProviderSpec`` is the one value they share (a
frozen dataclass, so that it crosses to a Ray host as it is). ``Chat`` is the
one method an agent or the curator calls: ``ChatClient`` has it, and so does a
stand-in that makes the request elsewhere (a cluster host).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from wirecut.provider._admission import SlotGate
from wirecut.provider._chat_client import ChatClient
from wirecut.provider._result import ChatResult

__all__ = ["DEFAULT_MAX_TOKENS", "Chat", "ProviderSpec"]

#: max_tokens of one chat reply unless said otherwise (a small model may pad until it).
DEFAULT_MAX_TOKENS = 256


class Chat(Protocol):
    """Makes one chat request with the contract of ``ChatClient.chat`` (see there)."""

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        stream: bool = True,
        on_token: Callable[[str], None] | None = None,
        **params: Any,
    ) -> ChatResult: ...


@dataclass(frozen=True)
class ProviderSpec:
    """An OpenAI-compatible provider: ``base_url`` (``http://host:port/v1``) and how to ask it.

    ``label`` says which provider it is, for people (``help``, the banner,
    errors); ``max_tokens`` bounds one chat reply; ``read_interval`` paces the
    reads of a streamed reply (``ChatClient``).
    """

    base_url: str
    api_key: str | None = None
    model: str | None = None
    label: str = ""
    max_tokens: int = DEFAULT_MAX_TOKENS
    read_interval: float = 0.0

    def client(self, admission: SlotGate | None = None) -> ChatClient:
        """A new ``ChatClient`` for this provider (its requests obey the bound scope).

        ``admission``: the gate its requests take their turn at (``SlotGate``).
        """
        return ChatClient(
            self.base_url,
            api_key=self.api_key,
            model=self.model,
            read_interval=self.read_interval,
            admission=admission,
        )
