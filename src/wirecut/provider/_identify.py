"""What answers at a provider URL: ``identify_provider`` and ``base_url_problem``.

``wirecut serve`` asks once at start, so that a provider that is down,
silent, not HTTP or not an OpenAI API is named in one line at once rather
than by a ``chat`` that hangs for its timeout. The question is bounded as a
whole (``timeout``, 2 s by default) and so is every answer read (a hostile
server gets no more than ``MAX_ANSWER_BYTES`` read from it).

``identify_provider`` blocks the calling thread for at most about
``timeout`` seconds; call it from any thread. It sends GET requests only.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

import httpx

from wirecut import _json
from wirecut.provider._errors import v1_hint

__all__ = ["ProviderIdentity", "ProviderKind", "base_url_problem", "identify_provider"]

#: How long ``identify_provider`` may take by default, in seconds.
IDENTIFY_TIMEOUT = 2.0
#: The most of one answer it reads.
MAX_ANSWER_BYTES = 256 * 1024

_EXAMPLE = "example: http://127.0.0.1:8080/v1"


def base_url_problem(url: str) -> str | None:
    """Why ``url`` is not an http(s) API base with a host and a valid port, in one line.

    None when it is one. The same rule as ``ChatClient``'s ``base_url``.
    """
    shown = repr(url) if len(url) <= 200 else repr(url[:200]) + "..."
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        return f"{shown} is not a URL: {exc} ({_EXAMPLE})"
    if parsed.scheme not in ("http", "https"):
        return f"{shown} is not an http:// or https:// URL ({_EXAMPLE})"
    # httpx percent-encodes what a host name cannot hold ("a b" -> "a%20b").
    if not parsed.host or "%" in parsed.host:
        return f"{shown} has no valid host ({_EXAMPLE})"
    # httpx takes any port number; a socket takes 1..65535.
    if parsed.port is not None and not 0 < parsed.port <= 65535:
        return f"{shown} has port {parsed.port}, not one of 1..65535 ({_EXAMPLE})"
    return None


class ProviderKind(enum.StrEnum):
    """What answered; the values are those of the proxy's ``upstream.kind`` (docs/protocol.md)."""

    LLAMA_CPP = "llama.cpp"  # its /v1/models or /props
    VLLM = "vllm"  # its /v1/models or /version
    OLLAMA = "ollama"  # its /v1/models or /api/version
    OPENAI_COMPATIBLE = "openai-compatible"  # a model list at /v1/models, nothing more specific
    NOT_OPENAI = "not-openai"  # something answered, but not as an OpenAI API
    UNREACHABLE = "unreachable"  # nothing answered: refused, silent or unresolvable


_NAMES = {
    ProviderKind.LLAMA_CPP: "llama.cpp",
    ProviderKind.VLLM: "vLLM",
    ProviderKind.OLLAMA: "Ollama",
    ProviderKind.OPENAI_COMPATIBLE: "an OpenAI-compatible API",
}

# /v1/models' "owned_by" as each server sets it.
_OWNERS = {"llamacpp": ProviderKind.LLAMA_CPP, "vllm": ProviderKind.VLLM}


@dataclass(frozen=True)
class ProviderIdentity:
    """The answer: ``kind``, and ``detail`` saying what was seen, for people."""

    kind: ProviderKind
    detail: str
    models: tuple[str, ...] = ()

    @property
    def answered(self) -> bool:
        """True when an OpenAI-compatible API answered (chat can work)."""
        return self.kind not in (ProviderKind.NOT_OPENAI, ProviderKind.UNREACHABLE)

    def line(self, base_url: str) -> str:
        """One line for the banner."""
        if self.kind is ProviderKind.UNREACHABLE:
            return f"nothing answered at {base_url}: {self.detail}"
        if self.kind is ProviderKind.NOT_OPENAI:
            return f"{base_url} answered, but not as an OpenAI API: {self.detail}"
        return f"{_NAMES[self.kind]} answered at {base_url} ({self.detail})"


def identify_provider(
    base_url: str, *, api_key: str | None = None, timeout: float = IDENTIFY_TIMEOUT
) -> ProviderIdentity:
    """Ask ``base_url`` what it is, within about ``timeout`` seconds; never raises for its answers.

    ``GET BASE/models`` first (the OpenAI API); its ``owned_by`` names
    llama.cpp and vLLM. When it does not, ``/props`` (llama.cpp),
    ``/api/version`` (Ollama) and ``/version`` (vLLM) at the server root, as
    long as time is left. ``base_url`` must pass ``base_url_problem``.
    """
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    root = base_url.rstrip("/").removesuffix("/v1")
    with httpx.Client(headers=headers, follow_redirects=False) as http:
        first = _get(http, base_url.rstrip("/") + "/models", deadline)
        if isinstance(first, _Failure):
            failed = ProviderKind.UNREACHABLE if first.unreachable else ProviderKind.NOT_OPENAI
            return ProviderIdentity(failed, first.why)
        status, content_type, body = first
        if status in (401, 403):
            return ProviderIdentity(
                ProviderKind.OPENAI_COMPATIBLE,
                f"GET /models answered HTTP {status}: check the API key",
            )
        listing = _parse(body) if status == 200 else None
        models, owners = _models(listing)
        if models is None:
            what = f"GET /models gave HTTP {status}"
            if content_type:
                what += f" {content_type.split(';')[0].strip()}"
            hint = v1_hint(base_url) if status == 404 else ""
            return ProviderIdentity(ProviderKind.NOT_OPENAI, f"{what}, not a model list{hint}")
        kind: ProviderKind | None = next((_OWNERS[o] for o in owners if o in _OWNERS), None)
        if kind is None and all(":" in m for m in models) and models:
            kind = ProviderKind.OLLAMA  # "llama3.2:latest": Ollama's names carry a tag.
        for path, found in (
            ("/props", ProviderKind.LLAMA_CPP),
            ("/api/version", ProviderKind.OLLAMA),
            ("/version", ProviderKind.VLLM),
        ):
            # The simulator says it is one in owned_by; its llama.cpp-like /props must
            # not make it "llama.cpp".
            if kind is not None or "wirecut" in owners or time.monotonic() >= deadline:
                break
            answer = _get(http, root + path, deadline)
            if not isinstance(answer, _Failure) and answer[0] == 200:
                if _looks_like(found, _parse(answer[2])):
                    kind = found
        if kind is None:
            kind = ProviderKind.OPENAI_COMPATIBLE
        if "wirecut" in owners and kind is ProviderKind.OPENAI_COMPATIBLE:
            detail = "the wirecut simulator"
        elif models:
            shown = ", ".join(models[:3]) + (", ..." if len(models) > 3 else "")
            detail = f"models: {shown}"
        else:
            detail = "it lists no model"
        return ProviderIdentity(kind, detail, tuple(models))


@dataclass(frozen=True)
class _Failure:
    unreachable: bool  # nothing answered (else: something did, but not HTTP)
    why: str


def _get(http: httpx.Client, url: str, deadline: float) -> tuple[int, str, bytes] | _Failure:
    """Status, content type and (at most ``MAX_ANSWER_BYTES`` of) the body; or why none came."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return _Failure(True, "no answer in time")
    try:
        with http.stream("GET", url, timeout=remaining) as response:
            body = bytearray()
            for chunk in response.iter_raw():
                body += chunk
                if len(body) >= MAX_ANSWER_BYTES or time.monotonic() >= deadline:
                    break
            return response.status_code, response.headers.get("content-type", ""), bytes(body)
    except httpx.ConnectTimeout:
        return _Failure(True, f"no connection within {remaining:.1f} s")
    except httpx.TimeoutException:
        silent = f"it took the connection but sent nothing within {remaining:.1f} s"
        return _Failure(True, silent)
    except httpx.ConnectError as exc:
        return _Failure(True, f"cannot connect ({_reason(exc)})")
    except httpx.HTTPError as exc:
        return _Failure(False, f"what it sent is not HTTP ({type(exc).__name__}: {_reason(exc)})")


def _reason(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def _parse(body: bytes) -> object:
    try:
        return _json.loads(body)
    except _json.JSONError:
        return None


def _models(listing: object) -> tuple[list[str] | None, set[str]]:
    """The model ids and owners of an OpenAI ``/models`` answer; None if it is not one."""
    if not isinstance(listing, dict) or not isinstance(listing.get("data"), list):
        return None, set()
    models: list[str] = []
    owners: set[str] = set()
    for entry in listing["data"]:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            models.append(entry["id"][:100])
            if isinstance(entry.get("owned_by"), str):
                owners.add(entry["owned_by"].lower())
    return models, owners


def _looks_like(kind: ProviderKind, body: object) -> bool:
    if not isinstance(body, dict):
        return False
    if kind is ProviderKind.LLAMA_CPP:
        return "default_generation_settings" in body or "total_slots" in body
    return isinstance(body.get("version"), str)
