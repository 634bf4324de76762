"""Where the console is and which token it wants: from a URL, or from ``serve.json``.

A URL may be the page's (``http://HOST:PORT/``, as ``wirecut serve`` prints
it, ``?token=`` included) or the WebSocket's (``ws://HOST:PORT/api/console``);
a path before ``/api/console`` is kept, so a console behind a reverse proxy at
``/wirecut/`` works. The token comes from ``?token=``, else ``WIRECUT_TOKEN``.
Without a URL, ``serve.json`` in the data directory (written by a local
``wirecut serve``) gives both.

The token is never put in ``display``: it is what error lines show. A URL
that cannot be made out is shown ``redact``ed (its ``token=`` value and any
password hidden), so an error line never carries the secret either.

``serve.json`` also names the server's ``instance``: before the token goes
anywhere, the client has the server prove it holds the token for that
instance (``/api/proof``, ``_link.py``), so a file left by a server that died
never hands the token to whatever took its port.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

__all__ = [
    "SERVE_JSON",
    "TOKEN_ENV",
    "Address",
    "AddressError",
    "from_serve_json",
    "from_url",
    "pid_alive",
    "redact",
]

#: The environment variable that gives the token when the URL has none.
TOKEN_ENV = "WIRECUT_TOKEN"
#: The file a local ``wirecut serve`` writes into the data directory.
SERVE_JSON = "serve.json"

_SCHEMES = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
_API = "/api/console"
# A token= value (also percent-encoded, as in a URL inside a URL), and a
# password in a URL's user part. Written to match malformed URLs too: what
# fails to parse is exactly what gets shown.
_TOKEN_VALUE = re.compile(r"((?:\?|&|;|%3[Ff]|%26)token=)[^&;#\s\"']*", re.IGNORECASE)
_PASSWORD = re.compile(r"(//[^/?#@\s:]*:)[^/?#@\s]*@")


def redact(text: str) -> str:
    """``text`` with every ``token=`` value and URL password replaced by ``[redacted]``."""
    return _PASSWORD.sub(r"\1[redacted]@", _TOKEN_VALUE.sub(r"\1[redacted]", text))


class AddressError(Exception):
    """The console's address cannot be made out; the message says why, in one line."""


@dataclass(frozen=True)
class Address:
    """A console: its WebSocket URL, its health URL, and the token to show them."""

    #: ``ws://HOST:PORT/api/console``, without the token.
    ws_url: str
    #: ``http://HOST:PORT/api/health``, without the token.
    health_url: str
    #: ``http://HOST:PORT/``: what messages name (never the token).
    display: str
    token: str | None
    #: Where the token came from, for messages: "the URL's ?token=", "$WIRECUT_TOKEN", ...
    token_from: str | None
    #: Where the address came from, for messages: "the URL", "serve.json (PATH)".
    source: str
    #: The pid ``serve.json`` named, if it came from there.
    pid: int | None = None
    #: The server's instance ``serve.json`` named: the token goes only to a
    #: server that proves it holds it for this instance (None: from a URL).
    instance: str | None = None

    @property
    def proof_url(self) -> str:
        """``http://HOST:PORT/api/proof``: where the server proves it holds the token."""
        return self.health_url[: -len("health")] + "proof"

    @property
    def loopback(self) -> bool:
        """True when the host is a loopback address (no proxy is ever used for it)."""
        host = urlsplit(self.ws_url).hostname or ""
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False


def from_url(url: str, *, env: dict[str, str] | None = None, source: str = "the URL") -> Address:
    """The console at ``url``; the token from its ``?token=``, else ``$WIRECUT_TOKEN``.

    Raises ``AddressError`` naming what is wrong with ``url``.
    """
    environ = os.environ if env is None else env
    shown = repr(redact(url))
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise AddressError(f"{shown} is not a URL: {redact(str(exc))}") from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise AddressError(
            f"{shown} is not a console URL: use http://HOST:PORT/ (as `wirecut serve` prints it)"
            " or ws://HOST:PORT/api/console"
        )
    if not parts.hostname:
        raise AddressError(f"{shown} names no host")
    query = parse_qs(parts.query)
    tokens = query.get("token")
    if tokens:
        token, token_from = tokens[0], "the URL's ?token="
    elif environ.get(TOKEN_ENV):
        token, token_from = environ[TOKEN_ENV], f"${TOKEN_ENV}"
    else:
        token, token_from = None, None
    netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    if port is not None:
        netloc = f"{netloc}:{port}"
    base = parts.path.rstrip("/")
    if base.endswith(_API):
        base = base[: -len(_API)]
    http = "https" if _SCHEMES[scheme] == "wss" else "http"
    return Address(
        ws_url=urlunsplit((_SCHEMES[scheme], netloc, base + _API, "", "")),
        health_url=urlunsplit((http, netloc, base + "/api/health", "", "")),
        display=urlunsplit((http, netloc, base + "/", "", "")),
        token=token,
        token_from=token_from,
        source=source,
    )


def from_serve_json(data_dir: Path) -> Address:
    """The console a local ``wirecut serve`` announced in ``data_dir/serve.json``.

    Raises ``AddressError`` when there is none or it cannot be read.
    """
    path = data_dir / SERVE_JSON
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AddressError(
            f"no URL given and no console is running here ({path} does not exist): "
            "start `wirecut serve`, or give the console's URL"
        ) from None
    except (OSError, ValueError) as exc:
        raise AddressError(f"cannot read {path}: {exc}") from None
    if not isinstance(info, dict) or not isinstance(info.get("url"), str):
        raise AddressError(f"{path} holds no console URL")
    token = info.get("token")
    token = token if isinstance(token, str) and token else None
    pid = info.get("pid")
    instance = info.get("instance")
    instance = instance if isinstance(instance, str) and instance else None
    if token is not None and instance is None:
        raise AddressError(
            f"{path} names no server instance (an older `wirecut serve` wrote it), so the "
            "server there cannot prove it is the one that holds its token: restart "
            "`wirecut serve`, or give the console's URL"
        )
    try:
        address = from_url(info["url"], env={}, source=str(path))
    except AddressError as exc:
        raise AddressError(f"{path}: {exc}") from None
    return Address(
        ws_url=address.ws_url,
        health_url=address.health_url,
        display=address.display,
        token=token,
        token_from=None if token is None else str(path),
        source=address.source,
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        instance=instance,
    )


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists (ours to signal or not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
