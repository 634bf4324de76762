"""The note store (``wirecut.memory.NoteStore``) and the ``memory ...`` console commands.

The store is a real SQLite file in ``tmp_path``; "nothing was written" is
always checked by comparing ``dump()`` (``iterdump``) before and after.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import wirecut.memory._store as store_module
from wirecut.console.commands import CommandContext, CommandError, Services, Session, UsageError
from wirecut.console.commands._memory import memory_add, memory_list, memory_show
from wirecut.memory import (
    FILE_NAME,
    SCHEMA_VERSION,
    NoteImportError,
    NoteState,
    NoteStore,
    StoreError,
)
from wirecut.provider import ChatClient, Usage
from wirecut.scope import Interrupted, InterruptScope

DAY = 86_400.0
T0 = 1_700_000_000.0  # a fixed "now" for tests that look at times


@pytest.fixture
def store(tmp_path: Path) -> NoteStore:
    return NoteStore.in_data_dir(tmp_path)


# -- opening: schema, WAL, migrations --------------------------------------------------


def test_a_new_store_is_at_the_current_schema_version_in_wal_mode(tmp_path: Path) -> None:
    store = NoteStore.in_data_dir(tmp_path)
    assert store.path == tmp_path / FILE_NAME
    assert store.schema_version == SCHEMA_VERSION == len(store_module.MIGRATIONS)
    assert store.journal_mode == "wal"
    # WAL is a property of the file: a plain connection sees it too.
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_the_store_file_is_readable_by_its_owner_only(store: NoteStore) -> None:
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600


def test_opening_again_applies_no_migration_twice(tmp_path: Path) -> None:
    first = NoteStore.in_data_dir(tmp_path)
    first.add("Kept", "across opens", now=T0)
    before = first.dump()
    again = NoteStore.in_data_dir(tmp_path)
    assert again.schema_version == SCHEMA_VERSION
    assert again.dump() == before


def test_a_new_migration_upgrades_an_existing_store_and_keeps_its_notes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = NoteStore.in_data_dir(tmp_path)
    old.add("Old note", "from version 1", now=T0)
    step = ("ALTER TABLE notes ADD COLUMN tag TEXT",)
    monkeypatch.setattr(store_module, "MIGRATIONS", [*store_module.MIGRATIONS, step])

    upgraded = NoteStore.in_data_dir(tmp_path)
    assert upgraded.schema_version == SCHEMA_VERSION + 1
    assert [n.title for n in upgraded.notes()] == ["Old note"]
    # Running the ALTER again would fail ("duplicate column"): opening once
    # more proves the step is not applied twice.
    assert NoteStore.in_data_dir(tmp_path).schema_version == SCHEMA_VERSION + 1


def test_a_failing_migration_leaves_the_store_at_its_old_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    NoteStore.in_data_dir(tmp_path).add("Old note", "v1", now=T0)
    before = NoteStore.in_data_dir(tmp_path).dump()
    broken = ("CREATE TABLE tags (name TEXT)", "THIS IS NOT SQL")
    monkeypatch.setattr(store_module, "MIGRATIONS", [*store_module.MIGRATIONS, broken])
    with pytest.raises(StoreError, match=r"notes\.db"):
        NoteStore.in_data_dir(tmp_path)
    monkeypatch.undo()
    store = NoteStore.in_data_dir(tmp_path)
    assert store.schema_version == SCHEMA_VERSION
    assert store.dump() == before  # no half-applied step (no "tags" table)


def test_a_store_newer_than_the_code_is_refused_in_one_line(tmp_path: Path) -> None:
    NoteStore.in_data_dir(tmp_path)
    with sqlite3.connect(tmp_path / FILE_NAME) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.close()
    with pytest.raises(StoreError) as caught:
        NoteStore.in_data_dir(tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert f"schema version {SCHEMA_VERSION + 5}" in message
    assert "upgrade wirecut" in message


def test_a_file_that_is_not_a_database_is_a_store_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_bytes(b"these are not the notes you are looking for" * 100)
    with pytest.raises(StoreError) as caught:
        NoteStore.in_data_dir(tmp_path)
    assert str(tmp_path / FILE_NAME) in str(caught.value)
    assert "not a database" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_store_in_a_missing_folder_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"cannot open the note store .*No such file"):
        NoteStore.in_data_dir(tmp_path / "missing")


# -- notes -------------------------------------------------------------------------------


def test_add_get_notes_and_counts(store: NoteStore) -> None:
    a = store.add("Lyon trip", "Train at 9:12", now=T0)
    b = store.add("Recipe", "Flour, water", now=T0 + 1)
    assert (a.id, a.state, a.created_at, a.last_used_at, a.umbrella_id) == (
        1,
        NoteState.ACTIVE,
        T0,
        T0,
        None,
    )
    assert store.get(b.id) == b
    assert store.get(999) is None
    assert store.notes() == [a, b]
    assert store.notes(NoteState.STALE) == []
    assert store.counts() == {NoteState.ACTIVE: 2, NoteState.STALE: 0, NoteState.ARCHIVED: 0}


@pytest.mark.parametrize(
    ("title", "body", "message"),
    [
        ("", "body", "the title must not be empty"),
        ("   ", "body", "the title must not be empty"),
        ("two\nlines", "body", "the title must be one line"),
        ("x" * 201, "body", "the title must be at most 200 characters"),
        ("title", "nul\x00", "the body must not contain NUL"),
    ],
)
def test_add_refuses_a_bad_title_or_body_and_writes_nothing(
    store: NoteStore, title: str, body: str, message: str
) -> None:
    before = store.dump()
    with pytest.raises(ValueError, match=message):
        store.add(title, body)
    assert store.dump() == before


def test_touch_makes_a_stale_note_active_and_leaves_an_archived_one_archived(
    tmp_path: Path,
) -> None:
    store = NoteStore.in_data_dir(tmp_path)
    source = tmp_path / "in.jsonl"
    source.write_text(
        '{"title": "S", "body": "", "state": "stale"}\n'
        '{"title": "A", "body": "", "state": "archived"}\n'
    )
    stale_id, archived_id = store.import_jsonl(source, now=T0)

    used = store.touch(stale_id, now=T0 + DAY)
    assert used is not None
    assert (used.state, used.last_used_at, used.state_changed_at) == (
        NoteState.ACTIVE,
        T0 + DAY,
        T0 + DAY,
    )
    kept = store.touch(archived_id, now=T0 + DAY)
    assert kept is not None
    assert (kept.state, kept.last_used_at, kept.state_changed_at) == (
        NoteState.ARCHIVED,
        T0 + DAY,
        T0,
    )
    assert store.touch(999) is None


def test_a_cancelled_scope_rolls_a_write_back(store: NoteStore) -> None:
    store.add("First", "kept", now=T0)
    before = store.dump()
    scope = InterruptScope("test")
    scope.cancel("user")
    with pytest.raises(Interrupted):
        scope.run(store.add, "Second", "never written")
    assert store.dump() == before


def test_a_cancel_while_a_write_is_under_way_rolls_it_back(
    store: NoteStore, tmp_path: Path
) -> None:
    store.add("First", "kept", now=T0)
    before = store.dump()
    source = tmp_path / "in.jsonl"
    source.write_text('{"title": "Imported", "body": "never written"}\n')
    # Another writer holds the write lock, so the import cannot commit
    # before the test has cancelled: the cancel lands inside the write.
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    scope = InterruptScope("command")
    entered = threading.Event()

    def write() -> list[int]:
        entered.set()
        return store.import_jsonl(source)

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(scope.run, write)
        assert entered.wait(10)
        scope.cancel("user")
        holder.execute("ROLLBACK")
        holder.close()
        with pytest.raises(Interrupted):
            future.result(10)
    assert store.dump() == before


@contextlib.contextmanager
def write_lock_held(store: NoteStore) -> Iterator[sqlite3.Connection]:
    """Another writer holding the store's write lock until the block ends."""
    holder = sqlite3.connect(store.path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        yield holder
        holder.execute("ROLLBACK")
    finally:
        holder.close()


def test_a_cancel_ends_the_wait_for_another_writers_lock_at_once(tmp_path: Path) -> None:
    # A wait far longer than the bound below: only the cancel can end it in time.
    store = NoteStore(tmp_path / "notes.db", timeout=120)
    store.add("First", "kept", now=T0)
    before = store.dump()
    scope = InterruptScope("command")
    waiting = threading.Event()
    tries: list[float] = []

    real_sleep = scope.sleep

    def sleep(seconds: float) -> None:
        tries.append(seconds)
        waiting.set()  # The write found the lock taken and waits for it.
        real_sleep(seconds)

    scope.sleep = sleep  # type: ignore[method-assign]
    with write_lock_held(store) as holder, ThreadPoolExecutor(1) as pool:
        future = pool.submit(scope.run, store.add, "Second", "never written")
        assert waiting.wait(10)
        scope.cancel("user")
        # The writer returns while the other one still holds the lock.
        with pytest.raises(Interrupted):
            future.result(10)
        assert holder.in_transaction
    assert tries
    assert all(step <= max(store_module.LOCK_STEPS) for step in tries)
    assert store.dump() == before


def test_a_write_waits_for_another_writers_lock_and_then_commits(store: NoteStore) -> None:
    scope = InterruptScope("command")
    waiting = threading.Event()
    real_sleep = scope.sleep

    def sleep(seconds: float) -> None:
        waiting.set()
        real_sleep(seconds)

    scope.sleep = sleep  # type: ignore[method-assign]
    with ThreadPoolExecutor(1) as pool:
        with write_lock_held(store):
            future = pool.submit(scope.run, store.add, "Later", "written once the lock is free")
            assert waiting.wait(10)
            assert not future.done()
        note = future.result(10)
    assert store.get(note.id) == note


def test_the_wait_for_another_writers_lock_still_ends_at_the_store_timeout(
    tmp_path: Path,
) -> None:
    store = NoteStore(tmp_path / "notes.db", timeout=0.2)
    before = store.dump()
    with write_lock_held(store), pytest.raises(StoreError, match="database is locked") as caught:
        InterruptScope("command").run(store.add, "Never", "written")
    assert str(store.path) in str(caught.value)
    assert store.dump() == before


def _read_only(store: NoteStore) -> None:
    """SQLite finds the store read-only ("attempt to write a readonly database"): its
    shared-memory file cannot be written (a folder stands in its place)."""
    (store.path.parent / f"{store.path.name}-shm").mkdir()


def _io_error(store: NoteStore) -> None:
    """SQLite cannot open the store's write-ahead log ("unable to open database file")."""
    (store.path.parent / f"{store.path.name}-wal").mkdir()


@pytest.mark.parametrize("spoil", [_read_only, _io_error], ids=["read-only", "io"])
def test_only_a_busy_store_is_retried_a_read_only_or_broken_one_fails_at_once(
    store: NoteStore, spoil: Callable[[NoteStore], None]
) -> None:
    # With an hour to wait for a lock, a write that retried this error would
    # hold the test until its timeout: the error must end the write at once.
    # Both errors come from the write's BEGIN IMMEDIATE, where a busy store is
    # waited for.
    store.add("Kept", "before")
    store.timeout = 3600.0
    spoil(store)
    with pytest.raises(StoreError) as caught:
        InterruptScope("command").run(store.add, "Never", "written")
    message = str(caught.value)
    assert str(store.path) in message
    assert "\n" not in message
    # SQLite's own word for it, not "database is locked" after an hour of tries.
    assert message.rpartition(": ")[2] in (
        "attempt to write a readonly database",
        "unable to open database file",
    )


def test_threads_add_at_once_and_every_note_is_kept(store: NoteStore) -> None:
    per_thread, threads = 25, 4
    start = threading.Barrier(threads)

    def add_many(t: int) -> list[int]:
        start.wait(10)
        return [store.add(f"t{t} n{i}", "body").id for i in range(per_thread)]

    with ThreadPoolExecutor(threads) as pool:
        ids = [i for ids in pool.map(add_many, range(threads)) for i in ids]
    assert len(set(ids)) == per_thread * threads
    assert store.counts()[NoteState.ACTIVE] == per_thread * threads


# -- import ------------------------------------------------------------------------------


def test_import_adds_every_line_with_its_fields_and_defaults(
    store: NoteStore, tmp_path: Path
) -> None:
    source = tmp_path / "notes.jsonl"
    lines = [
        {"title": "Plain", "body": "defaults"},
        {},  # a blank line: skipped
        {
            "title": "Dated",
            "body": "times",
            "state": "stale",
            "created_at": "2023-11-14T22:13:20Z",
            "last_used_at": T0 + DAY,
        },
        {"title": "Naive time is UTC", "body": "", "created_at": "2023-11-14T22:13:20"},
    ]
    source.write_text("\n".join(json.dumps(line) if line else "   " for line in lines) + "\n")
    ids = store.import_jsonl(source, now=T0 + 2 * DAY)
    plain, dated, naive = (store.get(i) for i in ids)
    assert plain is not None
    assert dated is not None
    assert naive is not None
    assert (plain.state, plain.created_at, plain.last_used_at) == (
        NoteState.ACTIVE,
        T0 + 2 * DAY,
        T0 + 2 * DAY,
    )
    assert (dated.state, dated.created_at, dated.last_used_at) == (NoteState.STALE, T0, T0 + DAY)
    assert naive.created_at == T0


BAD_LINES = [
    # (the bad line, its field or None, words the message must have)
    ("{not json", None, "not JSON"),
    ("[1, 2]", None, "must be a JSON object, not an array"),
    ('{"body": "no title"}', "title", "is missing"),
    ('{"title": "no body"}', "body", "is missing"),
    ('{"title": "", "body": "x"}', "title", "must not be empty"),
    ('{"title": 7, "body": "x"}', "title", "must be a string, not int"),
    ('{"title": "t", "body": "x", "colour": "red"}', "colour", "unknown field"),
    ('{"title": "t", "body": "x", "state": "gone"}', "state", "must be one of active"),
    ('{"title": "t", "body": "x", "created_at": "yesterday"}', "created_at", "ISO 8601"),
    ('{"title": "t", "body": "x", "created_at": -1}', "created_at", ">= 0"),
    ('{"title": "t", "body": "x", "created_at": NaN}', "created_at", "finite"),
    ('{"title": "t", "body": "x", "last_used_at": true}', "last_used_at", "not a boolean"),
    (
        '{"title": "t", "body": "x", "created_at": 100, "last_used_at": 50}',
        "last_used_at",
        "before 'created_at'",
    ),
]


@pytest.mark.parametrize(("bad", "field", "words"), BAD_LINES)
def test_a_bad_import_line_is_an_error_naming_its_line_and_field_and_nothing_is_written(
    store: NoteStore, tmp_path: Path, bad: str, field: str | None, words: str
) -> None:
    store.add("Existing", "note", now=T0)
    before = store.dump()
    source = tmp_path / "notes.jsonl"
    good = '{"title": "Good", "body": "line"}'
    # Good lines before the bad one (and a blank line, which counts).
    source.write_text(f"{good}\n\n{good}\n{bad}\n{good}\n")
    with pytest.raises(NoteImportError) as caught:
        store.import_jsonl(source)
    error = caught.value
    assert (error.line, error.field) == (4, field)
    assert str(error).startswith("line 4: ")
    assert words in str(error)
    if field is not None:
        assert repr(field) in str(error)
    assert store.dump() == before


def test_an_import_line_that_is_not_utf8_is_named(store: NoteStore, tmp_path: Path) -> None:
    source = tmp_path / "notes.jsonl"
    source.write_bytes(b'{"title": "ok", "body": ""}\n{"title": "\xff", "body": ""}\n')
    before = store.dump()
    with pytest.raises(NoteImportError, match=r"^line 2: not UTF-8"):
        store.import_jsonl(source)
    assert store.dump() == before


def test_an_unreadable_import_file_is_a_store_error(store: NoteStore, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"cannot read .*missing\.jsonl"):
        store.import_jsonl(tmp_path / "missing.jsonl")


# -- the console commands ------------------------------------------------------------------


class Console:
    """Runs a console command the way the runner does: on a pool thread under ``scope.run``."""

    def __init__(self, store: NoteStore) -> None:
        self.store = store
        self.output: list[tuple[str, str]] = []

    def run(self, fn: Callable[[CommandContext, list[str]], None], *args: str) -> str:
        scope = InterruptScope("command")

        def no_client() -> ChatClient:
            raise AssertionError("the memory commands need no provider")

        def no_usage(usage: Usage) -> None:
            raise AssertionError("the memory commands use no provider")

        ctx = CommandContext(
            id="c1",
            line=" ".join(args),
            scope=scope,
            session=Session(),
            services=Services(store=self.store, chat_client=no_client),
            output=lambda stream, data: self.output.append((stream, data)),
            confirm=lambda message: True,
            add_usage=no_usage,
        )
        with ThreadPoolExecutor(1) as pool:
            pool.submit(scope.run, fn, ctx, list(args)).result(10)
        text = "".join(data for stream, data in self.output if stream == "stdout")
        self.output.clear()
        return text


def test_memory_add_list_and_show(store: NoteStore) -> None:
    console = Console(store)
    assert console.run(memory_add, "Lyon", "trip", "--", "Train", "at", "9:12") == "added note #1\n"
    note = store.get(1)
    assert note is not None
    assert (note.title, note.body) == ("Lyon trip", "Train at 9:12")

    listing = console.run(memory_list)
    assert listing.count("\n") == 1
    assert listing.startswith("#1  active  ")
    assert listing.rstrip().endswith("Lyon trip")

    shown = console.run(memory_show, "1").splitlines()
    assert shown[0] == "#1 Lyon trip"
    assert shown[1].startswith("state: active")
    assert shown[-1] == "Train at 9:12"


def test_memory_show_counts_as_a_use(store: NoteStore, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"title": "Old", "body": "x", "state": "stale", "created_at": 5}\n')
    (note_id,) = store.import_jsonl(source)
    Console(store).run(memory_show, f"#{note_id}")
    note = store.get(note_id)
    assert note is not None
    assert note.state is NoteState.ACTIVE
    assert note.last_used_at > 5


@pytest.mark.parametrize(
    ("fn", "args", "words"),
    [
        (memory_add, ["title", "body"], "put -- between the title and the body"),
        (memory_add, ["--", "body"], "the title is missing"),
        (memory_add, ["title", "--"], "the body is missing"),
        (memory_list, ["extra"], "unexpected 'extra'"),
        (memory_show, [], "give one note id"),
        (memory_show, ["one"], "must be a number"),
    ],
)
def test_memory_commands_refuse_bad_words_with_their_usage(
    store: NoteStore, fn: Callable[[CommandContext, list[str]], None], args: list[str], words: str
) -> None:
    before = store.dump()
    with pytest.raises(UsageError) as caught:
        Console(store).run(fn, *args)
    assert words in str(caught.value)
    assert "; usage: memory " in str(caught.value)
    assert store.dump() == before


def test_memory_show_of_a_missing_note_is_an_error(store: NoteStore) -> None:
    with pytest.raises(CommandError, match="there is no note #42") as caught:
        Console(store).run(memory_show, "42")
    assert not isinstance(caught.value, UsageError)


def test_a_store_that_fails_is_a_command_error_in_one_line(store: NoteStore) -> None:
    os.remove(store.path)
    store.path.mkdir()  # now a folder: SQLite cannot open it
    with pytest.raises(CommandError) as caught:
        Console(store).run(memory_list)
    assert str(store.path) in str(caught.value)
    assert "\n" not in str(caught.value)
