"""Command-line pieces that ``serve`` and ``proxy`` share: secrets, ports, hosts, seconds.

Each turns bad input into one usage line (exit 2) or one line and exit 1,
never a traceback (docs/protocol.md, "Command line").
"""

from __future__ import annotations

import ipaddress
import math
import os
import socket
import sys
from pathlib import Path

import click

__all__ = ["check_port", "is_loopback", "seconds", "secret"]

#: A secret file larger than this is not a secret file.
MAX_SECRET_BYTES = 64 * 1024


def seconds(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A click callback: a finite number of seconds > 0 (click's FloatRange lets NaN and inf by)."""
    if not math.isfinite(value) or value <= 0:
        raise click.BadParameter(f"must be a finite number of seconds > 0, not {value}")
    return value


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and every loopback address (brackets allowed)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_port(program: str, host: str, port: int) -> None:
    """Refuse a port that is taken with one line (exit 1), before anything is started."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            click.echo(
                f"wirecut {program}: cannot listen on {host}:{port}: {exc.strerror}", err=True
            )
            sys.exit(1)


def secret(
    program: str,
    file_flag: str,
    path: Path | None,
    env: str,
    *,
    flag: tuple[str, str | None] | None = None,
    skip_env: bool = False,
) -> str | None:
    """The secret from ``flag``'s value (with a warning), ``file_flag``'s file, or ``$env``.

    ``flag`` is ``(name, value)`` of an option that takes the secret itself
    (readable by every local user in /proc/PID/cmdline: it still works, and
    says so). None if none of the three gives one. One-line usage errors for
    both at once, an unreadable, empty or oversized file, and a secret with
    whitespace or control characters.
    """
    name, given = flag if flag is not None else ("", None)
    if given is not None and path is not None:
        raise click.UsageError(f"{name} and {file_flag} exclude each other")
    if given is not None:
        click.echo(
            f"wirecut {program}: warning: {name} on the command line is readable by every local "
            f"user (/proc/PID/cmdline); use {file_flag} FILE or ${env}",
            err=True,
        )
        value, source = given, name
    elif path is not None:
        value, source = _read_secret(file_flag, path), f"{file_flag} {path}"
    elif not skip_env and os.environ.get(env, "").strip():
        value, source = os.environ[env], f"${env}"
    else:
        return None
    value = value.strip()
    if not value:
        raise click.UsageError(f"{source}: the secret is empty")
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise click.UsageError(
            f"{source}: the secret must be one word of printable characters (no spaces or "
            "control characters)"
        )
    return value


def _read_secret(file_flag: str, path: Path) -> str:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise click.UsageError(f"{file_flag}: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_SECRET_BYTES:
        raise click.UsageError(f"{file_flag}: {path} is larger than {MAX_SECRET_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise click.UsageError(f"{file_flag}: {path} is not UTF-8 text") from None
    if not text.strip():
        raise click.UsageError(f"{file_flag}: {path} is empty")
    return text
