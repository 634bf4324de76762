"""The exceptions of the provider layer.

The tree::

    Exception
    └── ProviderError                 anything the provider or the way to it did wrong
        ├── ProviderConnectionError   could not connect, or the connection broke
        │                             (the message names the URL; ``retryable``
        │                             is False where a retry cannot help)
        ├── ProviderStatusError       an HTTP error status: ``status_code``, ``body``
        │                             (an excerpt) and ``retry_after``
        ├── ProviderResponseError     a response we cannot read: not JSON, nested too
        │                             deeply, malformed SSE, an error event in the
        │                             stream, larger than ``ResponseLimits`` allow
        └── ProviderTimeout           connect, read or write took longer than the timeout

    Every ``ProviderError`` raised by ``ChatClient.chat()`` carries ``usage``:
    what the requests it sent used, including the one that failed.

    BaseException
    └── wirecut.scope.Interrupted     the bound scope was cancelled; passes through
                                      untouched (``chat()`` returns a partial result
                                      instead once the request was sent)

httpx errors are translated in one place, ``map_http_errors``, with
``raise ... from exc``; under a cancelled scope an httpx error is the cut's
doing and becomes ``Interrupted`` (``wirecut.http.raise_if_cut``).
"""

from __future__ import annotations

import contextlib
import re
import ssl
from collections.abc import Iterator

import httpx

from wirecut.http import raise_if_cut
from wirecut.provider._result import Usage
from wirecut.scope import current_scope

__all__ = [
    "ProviderConnectionError",
    "ProviderError",
    "ProviderResponseError",
    "ProviderStatusError",
    "ProviderTimeout",
    "map_http_errors",
]

#: How much of an error body a ``ProviderStatusError`` keeps.
BODY_EXCERPT_CHARS = 200


class ProviderError(Exception):
    """The provider, or the way to it, failed; see the subclasses.

    ``usage`` is what the failed call's requests used (set by
    ``ChatClient.chat()``; None where no call counted it): tokens that
    arrived before a stream broke are not lost with the error.
    """

    usage: Usage | None = None


class ProviderConnectionError(ProviderError):
    """Could not connect to the provider at ``url``, or the connection broke.

    ``retryable`` is False when the same request cannot succeed later (a URL
    scheme the client cannot speak, a request it cannot form, a certificate
    that does not verify): ``ChatClient`` does not retry those.
    """

    def __init__(self, message: str, *, url: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.url = url
        self.retryable = retryable


class ProviderStatusError(ProviderError):
    """The provider answered with an HTTP error status.

    ``body`` is an excerpt of the response body (the first
    ``BODY_EXCERPT_CHARS`` characters); ``retry_after`` the seconds the
    provider asked us to wait, if it said.
    """

    def __init__(
        self, status_code: int, body: str, *, url: str, retry_after: float | None = None
    ) -> None:
        excerpt = body[:BODY_EXCERPT_CHARS]
        hint = v1_hint(url) if status_code == 404 else ""
        super().__init__(f"{url} answered HTTP {status_code}: {excerpt!r}{hint}")
        self.status_code = status_code
        self.body = excerpt
        self.url = url
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        """429 and 5xx: the same request may succeed later."""
        return self.status_code == 429 or self.status_code >= 500


def v1_hint(url: str) -> str:
    """For a 404 from ``url``: " (... try http://host:port/v1)" when its API base lacks ``/v1``.

    The API base of llama.cpp, vLLM, Ollama and OpenAI ends in ``/v1``; a URL
    given without it (``http://127.0.0.1:8080``) reaches ``/chat/completions``
    at the server's root, which they answer with a plain 404. "" otherwise.
    """
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return ""
    path = parsed.path.rstrip("/")
    for endpoint in ("/chat/completions", "/completions", "/models"):
        if path.endswith(endpoint):
            path = path[: -len(endpoint)]
            break
    if any(re.fullmatch(r"v\d+(beta\d*)?", part) for part in path.split("/")):
        return ""  # a versioned base (/v1, /api/v2): a 404 there is not about /v1
    base = str(parsed.copy_with(path=path + "/v1", query=None, fragment=None))
    return f" (an OpenAI-compatible API base usually ends in /v1: try {base})"


class ProviderResponseError(ProviderError):
    """The response could not be read: not JSON, malformed SSE, or an error event."""


class ProviderTimeout(ProviderError):
    """Connecting, reading or writing took longer than the client's timeout."""


@contextlib.contextmanager
def map_http_errors(url: str) -> Iterator[None]:
    """Translate the httpx errors raised inside the block into ``ProviderError``s.

    Under a cancelled bound scope an httpx error is the cut's doing (a shut
    down socket reads as EOF): it becomes ``Interrupted`` instead
    (``wirecut.http.raise_if_cut``). wirecut's own transport raises
    ``Interrupted`` itself; this covers any other transport. ``Interrupted``
    and ``ProviderError`` pass through: an error status that arrived whole is
    the provider's answer, whatever happened after it.
    """
    try:
        yield
    except httpx.HTTPError as exc:
        raise_if_cut(current_scope(), exc)
        if isinstance(exc, httpx.TimeoutException):
            raise ProviderTimeout(f"{url}: {type(exc).__name__}: {exc}") from exc
        if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError):
            raise ProviderConnectionError(
                f"cannot send a request to {url}: {exc}", url=url, retryable=False
            ) from exc
        if isinstance(exc, httpx.ConnectError):
            raise ProviderConnectionError(
                f"cannot connect to {url}: {exc}",
                url=url,
                retryable=not _caused_by(exc, ssl.SSLCertVerificationError),
            ) from exc
        if isinstance(exc, httpx.TransportError):
            raise ProviderConnectionError(
                f"connection to {url} failed: {type(exc).__name__}: {exc}", url=url
            ) from exc
        raise ProviderError(f"{url}: {type(exc).__name__}: {exc}") from exc


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """True if ``kind`` is in the chain of causes of ``exc`` (httpx -> httpcore -> ssl)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False
