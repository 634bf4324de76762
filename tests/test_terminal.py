"""``wirecut console``: the terminal client, driven as a person or a script drives it.

Every client here is a real process (``python -m wirecut console``) on a
pseudo-terminal (pexpect) or on pipes, talking to a real console server: one
in this process (``running_console``: uvicorn and the simulator on loopback)
or a ``wirecut serve`` subprocess. Every wait is pexpect's ``expect`` with a
bound or a bounded ``communicate``, never a sleep. Before Ctrl+C the test
waits for the client's "Ctrl+C cancels" line: it shows only once the
command runs and the terminal is back in cooked mode, where ^C is SIGINT.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pexpect
import pytest
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document
from rich.console import Console as RichConsole
from tests._console import Console, gate_command, running_console, wait_health
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect
from websockets.sync.server import ServerConnection, serve

from _support import PROCESS_BOUND as BOUND
from wirecut.client import (
    EXIT_CANCELLED,
    EXIT_TIMEOUT,
    AddressError,
    Renderer,
    describe_complete,
    exit_code,
    from_url,
    timeline_chart,
    visible,
)
from wirecut.client._repl import CommandNames
from wirecut.console.commands import builtin_commands
from wirecut.memory import NoteStore
from wirecut.record import NO_USAGE, CompleteFacts, Ending, LifecycleFacts, McpCallFacts, Reason
from wirecut.simulator import SimConfig, SimulatorServer
from wirecut.simulator._words import WORDS

PROMPT = "wirecut>"  # prompt_toolkit moves the cursor instead of writing the trailing space
#: ANSI styling that may sit between two words on a terminal.
_ANSI = r"(?:\x1b\[[0-9;?]*[ -/]*[@-~])*"
_GAP = _ANSI + r"[ ]+" + _ANSI
#: A token of the simulator's reply.
TOKEN = r"\b(?:" + "|".join(sorted(set(WORDS), key=len, reverse=True)) + ") "
DAY = 24 * 3600.0


def words(*parts: str) -> str:
    """A regex for ``parts`` (regexes) separated by spaces, styled or not."""
    return _GAP.join(parts)


def one_line(stderr: str) -> str:
    """The single line of ``stderr``; fails on a traceback or on more lines."""
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr
    assert len(lines) == 1, stderr
    return lines[0]


def server_dir(tmp_path: Path) -> Path:
    path = tmp_path / "server"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    with running_console(server_dir(tmp_path)) as running:
        yield running


@pytest.fixture
def client_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WIRECUT_TOKEN"}
    env.update(
        WIRECUT_DATA_DIR=str(tmp_path / "client"),
        PROMPT_TOOLKIT_NO_CPR="1",  # pexpect does not answer cursor position requests
        TERM="xterm-256color",
        NO_COLOR="1",
        PYTHONUNBUFFERED="1",
    )
    return env


class Spawner:
    """Starts ``wirecut console`` processes on pseudo-terminals and reaps them all."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.children: list[pexpect.spawn] = []

    def __call__(
        self, *args: str, env: dict[str, str] | None = None, driver: str | None = None
    ) -> pexpect.spawn:
        """``wirecut console ARGS``; with ``driver``, that script runs it (its argv: ARGS)."""
        program = ["-m", "wirecut"] if driver is None else ["-c", driver]
        child = pexpect.spawn(
            sys.executable,
            [*program, "console", *args],
            env=env or self.env,
            encoding="utf-8",
            timeout=BOUND,
            dimensions=(40, 200),
        )
        self.children.append(child)
        return child

    def close(self) -> None:
        for child in self.children:
            child.close(force=True)


@pytest.fixture
def spawn(client_env: dict[str, str]) -> Iterator[Spawner]:
    spawner = Spawner(client_env)
    yield spawner
    spawner.close()


def run_c(
    url: str, line: str, env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[str]:
    """``wirecut console URL -c LINE`` on pipes (no terminal), as a script runs it."""
    return subprocess.run(
        [sys.executable, "-m", "wirecut", "console", *([url] if url else []), *extra, "-c", line],
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def health(console: Console) -> dict[str, Any]:
    response = httpx.get(
        console.server.url + "api/health",
        headers={"Authorization": f"Bearer {console.server.token}"},
        timeout=BOUND,
    )
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def _record(child: pexpect.spawn) -> io.StringIO:
    """Everything ``child`` writes to its terminal from now on, as it was written."""
    seen = io.StringIO()
    child.logfile_read = seen
    return seen


def finish(child: pexpect.spawn) -> int:
    """Wait (bounded) for ``child`` to end; its exit status."""
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus is not None, f"killed by signal {child.signalstatus}"
    return int(child.exitstatus)


# -- the REPL ---------------------------------------------------------------------------


def test_repl_runs_commands_shows_their_output_and_keeps_history(
    console: Console, spawn: Spawner, tmp_path: Path
) -> None:
    child = spawn(console.server.url + f"?token={console.server.token}")
    child.expect(PROMPT)
    child.sendline("memory add Groceries -- milk and bread")
    child.expect(words("added", "note", "#1"))
    child.expect(PROMPT)
    child.sendline("memory list")
    child.expect(words("#1", "active") + ".*Groceries")
    child.expect(PROMPT)
    child.sendline("nosuchcommand")
    child.expect(words("error" + _ANSI + ":", "unknown", "command", "'nosuchcommand'"))
    child.expect(PROMPT)
    child.sendeof()  # Ctrl+D at an empty prompt leaves
    assert finish(child) == 0
    history = (tmp_path / "client" / "console_history").read_text()
    assert "memory list" in history
    assert "nosuchcommand" in history
    assert (tmp_path / "client" / "console_history").stat().st_mode & 0o077 == 0


def test_tab_completes_command_names(console: Console, spawn: Spawner) -> None:
    child = spawn(console.server.url + f"?token={console.server.token}")
    child.expect(PROMPT)
    # Each key only after the echo of the ones before: prompt_toolkit redraws
    # only what changed, so "cur" then Tab shows as "cur" + "ator" when the
    # two reads are apart and as "curator" when they come in one read.
    child.send("cur")
    child.expect("cur")
    child.send("\t")
    child.expect("ator")
    child.send(" st")
    child.expect("st")
    child.send("\t")
    child.expect("atus")
    # What the line became is what ran: "cur st" would be an unknown command.
    child.send("\r")
    child.expect(words("active:", r"\d+"))
    child.expect(PROMPT)
    child.sendeof()
    assert finish(child) == 0


def test_ctrl_c_cancels_a_running_sleep_and_the_server_frees_its_worker(
    console: Console, spawn: Spawner
) -> None:
    child = spawn(console.server.url + f"?token={console.server.token}")
    child.expect(PROMPT)
    child.sendline("sleep 30")
    child.expect(words(r"Ctrl\+C", "cancels"))
    assert health(console)["workers"]["busy"] == 1
    child.sendintr()
    child.expect(words("cancelled", "·", "worker", "exited", r"[\d.]+", "m?s", "after", "the"))
    child.expect(words("cancel", "·", "0", "requests", "open"))
    child.expect(words("cancel", "requested", r"0\.00", "ms"))
    child.expect(PROMPT)
    report = health(console)
    assert report["workers"]["busy"] == 0
    assert report["workers"]["leaked"] == 0
    assert report["requests"]["open"] == 0
    # The Ctrl+C that cancelled does not count toward leaving: the first one
    # at the empty prompt only says how to leave, the second leaves.
    child.sendintr()
    child.expect(words(r"Ctrl\+C", "again"))
    child.expect(PROMPT)
    child.sendintr()
    assert finish(child) == 0


@pytest.mark.parametrize("typed", ["in-one-write", "right-after", "no-cursor-report"])
def test_ctrl_c_pressed_right_after_enter_cancels(
    console: Console, spawn: Spawner, client_env: dict[str, str], typed: str
) -> None:
    """No wait for anything between the Enter and the Ctrl+C: the key is never lost.

    "no-cursor-report": a terminal that does not answer prompt_toolkit's cursor
    position request (as pexpect does not), so after the Enter the prompt waits
    up to a second for the answer, reading keys meanwhile; a Ctrl+C then was
    kept as typeahead for the next prompt and the command ran on.
    """
    env = dict(client_env)
    if typed == "no-cursor-report":
        del env["PROMPT_TOOLKIT_NO_CPR"]
    child = spawn(console.server.url + f"?token={console.server.token}", env=env)
    child.delaybeforesend = None  # pexpect waits 50 ms before each send by default
    seen = _record(child)
    child.expect(PROMPT)
    if typed == "in-one-write":
        child.send("sleep 30\r\x03")  # read by the prompt together with the Enter
    else:
        child.send("sleep 30\r")
        child.sendintr()
    child.expect(words("cancelled"))
    child.expect(words("worker", "exited"))
    child.expect(PROMPT)
    report = wait_health(console.server, lambda h: h["workers"]["busy"] == 0)
    assert report["workers"] == {**report["workers"], "busy": 0, "queued": 0, "leaked": 0}
    # The Ctrl+C went to the command, not to the next prompt (as a "leave?" press).
    child.sendline("jobs")
    child.expect(words("ok", "·"))
    child.expect(PROMPT)
    assert "Ctrl+C again" not in seen.getvalue()
    child.sendeof()
    assert finish(child) == 0


def test_ctrl_c_cancels_a_line_queued_behind_busy_workers(tmp_path: Path, spawn: Spawner) -> None:
    with running_console(server_dir(tmp_path), workers=1) as console:
        with console.client() as other:
            busy = other.run("sleep 30")
            other.wait_for(lambda f: f["type"] == "started" and f["id"] == busy)
            child = spawn(console.server.url + f"?token={console.server.token}")
            child.expect(PROMPT)
            child.sendline("sleep 30")
            child.expect(words("queued:", "every", "worker", "is", "busy"))
            child.sendintr()
            child.expect(words("cancelled", "while", "queued", "·", "never", "started"))
            child.expect(PROMPT)
            report = wait_health(console.server, lambda h: h["workers"]["queued"] == 0)
            # The queued line never ran; the other connection's command still does.
            assert (report["workers"]["queued"], report["workers"]["busy"]) == (0, 1)
            assert other.of(busy)[-1]["type"] == "started"
            other.cancel(busy)
            assert other.complete(busy)["status"] == "cancelled"
        child.sendeof()
        assert finish(child) == 0


def test_a_third_ctrl_c_during_a_slow_unwind_leaves_at_once_with_130(
    tmp_path: Path, spawn: Spawner
) -> None:
    # Pure Python without a cooperative point: only the escalation, 8 s after
    # the cancel, ends it, so its report comes long after the third Ctrl+C.
    with running_console(server_dir(tmp_path), unwind_timeout=30, escalate_after=8.0) as console:
        child = spawn(console.server.url + f"?token={console.server.token}")
        seen = _record(child)
        child.expect(PROMPT)
        child.sendline("probe python-loop")
        child.expect(words("only", "the", "escalation"))  # it runs, and the key watch is on
        child.sendintr()
        child.expect("cancelling…")
        child.sendintr()
        child.expect(words("cancel", "sent;", "waiting"))
        child.sendintr()
        child.expect(words("left", "without", "the", "server's", "report"))
        assert finish(child) == EXIT_CANCELLED
        # It did not wait for the report: none was shown.
        assert "worker exited" not in seen.getvalue()
        report = wait_health(console.server, lambda h: h["workers"]["busy"] == 0, timeout=60)
        assert report["workers"]["busy"] == 0


def test_ctrl_c_cancels_a_streaming_chat_and_reports_its_tokens(
    console: Console, spawn: Spawner
) -> None:
    child = spawn(console.server.url + f"?token={console.server.token}")
    child.expect(PROMPT)
    child.sendline("chat hello")
    child.expect("chat hello")
    for _ in range(3):  # tokens show while the reply is still being written
        child.expect(TOKEN)
    assert health(console)["requests"]["open"] == 1
    child.sendintr()
    child.expect(words("cancelled", "·", "worker", "exited"))
    child.expect(
        words("after", "the", "cancel", "·", "0", "requests", "open", "·", r"(\d+)", "tokens")
    )
    assert int(child.match.group(1)) >= 3
    child.expect(words("cancel", "requested", r"0\.00", "ms"))
    child.expect(words("worker", "exited", r"[\d.]+", "ms"))  # the timeline's last step
    child.expect(PROMPT)
    report = health(console)
    assert report["workers"]["busy"] == 0
    assert report["requests"]["open"] == 0
    child.sendeof()
    assert finish(child) == 0


def _stale_candidate(console: Console) -> NoteStore:
    """A store with one note unused for a year: a curator run wants to mark it stale."""
    store = NoteStore.in_data_dir(console.data_dir)
    store.add("Old", "not used for a year", now=time.time() - 365 * DAY)
    return store


def test_confirm_no_cancels_and_changes_nothing_yes_writes(
    console: Console, spawn: Spawner
) -> None:
    store = _stale_candidate(console)
    child = spawn(console.server.url + f"?token={console.server.token}")
    child.expect(PROMPT)
    child.sendline("curator run")
    child.expect(r"\[y/N\]")
    child.sendline("n")
    child.expect(words("cancelled", "·", "worker", "exited"))
    child.expect(PROMPT)
    assert [note.state.value for note in store.notes()] == ["active"]
    child.sendline("curator run")
    child.expect(r"\[y/N\]")
    child.sendline("y")
    child.expect("done:")
    child.expect(PROMPT)
    assert [note.state.value for note in store.notes()] == ["stale"]
    child.sendeof()
    assert finish(child) == 0


# -- what the server sends reaches the terminal only as visible text ---------------------

#: An OSC 52 clipboard write, a window-title change and a screen clear.
HOSTILE = ["\x1b]52;c;cHduZWQ=\x07", "\x1b]0;owned\x07", "\x1b[2J\x1b[H"]
#: The same as a terminal shows them after ``visible``: ESC as ␛, BEL as ␇.
SHOWN = ["␛]52;c;cHduZWQ=␇", "␛]0;owned␇", "␛[2J␛[H"]


def _hostile_reply(body: dict[str, Any]) -> dict[str, Any]:
    return {"content": "look " + " ".join(HOSTILE) + " done"}


def test_control_sequences_from_the_server_are_shown_never_obeyed(
    tmp_path: Path, spawn: Spawner, client_env: dict[str, str]
) -> None:
    with running_console(server_dir(tmp_path), responder=_hostile_reply) as console:
        url = console.server.url + f"?token={console.server.token}"
        title = "clip" + HOSTILE[0] + "title" + HOSTILE[1] + "clear" + HOSTILE[2] + "end"
        # Added through the console (a script's -c on pipes)...
        added = run_c(url, f"memory add {title} -- body {HOSTILE[1]}", client_env)
        assert (added.returncode, added.stderr) == (0, "")
        # ...and, for a script, listed byte-true: a pipe is not a terminal.
        listed = run_c(url, "memory list", client_env)
        assert title in listed.stdout

        child = spawn(url)
        seen = _record(child)
        child.expect(PROMPT)
        child.sendline("memory list")
        child.expect(re.escape("clip" + SHOWN[0] + "title" + SHOWN[1] + "clear" + SHOWN[2] + "end"))
        child.expect(PROMPT)
        child.sendline("memory show 1")
        child.expect(re.escape("body " + SHOWN[1]))
        child.expect(PROMPT)
        child.sendline("chat hello")  # a reply whose tokens hold the sequences
        child.expect(re.escape(SHOWN[2]) + r".*done")
        child.expect(PROMPT)
        child.sendeof()
        assert finish(child) == 0
        on_screen = seen.getvalue()
        for raw in (*HOSTILE, "\x1b]", "\x07"):
            assert raw not in on_screen

        # -c on a terminal is shown to a person too: made visible as well.
        one = spawn(url, "-c", "memory list")
        one_seen = _record(one)
        one.expect(re.escape(SHOWN[0]))
        assert finish(one) == 0
        assert "\x1b]" not in one_seen.getvalue()


def test_visible_keeps_newline_and_tab_and_shows_every_other_control() -> None:
    text = "a\tb\nc\x1b[31md\x07\x00\x7f\x9b2J\r"
    assert visible(text) == "a\tb\nc␛[31md␇␀␡\ufffd2J␍"
    controls = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0)) if c not in (9, 10)]
    assert not any(c in visible("".join(controls)) for c in controls)
    assert len(visible("".join(controls))) == len(controls)  # one for one: styles stay put


def test_an_error_or_warning_from_the_server_is_made_visible() -> None:
    out = io.StringIO()
    err = io.StringIO()
    renderer = Renderer(
        RichConsole(file=out, force_terminal=True, no_color=True),
        RichConsole(file=err, force_terminal=True, no_color=True),
        verbose=True,
    )
    renderer.complete(CompleteFacts.failed("bad " + HOSTILE[1], elapsed_ms=0.0))
    renderer.warn("server: " + HOSTILE[0])
    renderer.question("curator run will:\n  archive " + HOSTILE[2])
    renderer.output("token", "tok " + HOSTILE[0])
    written = out.getvalue() + err.getvalue()
    assert all(shown in written for shown in SHOWN)
    assert "\x1b]" not in written
    assert "\x1b[2J" not in written


def _two_umbrellas(body: dict[str, Any]) -> dict[str, Any]:
    plan = {
        "umbrellas": [
            {"title": "Trips", "note_ids": [1, 2]},
            {"title": "Recipes", "note_ids": [3, 4]},
        ]
    }
    return {"content": json.dumps(plan)}


def test_a_multi_line_confirmation_is_printed_as_it_is_then_asked(
    tmp_path: Path, spawn: Spawner
) -> None:
    with running_console(server_dir(tmp_path), responder=_two_umbrellas) as console:
        store = NoteStore.in_data_dir(console.data_dir)
        for title in ("Lyon trip", "Paris trip", "Bread recipe", "Soup recipe"):
            store.add(title, "body")
        child = spawn(console.server.url + f"?token={console.server.token}")
        child.expect(PROMPT)
        child.sendline("curator run --consolidate")
        # The plan as its table (each umbrella's title and the notes it
        # archives), each line on a line of its own with its indentation and
        # column alignment kept, and the y/N question only under the last one.
        table = [
            "curator run will:",
            "  create 2 umbrella notes holding the text of the notes it archives:",
            "    new note  archives",
            "    Trips     #1 Lyon trip",
            "              #2 Paris trip",
            "    Recipes   #3 Bread recipe",
            "              #4 Soup recipe",
        ]
        child.expect(re.escape(table[0]) + r"\r\n")
        for line in table[1:]:  # ^: right after the line before
            child.expect("^" + re.escape(line) + r"\r\n")
        child.expect(r"go ahead\?" + _ANSI + r" \[y/N\]")
        assert "#" not in (child.before or "")  # no line of the table under the question
        child.sendline("y")
        child.expect("done:")
        child.expect(PROMPT)
        assert sum(note.state.value == "archived" for note in store.notes()) == 4
        child.sendeof()
        assert finish(child) == 0


# -- -c: one line, for scripts -------------------------------------------------------------


def test_c_prints_the_output_and_exits_0_for_ok_1_for_error(
    console: Console, client_env: dict[str, str]
) -> None:
    url = console.server.url + f"?token={console.server.token}"
    added = run_c(url, "memory add Title -- the body", client_env)
    assert (added.returncode, added.stdout, added.stderr) == (0, "added note #1\n", "")
    listed = run_c(url, "memory list", client_env)
    assert listed.returncode == 0
    assert re.fullmatch(r"#1 +active .* Title\n", listed.stdout)
    failed = run_c(url, "memory show 99", client_env)
    assert failed.returncode == 1
    assert failed.stdout == ""
    assert one_line(failed.stderr).startswith("error: ")


def test_lines_piped_to_stdin_run_one_after_another(
    console: Console, client_env: dict[str, str]
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "wirecut", "console", console.server.url],
        env={**client_env, "WIRECUT_TOKEN": str(console.server.token)},
        input="memory add One -- first\nmemory add Two -- second\n\nmemory list\n",
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert lines[:2] == ["added note #1", "added note #2"]
    assert sorted(line.split()[-1] for line in lines[2:]) == ["One", "Two"]


def test_c_without_a_terminal_declines_a_confirmation(
    console: Console, client_env: dict[str, str]
) -> None:
    store = _stale_candidate(console)
    url = console.server.url + f"?token={console.server.token}"
    result = run_c(url, "curator run", client_env)
    assert result.returncode == EXIT_CANCELLED
    assert "not confirmed" in result.stderr
    assert "--yes" in result.stderr
    assert [note.state.value for note in store.notes()] == ["active"]
    result = run_c(url, "curator run --yes", client_env)
    assert result.returncode == 0
    assert [note.state.value for note in store.notes()] == ["stale"]


#: Runs the REPL with one Ctrl+C (SIGINT) in the gap after its first command
#: ended and before the prompt is back: no command runs then. The script
#: returns from that first ``run`` only once the REPL has taken the Ctrl+C.
_CTRL_C_AFTER_FIRST = """
import asyncio, os, signal, sys
from wirecut.client import _session

run = _session.TerminalSession.run
done = []

async def run_then_ctrl_c(self, line):
    facts = await run(self, line)
    if not done:
        done.append(line)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):  # loop turns until the SIGINT handler ran
            if self._held:
                break
            await asyncio.sleep(0)
        print("ctrl-c taken while idle" if self._held else "ctrl-c lost", flush=True)
    return facts

_session.TerminalSession.run = run_then_ctrl_c
from wirecut.cli import main
main()
"""


def test_a_ctrl_c_while_no_command_runs_does_not_cancel_the_next_one(
    console: Console, spawn: Spawner
) -> None:
    child = spawn(console.server.url + f"?token={console.server.token}", driver=_CTRL_C_AFTER_FIRST)
    child.expect(PROMPT)
    child.sendline("sleep 0")
    child.expect("ctrl-c taken while idle")
    child.expect(PROMPT)
    child.sendline("sleep 0.3")
    child.expect(words("slept", r"0\.3", "s"))
    child.expect(PROMPT)
    assert "cancelled" not in (child.before or "")
    child.sendeof()
    assert finish(child) == 0
    assert health(console)["workers"]["busy"] == 0


def test_c_sigint_cancels_the_command_and_exits_130(console: Console, spawn: Spawner) -> None:
    child = spawn(console.server.url + f"?token={console.server.token}", "-c", "sleep 30")
    child.expect(words(r"Ctrl\+C", "cancels"))
    child.kill(signal.SIGINT)
    child.expect(words("cancelled", "·", "worker", "exited"))
    assert finish(child) == EXIT_CANCELLED
    assert health(console)["workers"]["busy"] == 0


#: Runs ``wirecut`` with a Ctrl+C at one point of its start: the first time the
#: audit event ``argv[1]`` (or ``import:MODULE``) fires, SIGINT is raised in the
#: process, as a person pressing Ctrl+C at that moment would.
_CTRL_C_AT = """
import signal, sys
point = sys.argv.pop(1)
fired = []
def hook(event, args):
    if fired:
        return
    if event == point or (event == "import" and "import:" + str(args[0]) == point):
        fired.append(point)
        signal.raise_signal(signal.SIGINT)
sys.addaudithook(hook)
from wirecut.cli import main
try:
    main()
finally:
    print("fired: " + ",".join(fired), file=sys.stderr)
"""


@pytest.mark.parametrize("point", ["import:wirecut.client", "socket.connect"])
def test_c_exits_130_for_a_ctrl_c_before_the_command_was_sent(
    console: Console, client_env: dict[str, str], point: str
) -> None:
    url = console.server.url + f"?token={console.server.token}"
    result = subprocess.run(
        [sys.executable, "-c", _CTRL_C_AT, point, "console", url, "-c", "sleep 30"],
        capture_output=True,
        text=True,
        timeout=BOUND,
        env=client_env,
        stdin=subprocess.DEVNULL,
    )
    assert f"fired: {point}" in result.stderr  # the Ctrl+C came where it was meant to
    assert result.returncode == EXIT_CANCELLED, result.stderr
    assert "Aborted!" not in result.stderr
    assert "Traceback" not in result.stderr
    assert health(console)["workers"]["busy"] == 0


def test_c_exits_124_when_the_command_times_out(tmp_path: Path, client_env: dict[str, str]) -> None:
    with running_console(server_dir(tmp_path), command_timeout=0.5) as console:
        url = console.server.url + f"?token={console.server.token}"
        result = run_c(url, "sleep 30", client_env)
        assert result.returncode == EXIT_TIMEOUT
        assert result.stdout == ""
        assert "timed out after" in result.stderr
        assert "worker exited" in result.stderr
        assert health(console)["workers"]["busy"] == 0


def test_a_question_left_unanswered_ends_with_the_commands_timeout(
    tmp_path: Path, spawn: Spawner
) -> None:
    with running_console(server_dir(tmp_path), command_timeout=1.0) as console:
        store = _stale_candidate(console)
        child = spawn(console.server.url + f"?token={console.server.token}")
        child.expect(PROMPT)
        child.sendline("curator run")
        child.expect(r"\[y/N\]")
        # Nobody answers: the timeout ends the command and takes the question down.
        child.expect(words("timed", "out", "after"))
        child.expect(PROMPT)
        child.sendline("curator status")
        child.expect(words("active:", "1"))
        child.expect(PROMPT)
        assert [note.state.value for note in store.notes()] == ["active"]
        child.sendeof()
        assert finish(child) == 0


# -- a cancel that crosses its command's complete ------------------------------------------

Frame = dict[str, Any]


class LateCancelRelay:
    """A WebSocket relay between one client and a console that makes cancels come late.

    Frames pass as they are, in order, except a client's ``cancel`` for an id
    whose ``complete`` has not passed yet: it waits at the relay and goes on
    right after that ``complete``, as if it had crossed it on the wire (what a
    slow uplink does to a Ctrl+C pressed as a command ends). ``inject`` sends a
    frame of the test's to the console as the client's. Every frame the
    console sends is kept for ``wait_down``. Threads: one per direction.
    """

    def __init__(self, upstream_url: str) -> None:
        self.upstream_url = upstream_url
        self._cond = threading.Condition()  # guards everything below; wakes the waits
        self._upstream: ClientConnection | None = None
        self._held: dict[str, str] = {}  # id -> its cancel, not yet sent
        self._completed: set[str] = set()
        self.down: list[Frame] = []
        self._server = serve(self._relay, "127.0.0.1", 0, max_size=None)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self._server.socket.getsockname()[1]}/api/console"

    def _relay(self, client: ServerConnection) -> None:
        with connect(self.upstream_url, max_size=None) as upstream:
            with self._cond:
                self._upstream = upstream
            back = threading.Thread(target=self._down, args=(upstream, client), daemon=True)
            back.start()
            try:
                for message in client:
                    frame = json.loads(message)
                    with self._cond:
                        id = frame.get("id")
                        if frame.get("type") == "cancel" and id not in self._completed:
                            self._held[id] = str(message)
                            continue
                        upstream.send(message)
            except ConnectionClosed:
                pass
        back.join(BOUND)

    def _down(self, upstream: ClientConnection, client: ServerConnection) -> None:
        try:
            for message in upstream:
                frame = json.loads(message)
                client.send(message)
                with self._cond:
                    self.down.append(frame)
                    if frame.get("type") == "complete":
                        self._completed.add(frame["id"])
                        late = self._held.pop(frame["id"], None)
                        if late is not None:
                            upstream.send(late)
                    self._cond.notify_all()
        except ConnectionClosed:
            pass
        client.close()

    def inject(self, frame: Frame) -> None:
        with self._cond:
            assert self._upstream is not None, "no client is connected"
            self._upstream.send(json.dumps(frame))

    def wait_down(self, match: Callable[[Frame], bool]) -> Frame:
        """The first frame the console sent that ``match``es (bounded)."""
        with self._cond:
            found = self._cond.wait_for(lambda: next(filter(match, self.down), None), BOUND)
        assert found is not None, f"the console sent no such frame: {self.down[-5:]}"
        return found

    def __enter__(self) -> LateCancelRelay:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._thread.join(BOUND)


def test_a_ctrl_c_that_crosses_its_commands_end_shows_nothing_other_errors_show(
    tmp_path: Path, spawn: Spawner
) -> None:
    """The server answers a cancel that came after the complete with an error naming the id
    in "ref": the user pressed Ctrl+C as the command ended, which is not news."""
    opened = threading.Event()
    commands = builtin_commands().plus(gate_command(opened))
    with (
        running_console(server_dir(tmp_path), commands=commands) as console,
        LateCancelRelay(console.server.ws_url) as relay,
    ):
        child = spawn(relay.url + f"?token={console.server.token}")
        seen = _record(child)
        child.expect(PROMPT)
        child.sendline("test-gate")
        child.expect(words(r"Ctrl\+C", "cancels"))
        child.sendintr()
        child.expect("cancelling…")  # the cancel is sent: the relay holds it
        opened.set()  # so the command ends on its own, and its complete goes out first
        child.expect(words("ok", "·"))
        child.expect(PROMPT)
        crossed = relay.wait_down(lambda f: f["type"] == "error")
        assert (crossed["id"], crossed["ref"]) == (None, "c1")
        # The console answers frames in order and the client shows them in
        # order: once the next line's end is on the screen, the error came before.
        child.sendline("jobs")
        child.expect(words("ok", "·"))
        child.expect(PROMPT)
        assert "no live command" not in seen.getvalue()
        assert "server:" not in seen.getvalue()

        # An error about an id that is not one of this client's is still shown.
        relay.inject({"type": "cancel", "id": "zz"})
        child.expect(words("server:", "no", "live", "command", "with", "id", "'zz'"))
        child.sendeof()
        assert finish(child) == 0


def test_a_close_reason_from_the_server_is_shown_never_obeyed(client_env: dict[str, str]) -> None:
    """A server that closes with a reason holding escape sequences: one visible error line."""
    reason = "bye " + "".join(HOSTILE) + "\nnext"

    def close_with_reason(ws: ServerConnection) -> None:
        ws.send(json.dumps({"type": "ready", "version": "0", "prompt": "wirecut> "}))
        ws.recv(BOUND)  # the run frame
        ws.close(4000, reason)

    with serve(close_with_reason, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        port = server.socket.getsockname()[1]
        result = run_c(f"ws://127.0.0.1:{port}/api/console?token=t", "sleep 1", client_env)
        server.shutdown()
        thread.join(BOUND)
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert "closed the connection (code 4000: bye " + "".join(SHOWN) + "␊next)" in line
    assert "\x1b" not in result.stderr
    assert "\x07" not in result.stderr


# -- finding the console, and failing clearly ----------------------------------------------


def test_a_wrong_or_missing_token_is_one_clear_line_and_exit_1(
    console: Console, client_env: dict[str, str]
) -> None:
    wrong = run_c(console.server.url + "?token=not-the-token", "memory list", client_env)
    assert wrong.returncode == 1
    assert "refused the token" in one_line(wrong.stderr)
    assert "4401" in wrong.stderr
    assert "not-the-token" not in wrong.stderr
    missing = run_c(console.server.url, "memory list", client_env)
    assert missing.returncode == 1
    assert "wants a token" in one_line(missing.stderr)
    from_env = run_c(
        console.server.url,
        "memory list",
        {**client_env, "WIRECUT_TOKEN": str(console.server.token)},
    )
    assert (from_env.returncode, from_env.stderr) == (0, "")


def test_no_server_is_one_clear_line_and_exit_1(client_env: dict[str, str]) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = run_c(f"http://127.0.0.1:{port}/", "memory list", client_env)
    assert result.returncode == 1
    assert "no console at" in one_line(result.stderr)
    assert "connection refused" in result.stderr


def test_without_a_url_it_reads_serve_json(
    console: Console, client_env: dict[str, str], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    info = {"url": console.server.url, "token": console.server.token, "pid": os.getpid()}
    info["instance"] = console.server.instance  # what /api/proof proves it holds the token for
    (data / "serve.json").write_text(json.dumps(info))
    result = run_c("", "memory add From -- serve.json", client_env, "--data-dir", str(data))
    assert (result.returncode, result.stdout, result.stderr) == (0, "added note #1\n", "")


def test_without_a_url_or_serve_json_it_says_so(client_env: dict[str, str], tmp_path: Path) -> None:
    result = run_c("", "memory list", client_env, "--data-dir", str(tmp_path / "empty"))
    assert result.returncode == 1
    assert "serve.json does not exist" in one_line(result.stderr)


def test_bad_usage_exits_2(client_env: dict[str, str]) -> None:
    assert run_c("ftp://127.0.0.1/", "memory list", client_env).returncode == 2
    assert run_c("http://127.0.0.1:1/", "  ", client_env).returncode == 2


def test_a_dropped_connection_is_one_clear_line_and_exit_1(
    tmp_path: Path, spawn: Spawner, client_env: dict[str, str]
) -> None:
    """A ``wirecut serve`` that is killed: the client learns it from the dead socket."""
    data = tmp_path / "data"
    config = SimConfig(slots=2, tokens_per_second=200, prompt_ms=5, endless=True)
    with SimulatorServer(config) as sim:
        server = pexpect.spawn(
            sys.executable,
            ["-m", "wirecut", "serve", "--port", "0", "--provider-url", sim.base_url],
            env={**client_env, "WIRECUT_DATA_DIR": str(data)},
            encoding="utf-8",
            timeout=BOUND,
        )
        try:
            server.expect(r"wirecut console: http://")
            assert (data / "serve.json").stat().st_mode & 0o077 == 0
            child = spawn("--data-dir", str(data))  # the URL and token from serve.json
            child.expect(PROMPT)
            child.sendline("sleep 30")
            child.expect(words(r"Ctrl\+C", "cancels"))
            server.kill(signal.SIGKILL)
            child.expect(r"wirecut console: the connection to http://127\.0\.0\.1:\d+/ was lost")
            child.expect("while `sleep 30` ran")
            assert "Traceback" not in (child.before or "")
            assert finish(child) == 1
        finally:
            server.close(force=True)


# -- the pieces, without a terminal ---------------------------------------------------------


def test_urls_as_serve_prints_them_or_as_websockets() -> None:
    page = from_url("http://127.0.0.1:8765/?token=abc", env={})
    assert page.ws_url == "ws://127.0.0.1:8765/api/console"
    assert page.health_url == "http://127.0.0.1:8765/api/health"
    assert (page.token, page.display) == ("abc", "http://127.0.0.1:8765/")
    ws = from_url("wss://example.test/wirecut/api/console", env={"WIRECUT_TOKEN": "t"})
    assert ws.ws_url == "wss://example.test/wirecut/api/console"
    assert ws.health_url == "https://example.test/wirecut/api/health"
    assert ws.token == "t"
    for bad in ("ftp://x/", "http://", "127.0.0.1:8765", "http://h:99999/"):
        with pytest.raises(AddressError):
            from_url(bad, env={})


def test_a_worker_that_did_not_exit_is_reported_as_such() -> None:
    frame = {
        "status": "cancelled",
        "error": None,
        "reason": "user",
        "elapsed_ms": 10500.0,
        "usage": {"completion_tokens": 7, "requests": 1},
        "lifecycle": {
            "worker_exited": False,
            "open_requests": 1,
            "open_processes": 2,
            "started": True,
            "timeline": [
                {"event": "cancel_requested", "ms": 0.0},
                {"event": "sockets_shut", "ms": 0.5},
            ],
        },
    }
    facts = CompleteFacts.from_wire(frame)
    line = describe_complete(facts).plain
    assert line == (
        "cancelled · worker still running · 1 request open · 2 processes open · 7 tokens"
    )
    chart = timeline_chart(facts)
    assert chart is not None
    assert chart.plain.splitlines()[-1].split() == [
        "worker",
        "exited",
        "—",
        "not",
        "by",
        "the",
        "time",
        "of",
        "the",
        "report",
    ]
    queued = CompleteFacts.unstarted(Reason.USER, elapsed_ms=1.0)
    assert describe_complete(queued).plain.startswith("cancelled while queued · never started")


def test_the_facts_line_says_whether_each_mcp_server_stopped_its_call() -> None:
    facts = CompleteFacts.ended(
        Ending.CUT,
        Reason.USER,
        error=None,
        elapsed_ms=2000.0,
        usage=NO_USAGE,
        lifecycle=LifecycleFacts(True, 0, 0, True),
        mcp=(
            McpCallFacts("tools", "fetch", True),
            McpCallFacts("plain", "wait", None),
            McpCallFacts("odd\x1b[2J", "run", False),
        ),
    )
    line = describe_complete(facts).plain
    assert line == (
        "cancelled · worker exited · 0 requests open · MCP tools/fetch stopped"
        " · MCP plain/wait: stop unconfirmed · MCP odd\u241b[2J/run NOT stopped"
    )


def test_the_time_of_a_cancel_is_the_servers_from_the_cancel_to_the_workers_exit() -> None:
    # The web page says the same words and the same number (test_web.py).
    frame = {
        "status": "cancelled",
        "error": None,
        "reason": "user",
        "elapsed_ms": 5000.0,
        "usage": {"completion_tokens": 37, "requests": 1},
        "lifecycle": {
            "worker_exited": True,
            "open_requests": 0,
            "open_processes": 0,
            "started": True,
            "timeline": [
                {"event": "cancel_requested", "ms": 0.0},
                {"event": "sockets_shut", "ms": 0.2},
                {"event": "worker_exited", "ms": 41.0},
            ],
        },
    }
    line = describe_complete(CompleteFacts.from_wire(frame)).plain
    assert line == "cancelled · worker exited 41 ms after the cancel · 0 requests open · 37 tokens"


@pytest.mark.parametrize("verbose", [True, False])
def test_a_cancel_that_came_too_late_is_said_even_when_quiet(verbose: bool) -> None:
    out = io.StringIO()
    err = io.StringIO()
    renderer = Renderer(
        RichConsole(file=out, force_terminal=True, no_color=True),
        RichConsole(file=err, force_terminal=True, no_color=True),
        verbose=verbose,
    )
    done = CompleteFacts.ended(
        Ending.RETURNED,
        Reason.USER,
        error=None,
        elapsed_ms=3.0,
        usage=NO_USAGE,
        lifecycle=LifecycleFacts(True, 0, 0, True),
    )
    renderer.complete(done)
    assert "too late: the command had already finished" in err.getvalue()
    renderer.complete(done.replace(late_cancel=None))
    assert err.getvalue().count("too late") == 1
    assert exit_code("ok") == 0  # the exit code follows the status, not the cancel


def test_exit_codes_follow_the_status() -> None:
    assert [exit_code(s) for s in ("ok", "error", "timeout", "cancelled", "?")] == [
        0,
        1,
        124,
        130,
        1,
    ]


def test_completion_learns_new_command_names_from_help() -> None:
    names = CommandNames()

    def completions(text: str) -> list[str]:
        found = names.completer().get_completions(Document(text), CompleteEvent())
        return [completion.text for completion in found]

    assert completions("frob") == []
    # help's output arrives in pieces that split lines anywhere
    names.learn("help", "frobnicate THING   a command this client never heard of\nmemory pr")
    names.learn("help", "une [--all]  another\n\nprovider: the simulator\n")
    names.learn("jobs", "sleeper  running  1.0 s  sleep 5\n")  # not help: nothing learned
    assert completions("frob") == ["frobnicate"]
    assert "prune" in completions("memory pr")
    assert completions("slee") == ["sleep"]
    assert "provider" not in names.tree


def test_completion_offers_every_flag_of_every_built_in_command() -> None:
    # The terminal's table was written by hand and fell behind the server's
    # commands once (`curator run --summarize`): it is checked against them.
    names = CommandNames()

    def completions(text: str) -> list[str]:
        found = names.completer().get_completions(Document(text), CompleteEvent())
        return [completion.text for completion in found]

    missing = []
    for found in builtin_commands():
        for flag in re.findall(r"\[(--[a-z-]+)", found.usage):
            if flag not in completions(f"{found.name} --"):
                missing.append(f"{found.name} {flag}")
    assert missing == []


def test_completion_still_learns_names_from_a_help_whose_long_usages_have_lines_of_their_own(
    console: Console,
) -> None:
    with console.client() as c:
        id = c.run("help")
        c.complete(id)
        text = c.output(id)
    names = CommandNames()
    names.tree.clear()
    names.learn("help", text)
    assert set(names.tree) == {found.name.split()[0] for found in builtin_commands()}
