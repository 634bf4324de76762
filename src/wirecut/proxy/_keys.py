"""Client keys: who may use the proxy, and the name each request is known by.

``--keys-file FILE`` holds one key a line, ``name token`` (blank lines and
``#`` comments are skipped); each record and ``/metrics`` carry the name of
the key a request came with, never its token. A client presents its token
as ``Authorization: Bearer TOKEN`` (the openai SDK's ``api_key``) or
``x-api-key: TOKEN`` (Anthropic's clients). ``--token-file`` is the
one-key form, whose requests carry no name.

``Keys.match`` looks a token up by its SHA-256 digest: the dict lookup
compares digests, never the tokens, so its time says nothing about how
much of a guess was right, and many keys cost no more than one.

``load_keys_file`` reads files (any thread); ``Keys`` is immutable and safe
from any thread.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from wirecut.proxy._config import ClientKey, check_keys

__all__ = ["ANONYMOUS", "Keys", "KeysFileError", "load_keys_file"]


class KeysFileError(Exception):
    """The keys file cannot be used; the message is one line that says where and why."""


@dataclass(frozen=True)
class _Who:
    """A request's client: the name of its key (None: the one-key form)."""

    name: str | None


#: What a request is when the proxy asks for no token.
ANONYMOUS = _Who(None)


class Keys:
    """The tokens the proxy accepts: none (anyone may come), one, or named keys."""

    def __init__(self, token: str | None = None, keys: tuple[ClientKey, ...] = ()) -> None:
        self._by_digest: dict[bytes, _Who] = {}
        if token is not None:
            self._by_digest[_digest(token.encode())] = ANONYMOUS
        for key in keys:
            self._by_digest[_digest(key.token.encode())] = _Who(key.name)
        #: True if a request must present a token.
        self.required = bool(self._by_digest)
        self.names = tuple(key.name for key in keys)

    def match(self, token: bytes | None) -> _Who | None:
        """The client ``token`` belongs to; None if it is no key of ours."""
        if not self.required:
            return ANONYMOUS
        if not token:
            return None
        return self._by_digest.get(_digest(token))


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def load_keys_file(path: Path) -> tuple[ClientKey, ...]:
    """The keys ``path`` holds, or ``KeysFileError`` naming the file, the line and why."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise KeysFileError(f"{path}: cannot be read ({why})") from None
    keys: list[ClientKey] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        parts = stripped.split()
        if len(parts) != 2:
            # The line may hold a token: never quote it.
            raise KeysFileError(
                f"{path}, line {number}: expected 'name token' (two words), found {len(parts)}"
            )
        try:
            keys.append(ClientKey(parts[0], parts[1]))
        except ValueError as exc:
            raise KeysFileError(f"{path}, line {number}: {exc}") from None
    if not keys:
        raise KeysFileError(f"{path}: holds no key (lines of 'name token')")
    try:
        check_keys(tuple(keys))
    except ValueError as exc:
        raise KeysFileError(f"{path}: {exc}") from None
    return tuple(keys)
