"""``Upstream``: the OpenAI-compatible server behind the proxy, and what it is.

One ``wirecut.http.AsyncH1Client`` (a keep-alive pool on the proxy's event
loop) carries every request the proxy makes upstream. A request runs under
its own scope: the scope's cut shuts its socket down (the upstream sees the
close at once) and a cancel of the relaying task does the same.

Credentials in the upstream URL (``http://user:pass@host/v1``) are taken out
of it: they go with every request as ``Authorization: Basic`` (probes,
passthrough and completions alike), and the URL shown anywhere (``/health``,
errors, the banner, logs) is ``base_url``, which has none.

``probe()`` asks what the upstream is and how many slots it has: llama.cpp's
``/slots`` (the simulator's too) or ``/props``; vLLM's ``/metrics``; Ollama's
``/api/version``; llama.cpp's answers are read as the provider layer reads
them (``slots_in_listing``, ``slots_in_props``). A connect that fails ends it
at once (``unreachable``), a ``503`` (llama.cpp loading its model) too
(``loading``): neither is an answer to keep, and the proxy asks again until
the upstream says (``Proxy``).
Polling llama.cpp's ``/slots`` often delays its notice of closed clients, so
an upstream that answered is not asked again.

Event loop only.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx

from wirecut.http import AsyncH1Client, AsyncH1Response
from wirecut.provider import slots_in_listing, slots_in_props
from wirecut.scope import InterruptScope

__all__ = [
    "PROBE_TIMEOUT",
    "BodyTooLarge",
    "Upstream",
    "UpstreamInfo",
    "UpstreamKind",
    "read_bounded",
    "redact",
    "root_url",
]

#: Seconds one probe request may take (its connect included).
PROBE_TIMEOUT = 2.0


class UpstreamKind(enum.StrEnum):
    """What ``probe()`` found behind the upstream URL."""

    LLAMA_CPP = "llama.cpp"  # /slots or /props answered as llama.cpp's (the simulator too)
    VLLM = "vllm"  # /metrics has vllm: names
    OLLAMA = "ollama"  # /api/version answered
    OPENAI_COMPATIBLE = "openai-compatible"  # reachable, none of the above
    LOADING = "loading"  # it answered 503 (llama.cpp loading its model): ask again
    UNREACHABLE = "unreachable"  # no connection could be made: ask again


@dataclass(frozen=True)
class UpstreamInfo:
    """The upstream's kind, its slots when it says (None: unknown), and where they came from."""

    kind: UpstreamKind
    slots: int | None
    source: str | None = None  # "/slots" or "/props"

    @property
    def settled(self) -> bool:
        """True once the upstream answered as what it is (not unreachable, not loading)."""
        return self.kind not in (UpstreamKind.UNREACHABLE, UpstreamKind.LOADING)


class BodyTooLarge(Exception):
    """An upstream body passed its bound; the message says which."""


def root_url(base_url: str) -> str:
    """The server root of an OpenAI API base: ``http://h:p/v1`` -> ``http://h:p``."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def redact(url: str) -> str:
    """``url`` without the credentials of its userinfo (``user:pass@``)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


async def read_bounded(response: AsyncH1Response, limit: int, what: str) -> bytes:
    """The whole body of ``response``; ``BodyTooLarge`` once it passes ``limit`` bytes."""
    declared = response.header(b"content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"{what} is {int(declared)} bytes, more than the {limit} allowed")
    parts: list[bytes] = []
    size = 0
    while data := await response.receive():
        size += len(data)
        if size > limit:
            raise BodyTooLarge(f"{what} exceeds the {limit} bytes allowed")
        parts.append(data)
    return b"".join(parts)


class Upstream:
    """The upstream at ``base_url`` (an OpenAI API base, ``http://host:port/v1``).

    ``api_key`` (optional) goes to the upstream as ``Authorization: Bearer``;
    credentials in the URL as ``Basic`` (not both: ``ProxyConfig`` refuses
    that); the client's own ``Authorization`` never does. ``close()`` on the
    event loop, once at the end.
    """

    def __init__(
        self, base_url: str, *, api_key: str | None = None, connect_timeout: float = 5.0
    ) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        self.base_url = redact(base_url.rstrip("/"))
        self.root = root_url(self.base_url)
        #: The API base's path ("/v1"), and the server root's ("").
        self.prefix = parts.path.rstrip("/")
        self.root_prefix = urlsplit(self.root).path.rstrip("/")
        self._basic: str | None = None
        if parts.username is not None or parts.password is not None:
            user = unquote(parts.username or "")
            secret = unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{secret}".encode()).decode("ascii")
            self._basic = f"Basic {token}"
        self.headers: list[tuple[str, str]] = []
        self.authorize(api_key)
        # Shorter than the usual server keep-alive (5 s: uvicorn, llama.cpp),
        # so that a reused connection is not one the server is closing.
        self.client = AsyncH1Client(
            self.base_url, connect_timeout=connect_timeout, keepalive_expiry=2.0
        )

    def authorize(self, api_key: str | None) -> None:
        """Send ``api_key`` from now on (credentials in the URL go instead, if any)."""
        if self._basic is not None:
            self.headers = [("Authorization", self._basic)]
        elif api_key:
            self.headers = [("Authorization", f"Bearer {api_key}")]
        else:
            self.headers = []

    def target(self, path: str) -> str:
        """The request target of ``path`` under the API base (``chat/completions``)."""
        return f"{self.prefix}/{path.lstrip('/')}"

    def close(self) -> None:
        self.client.close()

    async def get(
        self, target: str, *, scope: InterruptScope | None, limit: int
    ) -> tuple[int, str, bytes]:
        """``GET`` ``target``; ``(status, content type, body)``.

        Raises ``httpx.HTTPError`` when the upstream cannot be reached or
        breaks off, ``BodyTooLarge`` past ``limit`` bytes, ``Interrupted``
        when ``scope`` cuts it.
        """
        response = await self.client.send("GET", target, self.headers, scope=scope)
        try:
            body = await read_bounded(response, limit, "the upstream's answer")
        finally:
            response.close()
        content_type = response.header(b"content-type") or b"application/json"
        return response.status_code, content_type.decode("latin-1"), body

    async def probe(self) -> UpstreamInfo:
        """What the upstream is and how many slots it has (see the module docstring)."""
        try:
            listed = slots_in_listing(_json(await self._probe_get("/slots")))
            if listed is not None:
                return UpstreamInfo(UpstreamKind.LLAMA_CPP, listed, "/slots")
            is_llama, total = slots_in_props(_json(await self._probe_get("/props")))
            if is_llama:
                return UpstreamInfo(UpstreamKind.LLAMA_CPP, total, "/props" if total else None)
            metrics = await self._probe_get("/metrics")
            if metrics is not None and b"vllm:" in metrics:
                return UpstreamInfo(UpstreamKind.VLLM, None)
            version = _json(await self._probe_get("/api/version"))
            if isinstance(version, dict) and "version" in version:
                return UpstreamInfo(UpstreamKind.OLLAMA, None)
        except _Unreachable:
            return UpstreamInfo(UpstreamKind.UNREACHABLE, None)
        except _Loading:
            return UpstreamInfo(UpstreamKind.LOADING, None)
        return UpstreamInfo(UpstreamKind.OPENAI_COMPATIBLE, None)

    async def _probe_get(self, path: str) -> bytes | None:
        """The body of a 200 answer to ``GET path`` under the root; None for any other."""
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                response = await self.client.send(
                    "GET", self.root_prefix + path, self.headers, scope=None
                )
                try:
                    if response.status_code == 503:
                        raise _Loading
                    if response.status_code != 200:
                        return None
                    return await read_bounded(response, 1 << 20, f"the upstream's {path}")
                finally:
                    response.close()
        except (httpx.ConnectError, httpx.ConnectTimeout):
            raise _Unreachable from None
        except TimeoutError:
            raise _Unreachable from None
        except (httpx.HTTPError, BodyTooLarge):
            return None


class _Unreachable(Exception):
    pass


class _Loading(Exception):
    pass


def _json(body: bytes | None) -> Any:
    if body is None:
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None
