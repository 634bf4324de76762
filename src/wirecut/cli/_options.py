"""Command-line pieces the subcommands share: option groups, secrets, ports, hosts, seconds.

The options that several commands take (where to listen, a number of
seconds, a secret's file, the provider's URL) are declared here once, each
with the help text its command gives. Each check turns bad input into one
usage line (exit 2) or one line and exit 1, never a traceback
(docs/protocol.md, "Command line").
"""

from __future__ import annotations

import ipaddress
import math
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import click

__all__ = [
    "API_KEY_ENV",
    "Decorator",
    "allowed_hosts_option",
    "api_key",
    "api_key_options",
    "check_port",
    "is_loopback",
    "listen_options",
    "option_group",
    "provider_options",
    "provider_url_option",
    "seconds",
    "seconds_option",
    "secret",
    "secret_file_option",
]

F = TypeVar("F", bound=Callable[..., Any])


class Decorator(Protocol):
    """What ``click.option`` returns: it adds to a command function and returns it."""

    def __call__(self, fn: F, /) -> F: ...


#: A secret file larger than this is not a secret file.
MAX_SECRET_BYTES = 64 * 1024


def seconds(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A click callback: a finite number of seconds > 0 (click's FloatRange lets NaN and inf by)."""
    if not math.isfinite(value) or value <= 0:
        raise click.BadParameter(f"must be a finite number of seconds > 0, not {value}")
    return value


def option_group(*options: Decorator) -> Decorator:
    """The click options ``options`` as one decorator, in the order ``--help`` lists them."""

    def apply(fn: F) -> F:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return apply


def listen_options(
    port: int, *, host_help: str = "Address to listen on.", port_help: str = "0: any."
) -> Decorator:
    """``--host`` (default loopback) and ``--port`` (default ``port``; 0 picks a free one)."""
    return option_group(
        click.option("--host", default="127.0.0.1", show_default=True, help=host_help),
        click.option(
            "--port", default=port, show_default=True, type=click.IntRange(0, 65535), help=port_help
        ),
    )


def seconds_option(flag: str, default: float, help: str, **kwargs: Any) -> Decorator:
    """An option that takes a finite number of seconds > 0 (``seconds``), its default shown."""
    return click.option(
        flag, default=default, show_default=True, type=float, callback=seconds, help=help, **kwargs
    )


def secret_file_option(flag: str, help: str) -> Decorator:
    """An option naming the file that holds a secret (read by ``secret``)."""
    return click.option(
        flag, type=click.Path(dir_okay=False, path_type=Path), default=None, help=help
    )


def allowed_hosts_option(help: str, **kwargs: Any) -> Decorator:
    """``--allowed-host`` (repeatable): a Host name to answer besides the bound ones."""
    return click.option("--allowed-host", "allowed_hosts", multiple=True, help=help, **kwargs)


def provider_url_option(flag: str, what: str) -> Decorator:
    """``flag``: the provider's URL; with none, the rule of ``wirecut.launch`` says what runs."""
    return click.option(
        flag,
        default=None,
        help=f"{what} (http://host:port/v1). Default: $WIRECUT_PROVIDER_URL, then "
        "$OPENAI_BASE_URL; with neither, the embedded llama.cpp, else the simulator.",
    )


#: Where the provider's API key comes from when no option gives it.
API_KEY_ENV = "OPENAI_API_KEY"


def api_key_options() -> Decorator:
    """``--api-key KEY`` (works, and warns) and ``--api-key-file FILE``; read by ``api_key``.

    The command function takes them as ``api_key_flag`` and ``api_key_file``.
    """
    return option_group(
        click.option(
            "--api-key",
            "api_key_flag",
            default=None,
            help="The provider's API key (visible to local users: prefer --api-key-file or "
            f"${API_KEY_ENV}).",
        ),
        secret_file_option(
            "--api-key-file", f"Read the provider's API key from FILE. Default: ${API_KEY_ENV}."
        ),
    )


def api_key(program: str, flag: str | None, path: Path | None) -> str | None:
    """The provider's API key from ``--api-key`` (with a warning), ``--api-key-file``, or the
    environment (``secret``); None when none gives one."""
    return secret(program, "--api-key-file", path, API_KEY_ENV, flag=("--api-key", flag))


def provider_options(*, url_help: str, model_help: str) -> Decorator:
    """``--provider-url URL``, ``--model`` and the API key's options of a proof tool."""
    return option_group(
        click.option("--provider-url", default=None, metavar="URL", help=url_help),
        click.option("--model", default=None, help=model_help),
        api_key_options(),
    )


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
