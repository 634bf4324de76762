"""``wirecut console [URL] [-c LINE]``: the terminal client (docs/terminal-client.md).

Without a URL it reads ``serve.json`` from the data directory (a local
``wirecut serve`` wrote it); with one, the token comes from ``?token=`` or
``$WIRECUT_TOKEN``. ``-c LINE`` runs one line and exits 0 (ok), 1 (error),
124 (timeout) or 130 (cancelled). A URL that cannot be one is a usage error
(exit 2); a console that is not there, refuses the token or drops the
connection is one line on stderr and exit 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from wirecut.cli._data_dir import data_dir_option

__all__ = ["console"]


@click.command("console")
@click.argument("url", required=False)
@click.option(
    "-c",
    "--command",
    "line",
    metavar="LINE",
    default=None,
    help="Run one line, print its output, and exit with its status "
    "(0 ok, 1 error, 124 timeout, 130 cancelled).",
)
@data_dir_option
def console(url: str | None, line: str | None, data_dir: Path) -> None:
    """Talk to a running console: a REPL, or one line with -c.

    URL is what `wirecut serve` printed (http://HOST:PORT/?token=TOKEN);
    without it, the console a local `wirecut serve` announced in the data
    directory. Ctrl+C cancels the running command; Ctrl+D leaves.
    """
    if line is not None and not line.strip():
        raise click.UsageError("-c needs a line to run, e.g. -c 'memory list'")
    try:
        sys.exit(_run(url, line, data_dir))
    except KeyboardInterrupt:
        # Ctrl+C while the client loads or reads its address (before its own
        # handler is set): nothing was sent, and the user cancelled. click
        # would say "Aborted!" and exit 1.
        sys.exit(EXIT_CANCELLED)


#: ``-c``'s exit code for a cancelled command (``wirecut.client.EXIT_CANCELLED``).
EXIT_CANCELLED = 130


def _run(url: str | None, line: str | None, data_dir: Path) -> int:
    from wirecut.client import (
        HISTORY_FILE,
        AddressError,
        from_serve_json,
        from_url,
        run_terminal,
    )

    try:
        address = from_serve_json(data_dir) if url is None else from_url(url)
    except AddressError as exc:
        if url is not None:
            raise click.BadParameter(str(exc), param_hint="'URL'") from None
        click.echo(f"wirecut console: {exc}", err=True)
        return 1
    return run_terminal(address, line=line, history_path=data_dir / HISTORY_FILE)
