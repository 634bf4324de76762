"""``Upstream``: the OpenAI-compatible server behind the proxy, and what it is.

One ``wirecut.http`` client (the scoped transport) serves every request the
proxy makes upstream; each request runs in a thread with its own scope bound,
so the scope's cut shuts that request's socket down (docs/architecture.md,
facts 1-3) and the upstream sees the close. ``probe()`` asks what the
upstream is and how many slots it has: llama.cpp's ``/slots`` (the
simulator's too) or ``/props``; vLLM's ``/metrics``; Ollama's
``/api/version``. It is asked once at start (and again while unreachable):
polling llama.cpp's ``/slots`` often delays its notice of closed clients.

Sync: call from a worker thread (``wirecut.aio.run_sync``), never on the loop.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import httpx

import wirecut.http

__all__ = ["PROBE_TIMEOUT", "Upstream", "UpstreamInfo", "UpstreamKind", "root_url"]

#: Seconds one probe request may take.
PROBE_TIMEOUT = 2.0


class UpstreamKind(enum.StrEnum):
    """What ``probe()`` found behind the upstream URL."""

    LLAMA_CPP = "llama.cpp"  # /slots or /props answered as llama.cpp's (the simulator too)
    VLLM = "vllm"  # /metrics has vllm: names
    OLLAMA = "ollama"  # /api/version answered
    OPENAI_COMPATIBLE = "openai-compatible"  # reachable, none of the above
    UNREACHABLE = "unreachable"  # no connection could be made


@dataclass(frozen=True)
class UpstreamInfo:
    """The upstream's kind, and its slots when it says (None: unknown)."""

    kind: UpstreamKind
    slots: int | None


def root_url(base_url: str) -> str:
    """The server root of an OpenAI API base: ``http://h:p/v1`` -> ``http://h:p``."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


class Upstream:
    """The upstream at ``base_url`` (an OpenAI API base, ``http://host:port/v1``).

    ``api_key`` (optional) goes to the upstream as ``Authorization: Bearer``;
    the client's own ``Authorization`` never does. Safe to share between
    threads; ``close()`` once at the end.
    """

    def __init__(
        self, base_url: str, *, api_key: str | None = None, connect_timeout: float = 5.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.root = root_url(self.base_url)
        self.headers: dict[str, str] = {}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        # No read timeout: a prompt may take minutes before its first byte;
        # the request's own scope (--request-timeout, a cancel, the client
        # leaving) ends a wait, by a cut.
        self.http = wirecut.http.client(
            timeout=httpx.Timeout(None, connect=connect_timeout),
            connect_timeout=connect_timeout,
            # Shorter than the usual server keep-alive (5 s: uvicorn, llama.cpp),
            # so that a reused connection is not one the server is closing.
            limits=httpx.Limits(
                max_connections=None, max_keepalive_connections=None, keepalive_expiry=2.0
            ),
            trust_env=False,
        )

    def url(self, path: str) -> str:
        """The upstream URL of ``path`` under the API base (``chat/completions``)."""
        return f"{self.base_url}/{path.lstrip('/')}"

    def close(self) -> None:
        self.http.close()

    def get(self, path: str, query: str) -> tuple[int, str, bytes]:
        """``GET`` ``path`` under the API base; ``(status, content type, body)``.

        Raises ``httpx.HTTPError`` when the upstream cannot be reached, and
        ``Interrupted`` when the bound scope cuts it.
        """
        url = self.url(path) + (f"?{query}" if query else "")
        response = self.http.get(url, headers=self.headers)
        return (
            response.status_code,
            response.headers.get("content-type", "application/json"),
            response.content,
        )

    def probe(self) -> UpstreamInfo:
        """What the upstream is and how many slots it has (see the module docstring)."""
        reached = False

        def get(path: str) -> httpx.Response | None:
            nonlocal reached
            try:
                response = self.http.get(
                    self.root + path, headers=self.headers, timeout=PROBE_TIMEOUT
                )
            except httpx.HTTPError:
                return None
            reached = True
            return response if response.status_code == 200 else None

        listing = _json(get("/slots"))
        if (
            isinstance(listing, list)
            and listing
            and all(isinstance(slot, dict) and "is_processing" in slot for slot in listing)
        ):
            return UpstreamInfo(UpstreamKind.LLAMA_CPP, len(listing))
        props = _json(get("/props"))
        if isinstance(props, dict) and (
            "total_slots" in props or "default_generation_settings" in props
        ):
            total = props.get("total_slots")
            slots = total if isinstance(total, int) and total > 0 else None
            return UpstreamInfo(UpstreamKind.LLAMA_CPP, slots)
        metrics = get("/metrics")
        if metrics is not None and "vllm:" in metrics.text:
            return UpstreamInfo(UpstreamKind.VLLM, None)
        version = _json(get("/api/version"))
        if isinstance(version, dict) and "version" in version:
            return UpstreamInfo(UpstreamKind.OLLAMA, None)
        if not reached:
            return UpstreamInfo(UpstreamKind.UNREACHABLE, None)
        return UpstreamInfo(UpstreamKind.OPENAI_COMPATIBLE, None)


def _json(response: httpx.Response | None) -> Any:
    if response is None:
        return None
    try:
        return response.json()
    except ValueError:
        return None
