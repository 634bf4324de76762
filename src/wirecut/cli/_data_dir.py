"""``--data-dir``: the one option every subcommand with files shares.

The folder comes from ``--data-dir``, else ``WIRECUT_DATA_DIR``, else the
platform's user data folder. It is created if missing and checked writable
before the command does anything, so that a folder that cannot be used is one
clear line, not a traceback from deep inside: exit 2 when the flag named it (a
usage error), exit 1 when the environment or the default did.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from wirecut._paths import DATA_DIR_ENV, default_data_dir

__all__ = ["DataDirError", "data_dir_option", "ensure_data_dir"]

F = TypeVar("F", bound=Callable[..., Any])


class DataDirError(Exception):
    """The data directory cannot be created or written; the message says which and why."""


def ensure_data_dir(path: Path) -> Path:
    """Create ``path`` (and its parents) if needed and check that a file can be written there.

    Returns the path; raises ``DataDirError`` with one line naming it and the cause.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        # Creating a file is the only honest test of "writable" (root ignores
        # mode bits; a read-only mount refuses anyway).
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise DataDirError(
            f"the data directory {str(path)!r} cannot be used: {exc.strerror or exc}"
        ) from None
    return path


def data_dir_option(fn: F) -> F:
    """Add ``--data-dir`` to a click command; the command gets a checked ``data_dir: Path``."""

    @click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help=f"Where wirecut keeps its files. Default: ${DATA_DIR_ENV}, else the user data folder.",
    )
    @functools.wraps(fn)
    def wrapper(*args: Any, data_dir: Path | None, **kwargs: Any) -> Any:
        from_flag = data_dir is not None
        try:
            checked = ensure_data_dir(default_data_dir() if data_dir is None else data_dir)
        except DataDirError as exc:
            # One line, not click's usage block: the usage was fine, the folder is not.
            if from_flag:
                click.echo(f"Error: --data-dir: {exc}", err=True)
                sys.exit(2)
            source = f"${DATA_DIR_ENV}" if os.environ.get(DATA_DIR_ENV, "").strip() else "default"
            click.echo(f"Error: {exc} (from the {source})", err=True)
            sys.exit(1)
        return fn(*args, data_dir=checked, **kwargs)

    return wrapper  # type: ignore[return-value]
