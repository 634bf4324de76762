"""``wirecut proxy``: the cut-through OpenAI-compatible gateway (docs/proxy.md).

Prints ``wirecut proxy: http://HOST:PORT/v1`` on stdout once it accepts
connections, and which upstream(s) it serves on stderr; serves until SIGTERM
or Ctrl+C, cuts every live request (each gets its record), stops the
upstream it started, and exits 0. With ``--config FILE`` (several upstreams)
or ``--keys-file FILE``, SIGHUP rereads those files.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from wirecut.cli._data_dir import data_dir_option
from wirecut.cli._options import (
    allowed_hosts_option,
    check_port,
    is_loopback,
    listen_options,
    provider_url_option,
    seconds_option,
    secret,
    secret_file_option,
)

__all__ = ["proxy"]

#: The environment variable that holds the client token when no file is given.
TOKEN_ENV = "WIRECUT_PROXY_TOKEN"


def _slots(ctx: click.Context, param: click.Parameter, value: str) -> int | str:
    if value == "auto":
        return value
    try:
        slots = int(value)
    except ValueError:
        raise click.BadParameter(f"must be 'auto' or a whole number >= 1, not {value!r}") from None
    if slots < 1:
        raise click.BadParameter(f"must be 'auto' or a whole number >= 1, not {value!r}")
    return slots


@click.command("proxy")
@listen_options(8766)
@provider_url_option("--upstream", "The upstream's OpenAI API base")
@click.option("--model", default=None, help="The model asked for when a client names none.")
@click.option(
    "--upstream-slots",
    default="auto",
    show_default=True,
    callback=_slots,
    help="Requests in flight upstream at once; the rest wait in the proxy's queue. "
    "auto: llama.cpp's /slots or /props, else unlimited.",
)
@secret_file_option(
    "--token-file",
    f"A file holding the client token (Authorization: Bearer). Default: ${TOKEN_ENV}; "
    "with neither, no token is asked for (loopback only).",
)
@secret_file_option(
    "--api-key-file", "A file holding the upstream's API key. Default: $OPENAI_API_KEY."
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A TOML file of [[upstream]] tables (url, models, slots, api_key_file, timeout): "
    "several upstreams, a request routed by its model. SIGHUP rereads it.",
)
@click.option(
    "--keys-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A file of client keys, one 'name token' a line: each record and /metrics carry "
    "the key's name. SIGHUP rereads it.",
)
@seconds_option(
    "--request-timeout",
    600.0,
    "Seconds from a request's arrival to its cut (queue, prompt and decoding).",
)
@allowed_hosts_option(
    "A name besides loopback names and IP addresses that the Host header may carry."
)
@click.option(
    "--max-body-bytes",
    default=4 * 1024 * 1024,
    show_default=True,
    type=click.IntRange(min=1),
    help="The largest request body accepted; a larger one is refused with 413.",
)
@data_dir_option
def proxy(
    host: str,
    port: int,
    upstream: str | None,
    model: str | None,
    upstream_slots: int | str,
    token_file: Path | None,
    api_key_file: Path | None,
    config_file: Path | None,
    keys_file: Path | None,
    request_timeout: float,
    allowed_hosts: tuple[str, ...],
    max_body_bytes: int,
    data_dir: Path,
) -> None:
    """An OpenAI-compatible gateway whose client disconnect cuts the upstream request."""
    from wirecut.proxy import AUTO, ClientKey, KeysFileError, Proxy, ProxyConfig, load_keys_file

    if keys_file is not None and token_file is not None:
        raise click.UsageError("--keys-file and --token-file exclude each other")
    # Named keys replace the one token: $WIRECUT_PROXY_TOKEN is not read beside them.
    token = secret("proxy", "--token-file", token_file, TOKEN_ENV, skip_env=keys_file is not None)
    keys: tuple[ClientKey, ...] = ()
    if keys_file is not None:
        try:
            keys = load_keys_file(keys_file)
        except KeysFileError as exc:
            raise click.UsageError(str(exc)) from None
    if token is None and not keys and not is_loopback(host):
        raise click.UsageError(
            f"--host {host} needs a client token (--token-file, --keys-file or ${TOKEN_ENV}): "
            "without one the proxy binds a loopback address only"
        )
    check_port("proxy", host, port)
    if config_file is not None:
        _serve_config(
            config_file,
            given={"--upstream": upstream, "--api-key-file": api_key_file},
            slots_given=upstream_slots != "auto",
            settings=dict(
                host=host,
                port=port,
                model=model,
                token=token,
                keys=keys,
                keys_file=keys_file,
                request_timeout=request_timeout,
                data_dir=data_dir,
                allowed_hosts=allowed_hosts,
                max_body_bytes=max_body_bytes,
            ),
        )
        return
    api_key = secret("proxy", "--api-key-file", api_key_file, "OPENAI_API_KEY")

    from wirecut.launch import ProviderUnavailable, given_provider_url, resolve_provider
    from wirecut.proxy import serve_forever as serve_proxy
    from wirecut.serving import raise_descriptor_limit

    url, _ = given_provider_url(upstream, "--upstream")
    try:
        provider = resolve_provider(url, model, data_dir)
    except ProviderUnavailable as exc:
        click.echo(f"wirecut proxy: {exc}", err=True)
        sys.exit(1)
    try:
        try:
            config = ProxyConfig(
                upstream=provider.base_url,
                host=host,
                port=port,
                model=provider.model,
                upstream_slots=upstream_slots if isinstance(upstream_slots, int) else AUTO,
                token=token,
                keys=keys,
                keys_file=keys_file,
                api_key=api_key,
                request_timeout=request_timeout,
                data_dir=data_dir,
                allowed_hosts=allowed_hosts,
                max_body_bytes=max_body_bytes,
            )
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        gateway = Proxy(config, say=lambda line: click.echo(line, err=True))
        label = provider.label.replace(provider.base_url, gateway.router.backends[0].url)
        click.echo(f"wirecut proxy: upstream: {label}", err=True)
        if provider.note:
            click.echo(f"wirecut proxy: {provider.note}", err=True)

        def announce(base_url: str) -> None:
            click.echo(f"wirecut proxy: {base_url}")
            sys.stdout.flush()

        # A stream holds three descriptors (the client's socket, the
        # upstream's and its dup): the connection cap is fitted to the limit.
        raise_descriptor_limit()
        code = serve_proxy(gateway, on_listening=announce, reload_on_sighup=keys_file is not None)
    finally:
        provider.stop()
    sys.exit(code)


def _serve_config(
    path: Path, *, given: dict[str, object], slots_given: bool, settings: dict[str, Any]
) -> None:
    """``wirecut proxy --config FILE``: the upstreams of the file; SIGHUP rereads it."""
    from wirecut.proxy import ConfigFileError, Proxy, ProxyConfig, load_config_file
    from wirecut.proxy import serve_forever as serve_proxy
    from wirecut.serving import raise_descriptor_limit

    for flag, value in given.items():
        if value is not None:
            raise click.UsageError(
                f"--config and {flag} exclude each other: each upstream's url and "
                "api_key_file are in the config file"
            )
    if slots_given:
        raise click.UsageError(
            "--config and --upstream-slots exclude each other: each upstream's slots "
            "are in the config file"
        )
    try:
        specs = load_config_file(path)
    except ConfigFileError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        config = ProxyConfig(upstreams=specs, config_file=path, **settings)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    gateway = Proxy(config, say=lambda line: click.echo(line, err=True))
    for backend in gateway.router.backends:
        models = ", ".join(backend.spec.models)
        click.echo(f"wirecut proxy: upstream: {backend.url} ({models})", err=True)

    def announce(base_url: str) -> None:
        click.echo(f"wirecut proxy: {base_url}")
        sys.stdout.flush()

    raise_descriptor_limit()
    sys.exit(serve_proxy(gateway, on_listening=announce, reload_on_sighup=True))
