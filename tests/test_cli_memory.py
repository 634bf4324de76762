"""``wirecut memory add | list | import``: the note store from the shell.

Through the real ``wirecut`` group (its lazy loading included), with the
store in ``tmp_path``. Exit 0 on success, 2 on a usage error, 1 otherwise,
and every error is one line on stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from wirecut.cli import main
from wirecut.memory import FILE_NAME, NoteState, NoteStore


def wirecut(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def error_line(result: Result) -> str:
    """The one line of an error on stderr."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_add_then_list(tmp_path: Path) -> None:
    added = wirecut("memory", "add", "Lyon trip", "Train at 9:12", "--data-dir", tmp_path)
    assert (added.exit_code, added.stdout) == (0, "added note #1\n")
    listed = wirecut("memory", "list", "--data-dir", tmp_path)
    assert listed.exit_code == 0
    assert listed.stdout.startswith("#1  active  ")
    assert listed.stdout.rstrip().endswith("Lyon trip")
    note = NoteStore.in_data_dir(tmp_path).get(1)
    assert note is not None
    assert note.body == "Train at 9:12"


def test_the_data_dir_comes_from_the_environment(tmp_path: Path) -> None:
    result = wirecut("memory", "add", "T", "B", env={"WIRECUT_DATA_DIR": str(tmp_path)})
    assert result.exit_code == 0
    assert (tmp_path / FILE_NAME).is_file()


def test_list_of_an_empty_store_says_so(tmp_path: Path) -> None:
    result = wirecut("memory", "list", "--data-dir", tmp_path)
    assert (result.exit_code, result.stdout) == (0, "no notes\n")


@pytest.mark.parametrize(
    ("title", "body", "words"),
    [("", "body", "TITLE"), ("a\nb", "body", "one line"), ("ok", "\x00", "BODY")],
)
def test_add_with_a_bad_title_or_body_is_a_usage_error(
    tmp_path: Path, title: str, body: str, words: str
) -> None:
    result = wirecut("memory", "add", title, body, "--data-dir", tmp_path)
    assert result.exit_code == 2
    assert words in result.stderr
    assert NoteStore.in_data_dir(tmp_path).notes() == []


def test_import_adds_all_lines(tmp_path: Path) -> None:
    source = tmp_path / "notes.jsonl"
    source.write_text(
        json.dumps({"title": "One", "body": "1"})
        + "\n"
        + json.dumps({"title": "Two", "body": "2", "state": "stale"})
        + "\n"
    )
    result = wirecut("memory", "import", source, "--data-dir", tmp_path)
    assert (result.exit_code, result.stdout) == (0, "imported 2 notes\n")
    states = [n.state for n in NoteStore.in_data_dir(tmp_path).notes()]
    assert states == [NoteState.ACTIVE, NoteState.STALE]


def test_import_with_a_bad_line_names_it_and_imports_nothing(tmp_path: Path) -> None:
    source = tmp_path / "notes.jsonl"
    source.write_text('{"title": "Good", "body": "1"}\n{"title": "Bad", "body": 2}\n')
    result = wirecut("memory", "import", source, "--data-dir", tmp_path)
    assert result.exit_code == 1
    line = error_line(result)
    assert "line 2: field 'body' must be a string" in line
    assert "nothing was imported" in line
    assert NoteStore.in_data_dir(tmp_path).notes() == []


def test_import_of_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    result = wirecut("memory", "import", tmp_path / "nope.jsonl", "--data-dir", tmp_path)
    assert result.exit_code == 2
    assert "nope.jsonl" in result.stderr


def test_a_store_that_cannot_be_opened_is_one_line_and_exit_1(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_bytes(b"garbage" * 1000)
    result = wirecut("memory", "list", "--data-dir", tmp_path)
    assert result.exit_code == 1
    line = error_line(result)
    assert FILE_NAME in line
    assert "not a database" in line


def test_a_data_dir_that_cannot_be_made_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = wirecut("memory", "list", "--data-dir", blocker / "sub")
    assert result.exit_code == 2
    assert "--data-dir" in result.stderr


def test_the_installed_command_runs_in_a_real_process(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "wirecut", "memory", "add", "T", "B", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "added note #1\n", "")


def test_show_prints_the_note_in_full_and_counts_it_as_used(tmp_path: Path) -> None:
    store = NoteStore.in_data_dir(tmp_path)
    added = store.add("Lyon trip", "Train at 9:12\nSeat 42", now=1_000_000.0)
    result = wirecut("memory", "show", f"#{added.id}", "--data-dir", tmp_path)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"#{added.id} Lyon trip"
    assert lines[1].startswith("state: active · created 1970-01-12 13:46 UTC · last used ")
    assert lines[2:] == ["", "Train at 9:12", "Seat 42"]
    note = store.get(added.id)
    assert note is not None
    assert note.last_used_at > added.last_used_at  # showing is a use, as in the console
    plain = wirecut("memory", "show", str(added.id), "--data-dir", tmp_path)  # "#" is optional
    assert (plain.exit_code, plain.stdout.splitlines()[0]) == (0, lines[0])


@pytest.mark.parametrize(
    ("note_id", "code", "words"),
    [("7", 1, "there is no note #7"), ("abc", 2, "the note id must be a number, not 'abc'")],
)
def test_show_of_a_missing_or_bad_id_is_one_line(
    tmp_path: Path, note_id: str, code: int, words: str
) -> None:
    before = NoteStore.in_data_dir(tmp_path).dump()
    result = wirecut("memory", "show", note_id, "--data-dir", tmp_path)
    assert result.exit_code == code
    # click's usage error carries its usage lines; the error itself is one line.
    assert words in (error_line(result) if code == 1 else result.stderr.splitlines()[-1])
    assert "Traceback" not in result.output
    assert NoteStore.in_data_dir(tmp_path).dump() == before
