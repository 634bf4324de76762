"""``ProxyConfig``: every setting of ``wirecut proxy``, with its defaults in one place.

``UpstreamSpec`` is one upstream (the one of ``--upstream``, or a
``[[upstream]]`` table of ``--config FILE``, ``_config_file``), ``ClientKey``
one named client key (``--keys-file``, ``_keys``). Validated in the
constructors: a bad value is a ``ValueError`` naming the field, never a
failure later in a request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from wirecut.http._core import check_http_url, check_seconds
from wirecut.provider import ResponseLimits
from wirecut.proxy._upstream import redact
from wirecut.serving import ConnectionLimits

__all__ = ["AUTO", "PROXY_CONNECTION_LIMITS", "ClientKey", "ProxyConfig", "UpstreamSpec"]

#: ``upstream_slots`` that means "ask the upstream" (llama.cpp's /slots or /props).
AUTO: Literal["auto"] = "auto"

#: The proxy's bounds on client connections (``wirecut.serving``, the console's
#: implementation): more of them than the console's (a team's streams), and a
#: larger request head (SDKs send long headers), and the longest listen backlog
#: the descriptor reserve allows (thousands of streams may open at once).
PROXY_CONNECTION_LIMITS = ConnectionLimits(
    max_connections=4096, max_head=64 * 1024, accept_backlog=128
)


@dataclass(frozen=True)
class UpstreamSpec:
    """One upstream the proxy serves (docs/proxy.md, "Several upstreams").

    - ``url``: its OpenAI API base (``http://host:port/v1``).
    - ``models``: the model names it serves, each a name or a ``prefix*``
      (``*`` alone: any model). A request goes to the upstream that names its
      model exactly, else to the one with the longest matching prefix.
    - ``slots``: requests in flight there at once (a number, ``"auto"``:
      from llama.cpp's /slots or /props, else unlimited; None: unlimited).
    - ``api_key``: sent to it (``Authorization: Bearer``).
    - ``timeout``: seconds from a request's arrival to its cut, for the
      requests routed here (None: the proxy's ``request_timeout``).
    """

    url: str
    models: tuple[str, ...] = ("*",)
    slots: int | Literal["auto"] | None = AUTO
    api_key: str | None = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        # Credentials in the URL are never shown.
        check_http_url("upstream", self.url, shown=redact)
        if self.api_key and "@" in urlsplit(self.url).netloc:
            raise ValueError(
                "the upstream URL carries credentials (user:password@) and an API key was "
                "given too: give the upstream's credentials one way"
            )
        if not (
            self.slots is None
            or self.slots == AUTO
            or (
                isinstance(self.slots, int) and not isinstance(self.slots, bool) and self.slots >= 1
            )
        ):
            raise ValueError(
                f"slots must be 'auto', a whole number >= 1 or None, not {self.slots!r}"
            )
        if isinstance(self.models, str) or not self.models:
            raise ValueError(f"models must be a non-empty list of names, not {self.models!r}")
        for model in self.models:
            if not isinstance(model, str) or not model.strip() or "*" in model.rstrip("*"):
                raise ValueError(
                    f"each of models must be a name or a prefix ending in one '*', not {model!r}"
                )
            if model.endswith("**"):
                raise ValueError(f"a model prefix ends in one '*', not {model!r}")
        if len(set(self.models)) != len(self.models):
            raise ValueError(f"models names one model twice: {list(self.models)!r}")
        if self.timeout is not None:
            check_seconds("timeout", self.timeout)
        object.__setattr__(self, "url", self.url.rstrip("/"))
        object.__setattr__(self, "models", tuple(self.models))

    def match(self, model: str) -> int | None:
        """How closely this upstream names ``model``: None: not at all; larger: closer.

        An exact name beats every prefix; a longer prefix beats a shorter one.
        """
        best: int | None = None
        for pattern in self.models:
            if pattern == model:
                return _EXACT
            if pattern.endswith("*") and model.startswith(pattern[:-1]):
                best = max(best or 0, len(pattern) - 1)
        return best


#: ``UpstreamSpec.match`` for an exact name: beats any prefix.
_EXACT = 1 << 30


@dataclass(frozen=True)
class ClientKey:
    """A client token and the name it is known by in records and /metrics."""

    name: str
    token: str = field(repr=False)

    def __post_init__(self) -> None:
        if not _KEY_NAME.fullmatch(self.name):
            raise ValueError(
                f"a key name is 1-64 letters, digits, '.', '_' or '-', not {self.name!r}"
            )
        if not self.token or any(c.isspace() for c in self.token):
            raise ValueError(f"the token of key {self.name!r} must be non-empty, without spaces")


_KEY_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True)
class ProxyConfig:
    """What one proxy serves and how (docs/proxy.md).

    - ``upstream``: the upstream's OpenAI API base (``http://host:port/v1``),
      the one-upstream form; or ``upstreams``: several (``UpstreamSpec``),
      from ``config_file`` when there is one (reread on ``Proxy.reload``).
      Exactly one of the two.
    - ``host``, ``port``: where to listen (port 0: any free one).
    - ``model``: the model asked for when a client names none.
    - ``upstream_slots``: requests in flight upstream at once: a number,
      ``"auto"`` (from llama.cpp's /slots or /props, else unlimited) or None
      (unlimited); the one-upstream form only (``UpstreamSpec.slots``).
    - ``token``: the client token (``Authorization: Bearer``); None: none is
      asked for, which only a loopback ``host`` may do. Or ``keys``: named
      client tokens (``ClientKey``), from ``keys_file`` when there is one
      (reread on ``Proxy.reload``); not both.
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

    upstream: str | None = None
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
    upstreams: tuple[UpstreamSpec, ...] = ()
    config_file: Path | None = None
    keys: tuple[ClientKey, ...] = ()
    keys_file: Path | None = None

    def __post_init__(self) -> None:
        slots = self.upstream_slots
        if not (
            slots is None
            or slots == AUTO
            or (isinstance(slots, int) and not isinstance(slots, bool) and slots >= 1)
        ):
            raise ValueError(
                f"upstream_slots must be 'auto', a whole number >= 1 or None, not {slots!r}"
            )
        if (self.upstream is None) == (not self.upstreams):
            raise ValueError("give the upstream (one URL) or upstreams (several), one of the two")
        if self.upstream is not None:
            spec = UpstreamSpec(self.upstream, ("*",), self.upstream_slots, self.api_key)
            object.__setattr__(self, "upstream", spec.url)
            object.__setattr__(self, "upstreams", (spec,))
        elif self.api_key is not None or self.upstream_slots != AUTO:
            raise ValueError(
                "api_key and upstream_slots belong to the one-upstream form: "
                "give each upstream's own (UpstreamSpec)"
            )
        check_routes(self.upstreams)
        if self.token is not None and self.keys:
            raise ValueError("give one client token or named keys, not both")
        check_keys(self.keys)
        if (
            not isinstance(self.port, int)
            or isinstance(self.port, bool)
            or not 0 <= self.port <= 65535
        ):
            raise ValueError(f"port must be 0-65535, not {self.port!r}")
        for name in ("request_timeout", "unwind_timeout", "connect_timeout"):
            check_seconds(name, getattr(self, name))
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
        object.__setattr__(
            self, "allowed_hosts", tuple(name.strip().lower() for name in self.allowed_hosts)
        )


def check_routes(upstreams: tuple[UpstreamSpec, ...]) -> None:
    """``ValueError`` if two upstreams claim one model name or prefix (a request's way is one)."""
    owner: dict[str, str] = {}
    for spec in upstreams:
        for pattern in spec.models:
            if pattern in owner and owner[pattern] != spec.url:
                raise ValueError(
                    f"the model {pattern!r} is claimed by two upstreams: "
                    f"{redact(owner[pattern])} and {redact(spec.url)}"
                )
            owner[pattern] = spec.url
    urls = [spec.url for spec in upstreams]
    if len(set(urls)) != len(urls):
        raise ValueError("an upstream URL is given twice: give each upstream once")


def check_keys(keys: tuple[ClientKey, ...]) -> None:
    """``ValueError`` if two keys share a name or a token."""
    names = [key.name for key in keys]
    if len(set(names)) != len(names):
        raise ValueError("two keys have one name: give each key its own")
    if len({key.token for key in keys}) != len(keys):
        raise ValueError("two keys have one token: give each key its own")
