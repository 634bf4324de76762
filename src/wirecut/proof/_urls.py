"""Checking a provider URL given on the command line, at the boundary."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["url_problem"]


def url_problem(url: str) -> str | None:
    """Why ``url`` is not an http(s) API base, in one line; None when it is one."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a bad port
    except ValueError as exc:
        return f"{url!r} is not a URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return f"{url!r} is not an http:// or https:// URL (example: http://127.0.0.1:8080/v1)"
    if not parts.hostname:
        return f"{url!r} has no host (example: http://127.0.0.1:8080/v1)"
    return None
