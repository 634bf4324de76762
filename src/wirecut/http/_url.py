"""``check_http_url``: the one check of a provider's base URL (an http:// or https:// URL).

A pure function; call it from any thread.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

__all__ = ["check_http_url"]


def check_http_url(name: str, url: object, *, shown: Callable[[str], str] = str) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``url`` is an http(s) URL with a host.

    ``shown`` is how the URL appears in the error (the proxy hides credentials in it).
    """
    what = f"{name} must be an http:// or https:// URL with a host"
    if not isinstance(url, str):
        raise ValueError(f"{what}, not {url!r}")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"{what}, not {shown(url)!r} ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"{what}, not {shown(url)!r}")
