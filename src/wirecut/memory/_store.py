"""``NoteStore``: the notes in one SQLite file (``notes.db`` in the data directory).

The file is in WAL mode, so readers never wait for the writer and the writer
waits for no reader. Its schema is versioned with ``PRAGMA user_version``:
``MIGRATIONS[i]`` brings version ``i`` to ``i + 1``, and opening a store
applies the missing ones in one transaction (opening it again applies none).

Each call opens its own connection and closes it before returning, in the
calling thread: no connection is shared between threads, and none is left
open for a cancel to interrupt half-way. A write is one ``BEGIN IMMEDIATE``
transaction whose ``COMMIT`` is the bound scope's commit section
(``committing()``): a cut (or any error) before it rolls the write back, so
the file is left exactly as it was; once it passed, the write stands and the
scope is ``committed``.

A write that finds another writer holding the lock waits for it in short
steps on the bound scope's ``sleep`` (``LOCK_STEPS``), not in SQLite's busy
handler: a blocking C call that no cancel reaches (it held a cancelled
command for 4.7 s). The overall wait is still bounded by ``timeout``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import wirecut.scope as ws
from wirecut.memory._errors import ConflictError, StoreError
from wirecut.memory._jsonl import parse_note_lines
from wirecut.memory._notes import Note, NoteState, Umbrella, check_body, check_title

__all__ = ["FILE_NAME", "MIGRATIONS", "SCHEMA_VERSION", "NoteStore"]

#: The store's file name inside the data directory.
FILE_NAME = "notes.db"

#: The schema, one tuple of statements per version step. Append only: a
#: released step is never edited, because stores out there already ran it.
MIGRATIONS: list[tuple[str, ...]] = [
    (  # 0 -> 1: the notes
        """
        CREATE TABLE notes (
            id               INTEGER PRIMARY KEY AUTOINCREMENT,
            title            TEXT NOT NULL CHECK (length(trim(title)) > 0),
            body             TEXT NOT NULL,
            state            TEXT NOT NULL CHECK (state IN ('active', 'stale', 'archived')),
            created_at       REAL NOT NULL,
            last_used_at     REAL NOT NULL,
            state_changed_at REAL NOT NULL,
            umbrella_id      INTEGER REFERENCES notes (id)
        )
        """,
        "CREATE INDEX notes_by_state ON notes (state)",
        "CREATE INDEX notes_by_umbrella ON notes (umbrella_id)",
    ),
]

#: The version that this code writes and reads.
SCHEMA_VERSION = len(MIGRATIONS)

#: Seconds between a write's tries for the write lock held by another writer
#: (about SQLite's own busy-handler steps); the last one repeats until the
#: store's ``timeout``. Each is a cuttable ``scope.sleep``.
LOCK_STEPS = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.025, 0.025, 0.05)

_COLUMNS = "id, title, body, state, created_at, last_used_at, state_changed_at, umbrella_id"


class NoteStore:
    """The note store in the SQLite file ``path``; created (mode 0600) and migrated on open.

    Safe to share between threads: every method opens its own connection in
    the calling thread. Raises ``StoreError`` (one line naming the file and
    the cause) when the file cannot be opened, read or written, including a
    file whose schema is newer than this code.

    Cancellation: a write's ``COMMIT`` runs in the bound scope's commit
    section; a cancel before it rolls the write back and raises
    ``Interrupted``, a cancel after it came too late (the scope is
    ``committed``, and the console reports the command ``ok``). A cancel
    while the write waits for another writer's lock ends the wait at once.
    Reads are not cut (they are short, and in WAL mode wait for no writer).
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 5.0) -> None:
        self.path = Path(path)
        #: Seconds a write waits for another writer before it fails.
        self.timeout = timeout
        try:
            # Notes are the user's own: the file (and so, by SQLite's rule,
            # its -wal and -shm files) is readable by its owner only.
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        except OSError as exc:
            raise StoreError(
                f"cannot open the note store {str(self.path)!r}: {exc.strerror or exc}"
            ) from None
        self._migrate()

    @classmethod
    def in_data_dir(cls, data_dir: str | os.PathLike[str]) -> NoteStore:
        """The store of a data directory (which must exist): ``DATA_DIR/notes.db``."""
        return cls(Path(data_dir) / FILE_NAME)

    def __repr__(self) -> str:
        return f"<NoteStore {str(self.path)!r}>"

    # -- connections -------------------------------------------------------------

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with _sqlite_errors(self.path):
            # Autocommit (isolation_level=None): transactions are ours to begin.
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
            try:
                conn.execute("PRAGMA foreign_keys = ON")
                yield conn
            finally:
                conn.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed if the block ends well and the scope is open."""
        with self._connect() as conn:
            # IMMEDIATE takes the write lock now: what the block reads cannot
            # change under it before the commit.
            self._begin_immediate(conn)
            try:
                yield conn
                # The point of no return: a cancel from here on comes too late
                # to undo the write, and the command reports it done.
                with ws.committing():
                    conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise

    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE``, waiting for another writer in cuttable steps, up to ``timeout``.

        Raises ``Interrupted`` if the bound scope is cancelled meanwhile, and
        SQLite's "database is locked" once ``timeout`` passed.
        """
        # No busy handler: SQLite answers SQLITE_BUSY at once, and the wait
        # happens here, where a cancel can end it.
        conn.execute("PRAGMA busy_timeout = 0")
        deadline = time.monotonic() + self.timeout
        for step in itertools.chain(LOCK_STEPS, itertools.repeat(LOCK_STEPS[-1])):
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                # The primary code is the low byte (SQLITE_BUSY_RECOVERY ... too).
                remaining = deadline - time.monotonic()
                if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or remaining <= 0:
                    raise
            ws.sleep(min(step, remaining))

    def _migrate(self) -> None:
        with self._connect() as conn:
            # Outside a transaction: SQLite cannot switch journal modes inside one.
            conn.execute("PRAGMA journal_mode = WAL")
            self._begin_immediate(conn)
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                target = len(MIGRATIONS)
                if version > target:
                    raise StoreError(
                        f"the note store {str(self.path)!r} has schema version {version}, "
                        f"newer than this wirecut knows ({target}): upgrade wirecut"
                    )
                for step in MIGRATIONS[version:]:
                    for statement in step:
                        conn.execute(statement)
                if version != target:
                    conn.execute(f"PRAGMA user_version = {target:d}")
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise

    # -- facts about the file ----------------------------------------------------

    @property
    def schema_version(self) -> int:
        """``PRAGMA user_version`` of the file."""
        with self._connect() as conn:
            version: int = conn.execute("PRAGMA user_version").fetchone()[0]
            return version

    @property
    def journal_mode(self) -> str:
        """``PRAGMA journal_mode`` of the file ("wal")."""
        with self._connect() as conn:
            mode: str = conn.execute("PRAGMA journal_mode").fetchone()[0]
            return mode

    def dump(self) -> str:
        """The whole database as SQL text (``iterdump``): equal dumps, equal stores."""
        with self._connect() as conn:
            return "\n".join(conn.iterdump())

    # -- reading -----------------------------------------------------------------

    def get(self, note_id: int) -> Note | None:
        """The note ``note_id``, or None if there is none."""
        if not _storable_id(note_id):
            return None
        with self._connect() as conn:
            row = conn.execute(f"SELECT {_COLUMNS} FROM notes WHERE id = ?", (note_id,)).fetchone()
        return None if row is None else _note(row)

    def notes(self, state: NoteState | None = None) -> list[Note]:
        """Every note (or every note in ``state``), oldest first."""
        with self._connect() as conn:
            if state is None:
                rows = conn.execute(f"SELECT {_COLUMNS} FROM notes ORDER BY id").fetchall()
            else:
                rows = conn.execute(
                    f"SELECT {_COLUMNS} FROM notes WHERE state = ? ORDER BY id", (str(state),)
                ).fetchall()
        return [_note(row) for row in rows]

    def merged_into(self, umbrella_id: int) -> list[Note]:
        """The notes merged into the umbrella note ``umbrella_id``, oldest first."""
        with self._connect() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM notes WHERE umbrella_id = ? ORDER BY id", (umbrella_id,)
            ).fetchall()
        return [_note(row) for row in rows]

    def counts(self) -> dict[NoteState, int]:
        """How many notes are in each state (every state present, zero included)."""
        with self._connect() as conn:
            rows = conn.execute("SELECT state, count(*) FROM notes GROUP BY state").fetchall()
        counts = dict.fromkeys(NoteState, 0)
        for state, n in rows:
            counts[NoteState(state)] = n
        return counts

    # -- writing -----------------------------------------------------------------

    def add(self, title: str, body: str, *, now: float | None = None) -> Note:
        """Add an active note and return it. A bad title or body is a ValueError saying why."""
        try:
            check_title(title)
        except ValueError as exc:
            raise ValueError(f"the title {exc}") from None
        try:
            check_body(body)
        except ValueError as exc:
            raise ValueError(f"the body {exc}") from None
        at = time.time() if now is None else now
        with self._write() as conn:
            note_id = _insert(conn, title, body, NoteState.ACTIVE, at, at, at)
            return _fetch(conn, note_id)

    def touch(self, note_id: int, *, now: float | None = None) -> Note | None:
        """Record a use of the note: ``last_used_at`` is now, and a stale note is active again.

        Returns the note as it is now, or None if there is none. An archived
        note stays archived.
        """
        if not _storable_id(note_id):
            return None
        at = time.time() if now is None else now
        with self._write() as conn:
            conn.execute(
                "UPDATE notes SET last_used_at = max(last_used_at, :at),"
                " state_changed_at = CASE state WHEN 'stale' THEN :at ELSE state_changed_at END,"
                " state = CASE state WHEN 'stale' THEN 'active' ELSE state END"
                " WHERE id = :id",
                {"at": at, "id": note_id},
            )
            row = conn.execute(f"SELECT {_COLUMNS} FROM notes WHERE id = ?", (note_id,)).fetchone()
            return None if row is None else _note(row)

    def import_jsonl(self, path: str | os.PathLike[str], *, now: float | None = None) -> list[int]:
        """Add the notes of a JSON Lines file (see ``_jsonl``); return their ids.

        Every line is checked before any is written, and all are written in
        one transaction: a bad line is a ``NoteImportError`` naming its line
        number and field, and the store is left as it was.
        """
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise StoreError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
        at = time.time() if now is None else now
        drafts = parse_note_lines(data, now=at)
        with self._write() as conn:
            return [
                _insert(conn, d.title, d.body, d.state, d.created_at, d.last_used_at, at)
                for d in drafts
            ]

    def apply_changes(
        self,
        expected: Sequence[Note],
        *,
        stale: Iterable[int] = (),
        archive: Iterable[int] = (),
        umbrellas: Sequence[Umbrella] = (),
        now: float | None = None,
    ) -> list[Note]:
        """Change notes that were read earlier, in one transaction; return the umbrella notes.

        ``expected`` are the notes as the caller read them; every note named
        in ``stale``, ``archive`` and ``umbrellas`` must be among them. The
        transaction first checks that each of ``expected`` is still exactly
        as read (a use counts as a change): if one is not, it raises
        ``ConflictError`` naming them and writes nothing. Then it marks
        ``stale`` notes stale, archives ``archive``, and creates each
        umbrella as an active note, archiving its notes with ``umbrella_id``
        set to it. The caller checks that the changes make sense (the
        curator's ``validate_plan``); this only keeps them atomic.
        """
        stale_ids = list(stale)
        archive_ids = list(archive)
        read = {note.id: note for note in expected}
        named = [*stale_ids, *archive_ids, *(i for u in umbrellas for i in u.note_ids)]
        unknown = sorted(set(named) - read.keys())
        if unknown:
            raise ValueError(f"notes {_ids(unknown)} are changed but not among the expected notes")
        at = time.time() if now is None else now
        with self._write() as conn:
            changed = [
                note.id
                for note in expected
                if _row(conn, note.id) != note  # gone, or different
            ]
            if changed:
                raise ConflictError(
                    f"notes {_ids(changed)} changed since they were read; nothing was written",
                    note_ids=changed,
                )
            for note_id in stale_ids:
                _set_state(conn, note_id, NoteState.STALE, at)
            for note_id in archive_ids:
                _set_state(conn, note_id, NoteState.ARCHIVED, at)
            created = []
            for umbrella in umbrellas:
                umbrella_id = _insert(
                    conn, umbrella.title, umbrella.body, NoteState.ACTIVE, at, at, at
                )
                for note_id in umbrella.note_ids:
                    _set_state(conn, note_id, NoteState.ARCHIVED, at, umbrella_id=umbrella_id)
                created.append(umbrella_id)
            return [_fetch(conn, umbrella_id) for umbrella_id in created]


@contextlib.contextmanager
def _sqlite_errors(path: Path) -> Iterator[None]:
    """Translate ``sqlite3`` errors into a one-line ``StoreError`` naming the file."""
    try:
        yield
    except sqlite3.Error as exc:
        raise StoreError(f"the note store {str(path)!r}: {exc}") from exc


def _note(row: Any) -> Note:
    # The columns of _COLUMNS, in order; the schema's types and CHECKs hold them.
    note_id, title, body, state, created_at, last_used_at, state_changed_at, umbrella_id = row
    return Note(
        id=note_id,
        title=title,
        body=body,
        state=NoteState(state),
        created_at=float(created_at),
        last_used_at=float(last_used_at),
        state_changed_at=float(state_changed_at),
        umbrella_id=umbrella_id,
    )


def _row(conn: sqlite3.Connection, note_id: int) -> Note | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM notes WHERE id = ?", (note_id,)).fetchone()
    return None if row is None else _note(row)


def _fetch(conn: sqlite3.Connection, note_id: int) -> Note:
    note = _row(conn, note_id)
    assert note is not None, note_id
    return note


def _insert(
    conn: sqlite3.Connection,
    title: str,
    body: str,
    state: NoteState,
    created_at: float,
    last_used_at: float,
    state_changed_at: float,
) -> int:
    cursor = conn.execute(
        "INSERT INTO notes (title, body, state, created_at, last_used_at, state_changed_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (title, body, str(state), created_at, last_used_at, state_changed_at),
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _set_state(
    conn: sqlite3.Connection,
    note_id: int,
    state: NoteState,
    at: float,
    *,
    umbrella_id: int | None = None,
) -> None:
    conn.execute(
        "UPDATE notes SET state = ?, state_changed_at = ?, umbrella_id = coalesce(?, umbrella_id)"
        " WHERE id = ?",
        (str(state), at, umbrella_id, note_id),
    )


def _ids(ids: Iterable[int]) -> str:
    return ", ".join(f"#{i}" for i in ids)


def _storable_id(note_id: int) -> bool:
    # SQLite's INTEGER is 64-bit: a larger id names no note (and would not bind).
    return 0 < note_id < 2**63
