"""Make third-party HTTP clients cuttable under a bound scope.

- ``openai_client()``: an ``openai.OpenAI`` whose requests and retry backoff
  a cancel cuts (it uses ``openai_http_client()``).
- ``openai_http_client()``: an ``httpx2.Client`` for ``openai.OpenAI(http_client=...)``;
  cuts requests, but the SDK's own retry backoff stays a plain ``time.sleep``.
- ``ScopedHTTPAdapter``: a ``requests`` adapter to mount on a ``Session``.

Each imports its library only when used, so ``wirecut.adapters`` costs nothing
to import where the library is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from wirecut.http import DEFAULT_CONNECT_TIMEOUT

if TYPE_CHECKING:
    import httpx2
    import openai

    from wirecut.adapters._requests import ScopedHTTPAdapter

__all__ = ["ScopedHTTPAdapter", "openai_client", "openai_http_client"]


def openai_client(
    *, connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT, **openai_kwargs: Any
) -> openai.OpenAI:
    """An ``openai.OpenAI`` that a cancel cuts anywhere, retry backoff included.

    See ``wirecut.adapters._openai_sdk``.
    """
    from wirecut.adapters._openai_sdk import openai_client as make

    return make(connect_timeout=connect_timeout, **openai_kwargs)


def openai_http_client(
    *, connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT, **client_kwargs: Any
) -> httpx2.Client:
    """An ``httpx2.Client`` that makes the official openai SDK's requests cuttable.

    Pass it as ``openai.OpenAI(http_client=openai_http_client())``. See
    ``wirecut.adapters._openai`` for what a cut looks like to the SDK.
    """
    from wirecut.adapters._openai import openai_http_client as make

    return make(connect_timeout=connect_timeout, **client_kwargs)


def __getattr__(name: str) -> Any:
    if name == "ScopedHTTPAdapter":
        from wirecut.adapters._requests import ScopedHTTPAdapter

        return ScopedHTTPAdapter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "ScopedHTTPAdapter"])
