"""Which provider the apps start or talk to: a URL, the embedded llama.cpp, or the simulator.

An app layer above ``local`` and ``simulator``: ``serve``, ``proxy`` and
``doctor`` decide their provider here, in one place (docs/protocol.md,
"Command line").
"""

from wirecut.launch._provider import (
    PROVIDER_URL_ENV,
    Provider,
    ProviderUnavailable,
    given_provider_url,
    resolve_provider,
)

__all__ = [
    "PROVIDER_URL_ENV",
    "Provider",
    "ProviderUnavailable",
    "given_provider_url",
    "resolve_provider",
]
