"""``ResponseLimits``: how much of a provider's answer ``ChatClient`` holds in memory.

A provider is a server on the other side of a socket, and it can send
anything: a 300 MiB body, or one SSE line that never ends (which grew the
console by 757 MiB and 1.5 GiB before these bounds). Past a bound the
request is cut (the connection is closed, so the provider sees it) and
``chat()`` raises one ``ProviderResponseError`` naming the bound. The
defaults are far above any real model reply (docs/provider.md): a reply of
8 Mi characters is about two million tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ResponseLimits"]

MiB = 1 << 20


@dataclass(frozen=True)
class ResponseLimits:
    """The bounds on one response; every field is a whole number > 0.

    Plain data, safe to share between threads. A bad value is a
    ``ValueError`` naming the field.
    """

    #: A non-streamed body (read whole before it is parsed), in bytes after
    #: any content decoding; a ``Content-Length`` above it fails at once.
    body_bytes: int = 32 * MiB
    #: One line of an event stream, and the data of one event, in bytes.
    line_bytes: int = 8 * MiB
    #: The reply kept from one response: its text and tool-call arguments
    #: together, in characters.
    reply_chars: int = 8 * MiB

    def __post_init__(self) -> None:
        for name in ("body_bytes", "line_bytes", "reply_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a whole number > 0, not {value!r}")
