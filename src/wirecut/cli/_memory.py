"""``wirecut memory``: the note store from the shell (add, list, show, import).

The same store that ``wirecut serve`` uses: ``notes.db`` in the data
directory. Exit 0 on success, 2 on a usage error (a bad argument), 1 on
anything else (a bad import line, a store that cannot be used); every error
is one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from wirecut.cli._data_dir import data_dir_option

if TYPE_CHECKING:
    # wirecut.memory imports the agent and the provider: only when a command runs.
    from wirecut.memory import NoteStore

__all__ = ["memory"]


@click.group()
def memory() -> None:
    """The note store: add a note, list the notes, show one, import notes from JSON Lines."""


@memory.command()
@click.argument("title")
@click.argument("body")
@data_dir_option
def add(title: str, body: str, data_dir: Path) -> None:
    """Add an active note with TITLE and BODY."""
    from wirecut.memory import StoreError, check_body, check_title

    for name, value, check in (("TITLE", title, check_title), ("BODY", body, check_body)):
        try:
            check(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=name) from None
    try:
        note = _open(data_dir).add(title, body)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"added note #{note.id}")


@memory.command(name="list")
@data_dir_option
def list_(data_dir: Path) -> None:
    """List the notes: id, state, last use, title."""
    from wirecut.memory import StoreError, format_notes

    try:
        notes = _open(data_dir).notes()
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    for line in format_notes(notes):
        click.echo(line)


@memory.command()
@click.argument("note_id", metavar="ID")
@data_dir_option
def show(note_id: str, data_dir: Path) -> None:
    """Print note ID in full, as the console's `memory show` does.

    Showing a note is a use: it stays active (a stale one is active again).
    """
    from wirecut.memory import StoreError, format_note

    word = note_id.removeprefix("#")
    if not word.isdigit():
        raise click.BadParameter(f"the note id must be a number, not {note_id!r}", param_hint="ID")
    try:
        store = _open(data_dir)
        note = store.touch(int(word))
        if note is None:
            raise click.ClickException(f"there is no note #{int(word)}")
        umbrella = store.get(note.umbrella_id) if note.umbrella_id is not None else None
        merged = store.merged_into(note.id)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    for line in format_note(note, umbrella=umbrella, merged=merged):
        click.echo(line)


@memory.command(name="import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@data_dir_option
def import_(file: Path, data_dir: Path) -> None:
    """Add the notes of FILE, one JSON object a line (all of them, or none on a bad line).

    Fields: title and body (required), state (active, stale, archived),
    created_at and last_used_at (ISO 8601 or Unix seconds).
    """
    from wirecut.memory import NoteImportError, StoreError

    try:
        ids = _open(data_dir).import_jsonl(file)
    except NoteImportError as exc:
        raise click.ClickException(f"{file}: {exc}; nothing was imported") from None
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"imported {len(ids)} note{'' if len(ids) == 1 else 's'}")


def _open(data_dir: Path) -> NoteStore:
    from wirecut.memory import NoteStore

    return NoteStore.in_data_dir(data_dir)
