"""``--config FILE``: the upstreams of a proxy, as TOML (stdlib ``tomllib``).

::

    [[upstream]]
    url = "http://127.0.0.1:8080/v1"      # the OpenAI API base
    models = ["qwen-chat", "qwen*"]        # names, or prefixes ending in "*"
    slots = "auto"                         # or a whole number
    api_key_file = "llama.key"             # relative to this file
    timeout = 600                          # seconds from arrival to the cut

Only ``url`` is required (``models`` defaults to ``["*"]``: any model).
Anything else is refused, so that a typo is not silently ignored. A problem
is one ``ConfigFileError`` line naming the file, the line when it can be
found, the table and the field: ``proxy.toml, line 7: upstream #2: 'slots'
must be "auto" or a whole number >= 1, not 0``.

Pure (reads files); call from any thread.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Any

from wirecut.proxy._config import AUTO, UpstreamSpec, check_routes

__all__ = ["ConfigFileError", "load_config_file"]

_FIELDS = ("url", "models", "slots", "api_key_file", "timeout")
_TABLE = re.compile(r"^\s*\[\[\s*upstream\s*\]\]")


class ConfigFileError(Exception):
    """The config file cannot be used; the message is one line that says where and why."""


def load_config_file(path: Path) -> tuple[UpstreamSpec, ...]:
    """The upstreams ``path`` names, or ``ConfigFileError`` saying what is wrong with it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"{path}: cannot be read ({_why(exc)})") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{path}: not valid TOML: {exc}") from None
    lines = text.splitlines()
    extra = sorted(set(document) - {"upstream"})
    if extra:
        raise ConfigFileError(
            f"{path}: unknown setting {extra[0]!r}: the file holds [[upstream]] tables only"
        )
    tables = document.get("upstream")
    if not isinstance(tables, list) or not tables:
        raise ConfigFileError(f"{path}: no [[upstream]] table: name at least one upstream")
    specs = tuple(_spec(path, lines, number, table) for number, table in enumerate(tables, start=1))
    try:
        check_routes(specs)
    except ValueError as exc:
        raise ConfigFileError(f"{path}: {exc}") from None
    return specs


def _spec(path: Path, lines: list[str], number: int, table: Any) -> UpstreamSpec:
    def fail(field: str | None, message: str) -> ConfigFileError:
        line = _line_of(lines, number, field)
        where = f"{path}, line {line}" if line is not None else str(path)
        return ConfigFileError(f"{where}: upstream #{number}: {message}")

    if not isinstance(table, dict):
        raise fail(None, "must be a table")
    for field in table:
        if field not in _FIELDS:
            known = ", ".join(_FIELDS)
            raise fail(field, f"unknown field {field!r} (known: {known})")
    url = table.get("url")
    if not isinstance(url, str):
        raise fail("url" if "url" in table else None, "'url' is required: the OpenAI API base")
    models = table.get("models", ["*"])
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise fail("models", "'models' must be a list of model names or 'prefix*' strings")
    slots = table.get("slots", AUTO)
    if not (
        slots == AUTO or (isinstance(slots, int) and not isinstance(slots, bool) and slots >= 1)
    ):
        raise fail("slots", f"'slots' must be \"auto\" or a whole number >= 1, not {slots!r}")
    timeout = table.get("timeout")
    if timeout is not None and not (
        isinstance(timeout, int | float)
        and not isinstance(timeout, bool)
        and math.isfinite(timeout)
        and timeout > 0
    ):
        raise fail("timeout", f"'timeout' must be a number of seconds > 0, not {timeout!r}")
    api_key = None
    key_file = table.get("api_key_file")
    if key_file is not None:
        if not isinstance(key_file, str) or not key_file:
            raise fail("api_key_file", "'api_key_file' must be a file name")
        key_path = (path.parent / key_file).expanduser()
        try:
            api_key = key_path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = f"'api_key_file' {key_path} cannot be read ({_why(exc)})"
            raise fail("api_key_file", why) from None
        if not api_key:
            raise fail("api_key_file", f"'api_key_file' {key_path} is empty")
    try:
        return UpstreamSpec(
            url,
            tuple(models),
            slots,
            api_key,
            None if timeout is None else float(timeout),
        )
    except ValueError as exc:
        said = str(exc).lower()
        field = next((f for f in ("url", "model", "timeout") if f in said), None)
        field = "models" if field == "model" else field
        raise fail(field, str(exc)) from None


def _line_of(lines: list[str], number: int, field: str | None) -> int | None:
    """The line (1-based) of ``field`` in the ``number``-th ``[[upstream]]`` table, if found."""
    heads = [i for i, line in enumerate(lines) if _TABLE.match(line)]
    if len(heads) < number:
        return None  # Written another way (inline tables): the message names the table.
    start = heads[number - 1]
    end = heads[number] if number < len(heads) else len(lines)
    if field is None:
        return start + 1
    pattern = re.compile(rf"^\s*[\"']?{re.escape(field)}[\"']?\s*=")
    for i in range(start, end):
        if pattern.match(lines[i]):
            return i + 1
    return start + 1


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc)
