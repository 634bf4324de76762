"""``ProxyConfig``: every setting of ``wirecut proxy``, with its defaults in one place.

Validated in the constructor: a bad value is a ``ValueError`` naming the
field, never a failure later in a request.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import httpx

from wirecut.provider import ResponseLimits
from wirecut.proxy._upstream import redact
from wirecut.serving import ConnectionLimits

__all__ = ["AUTO", "PROXY_CONNECTION_LIMITS", "ProxyConfig"]

#: ``upstream_slots`` that means "ask the upstream" (llama.cpp's /slots or /props).
AUTO: Literal["auto"] = "auto"

#: The proxy's bounds on client connections (``wirecut.serving``, the console's
#: implementation): more of them than the console's (a team's streams), and a
#: larger request head (SDKs send long headers).
#: Thousands of streams may connect at once: a backlog to take a burst of a
#: thousand without a SYN retry, and as many descriptors kept back for it.
PROXY_CONNECTION_LIMITS = ConnectionLimits(
    max_connections=4096, max_head=64 * 1024, fd_reserve=1024, accept_backlog=1024
)


@dataclass(frozen=True)
class ProxyConfig:
    """What one proxy serves and how (docs/proxy.md).

    - ``upstream``: the upstream's OpenAI API base (``http://host:port/v1``).
    - ``host``, ``port``: where to listen (port 0: any free one).
    - ``model``: the model asked for when a client names none.
    - ``upstream_slots``: requests in flight upstream at once: a number,
      ``"auto"`` (from llama.cpp's /slots or /props, else unlimited) or None
      (unlimited).
    - ``token``: the client token (``Authorization: Bearer``); None: none is
      asked for, which only a loopback ``host`` may do.
    - ``api_key``: sent to the upstream; the client's own never is. Credentials
      in ``upstream`` (``user:password@``) are sent instead (not both).
    - ``request_timeout``: seconds from a request's arrival to its cut
      (queue, prompt and decoding together).
    - ``unwind_timeout``: seconds a cut request's worker may take to return.
    - ``connect_retries``: connects tried again when the upstream refused one.
    - ``connect_timeout``: seconds one connect to the upstream may take.
    - ``data_dir``: where ``proxy.jsonl`` goes (None: no record file).
    - ``allowed_hosts``: names besides loopback ones and IP addresses that
      the ``Host`` header may carry.
    - ``max_body_bytes``: the largest request body accepted (a body of nested
      lists this large still parses in well under a second, off the loop).
    - ``records_max_bytes``, ``records_backups``: ``proxy.jsonl`` is rotated
      once it would pass that size, keeping that many older files.
    - ``connection_limits``: the bounds on client connections: a request
      head's size and deadline, a cap on connections (idle ones evicted
      first), a client that does not read for ``send_timeout`` is cut.
    - ``response_limits``: the bounds on what the upstream sends back (an
      event's size, a whole answer's size), as the console's provider client
      has them.
    """

    upstream: str
    host: str = "127.0.0.1"
    port: int = 8766
    model: str | None = None
    upstream_slots: int | Literal["auto"] | None = AUTO
    token: str | None = None
    api_key: str | None = None
    request_timeout: float = 600.0
    unwind_timeout: float = 10.0
    connect_retries: int = 2
    connect_timeout: float = 5.0
    data_dir: Path | None = None
    allowed_hosts: tuple[str, ...] = field(default=())
    max_body_bytes: int = 4 * 1024 * 1024
    records_max_bytes: int = 64 * 1024 * 1024
    records_backups: int = 3
    connection_limits: ConnectionLimits = PROXY_CONNECTION_LIMITS
    response_limits: ResponseLimits = field(default_factory=ResponseLimits)

    def __post_init__(self) -> None:
        _check_url(self.upstream)
        if self.api_key and "@" in urlsplit(self.upstream).netloc:
            raise ValueError(
                "the upstream URL carries credentials (user:password@) and an API key was "
                "given too: give the upstream's credentials one way"
            )
        if (
            not isinstance(self.port, int)
            or isinstance(self.port, bool)
            or not 0 <= self.port <= 65535
        ):
            raise ValueError(f"port must be 0-65535, not {self.port!r}")
        slots = self.upstream_slots
        if not (
            slots is None
            or slots == AUTO
            or (isinstance(slots, int) and not isinstance(slots, bool) and slots >= 1)
        ):
            raise ValueError(
                f"upstream_slots must be 'auto', a whole number >= 1 or None, not {slots!r}"
            )
        for name in ("request_timeout", "unwind_timeout", "connect_timeout"):
            _check_seconds(name, getattr(self, name))
        if (
            not isinstance(self.connect_retries, int)
            or isinstance(self.connect_retries, bool)
            or not 0 <= self.connect_retries <= 10
        ):
            raise ValueError(f"connect_retries must be 0-10, not {self.connect_retries!r}")
        if self.token is not None and not self.token.strip():
            raise ValueError("token must not be empty")
        for name in ("max_body_bytes", "records_max_bytes", "records_backups"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
        object.__setattr__(self, "upstream", self.upstream.rstrip("/"))
        object.__setattr__(
            self, "allowed_hosts", tuple(name.strip().lower() for name in self.allowed_hosts)
        )


def _check_seconds(name: str, value: object) -> None:
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= threading.TIMEOUT_MAX
    )
    if not ok:
        raise ValueError(f"{name} must be a finite number of seconds > 0, not {value!r}")


def _check_url(url: object) -> None:
    what = "upstream must be an http:// or https:// URL with a host"
    if not isinstance(url, str):
        raise ValueError(f"{what}, not {url!r}")
    shown = redact(url)  # Credentials in it are never shown.
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"{what}, not {shown!r} ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"{what}, not {shown!r}")
