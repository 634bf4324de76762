"""The status follows the effect: ``cancelled``/``timeout`` if and only if nothing happened.

Found by cancelling commands at random moments and comparing each
``complete`` with the store afterwards: a cancel that landed after the
store's COMMIT was reported ``cancelled`` (94 of 204 ``memory add``; 59 of 200
consolidations). These tests do the same, hundreds of times, through a real
console over real sockets, and check the rule both ways: a ``cancelled`` or
``timeout`` command changed nothing, and an ``ok`` one did what it said, with
the cancel that came too late in ``late_cancel``.

The random delays below are the randomized cancel points themselves, not
waits for anything: every wait for a result is a bounded wait on a frame.
"""

from __future__ import annotations

import itertools
import json
import random
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from _acker import SlowAcker
from _console import ConsoleClient, running_console
from _support import BOUND, until
from wirecut.console.commands import Args, CommandContext, CommandSet, builtin_commands, command
from wirecut.memory import NoteStore
from wirecut.record import COMMIT_OPEN_ERROR

SEED = random.randrange(1 << 32)
CUT = {"cancelled", "timeout"}


@pytest.fixture
def rng() -> random.Random:
    print(f"random seed: {SEED}")  # shown on failure, to replay the same cancel points
    return random.Random(SEED)


def _check_late_cancel(complete: dict[str, Any], cancelled: bool) -> None:
    """An ``ok`` complete names the cancel that came too late, and keeps it on the timeline."""
    assert complete["reason"] is None
    if cancelled and complete["late_cancel"] is not None:
        steps = [step["event"] for step in complete["lifecycle"]["timeline"]]
        assert steps[0] == "cancel_requested"
    if complete["late_cancel"] is None:
        assert "timeline" not in complete["lifecycle"]


def test_memory_add_cancelled_at_random_moments_is_cancelled_only_if_nothing_was_written(
    tmp_path: Path, rng: random.Random
) -> None:
    outcomes: dict[str, int] = {}
    with running_console(tmp_path) as console, console.client() as client:
        store = NoteStore.in_data_dir(console.data_dir)
        for i in range(150):
            before = store.dump()
            id = client.run(f"memory add 'note {i}' -- 'body {i}'")
            time.sleep(rng.choice((0.0, rng.uniform(0, 0.004))))  # the randomized cancel point
            client.cancel(id)
            complete = client.complete(id)
            written = store.dump() != before
            status = complete["status"]
            outcomes[status] = outcomes.get(status, 0) + 1
            if status in CUT:
                assert not written, f"#{i}: {status} but the note was written: {complete}"
                assert complete["reason"] == "user"
                assert complete["late_cancel"] is None
            else:
                assert status == "ok", complete
                assert written, f"#{i}: ok but nothing was written: {complete}"
                _check_late_cancel(complete, cancelled=True)
    print(f"outcomes: {outcomes}")


def test_memory_add_with_tiny_timeouts_times_out_only_if_nothing_was_written(
    tmp_path: Path, rng: random.Random
) -> None:
    with running_console(tmp_path) as console, console.client() as client:
        store = NoteStore.in_data_dir(console.data_dir)
        for i in range(60):
            before = store.dump()
            id = client.run(
                f"memory add 'note {i}' -- 'body {i}'", timeout=rng.uniform(0.001, 0.005)
            )
            complete = client.complete(id)
            written = store.dump() != before
            if complete["status"] == "timeout":
                assert not written, f"#{i}: timeout but the note was written: {complete}"
                assert complete["reason"] == "timeout"
            else:
                assert complete["status"] == "ok", complete
                assert written
                assert complete["late_cancel"] in (None, "timeout")
                _check_late_cancel(complete, cancelled=complete["late_cancel"] is not None)


def _plan_responder() -> Any:
    """An umbrella over the first two notes of whatever group the curator offers.

    The curator asks about one group of related notes at a time, by note
    id, and offers the group and its parts; the titles are numbered so that
    no two umbrellas of a plan, or of two plans, share one.
    """
    made = itertools.count(1)

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        k = next(made)
        schema = body["response_format"]["json_schema"]["schema"]
        offered = schema["properties"]["umbrellas"]["items"]["properties"]["notes"]["enum"]
        umbrella = {"title": f"Trips, part {k}", "notes": offered[0][:2]}
        return {"content": json.dumps({"umbrellas": [umbrella]})}

    return responder


def _add_pair(client: ConsoleClient, i: int) -> None:
    for title, body in ((f"Trip {i} train", "at nine"), (f"Trip {i} hotel", "near the station")):
        assert client.complete(client.run(f"memory add '{title}' -- '{body}'"))["status"] == "ok"


def test_a_consolidation_cancelled_at_random_moments_is_cancelled_only_if_nothing_changed(
    tmp_path: Path, rng: random.Random
) -> None:
    outcomes: dict[str, int] = {}
    with (
        running_console(tmp_path, responder=_plan_responder()) as console,
        console.client() as client,
    ):
        store = NoteStore.in_data_dir(console.data_dir)
        for i in range(60):
            _add_pair(client, i)
            before = store.dump()
            id = client.run("curator run --consolidate --yes")
            time.sleep(rng.uniform(0, 0.5))  # the randomized cancel point
            client.cancel(id)
            complete = client.complete(id)
            changed = store.dump() != before
            status = complete["status"]
            outcomes[status] = outcomes.get(status, 0) + 1
            if status in CUT:
                assert not changed, f"#{i}: {status} but the plan was applied: {complete}"
            else:
                assert status == "ok", complete
                assert changed, f"#{i}: ok but nothing was applied: {complete}"
                _check_late_cancel(complete, cancelled=True)
    print(f"outcomes: {outcomes}")


def test_a_chat_is_cancelled_only_if_its_reply_was_not_kept(
    tmp_path: Path, rng: random.Random
) -> None:
    seen: list[list[str]] = []

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        seen.append([m["role"] for m in body["messages"]])
        return {"content": "noted, and a few more words to stream"}

    outcomes: dict[str, int] = {}
    with running_console(tmp_path, responder=responder) as console, console.client() as client:
        for i in range(60):
            assert client.complete(client.run("chat --new"))["status"] == "ok"
            id = client.run(f"chat remember {i}")
            time.sleep(rng.uniform(0, 0.08))  # the randomized cancel point
            client.cancel(id)
            complete = client.complete(id)
            outcomes[complete["status"]] = outcomes.get(complete["status"], 0) + 1
            seen.clear()
            assert client.complete(client.run("chat what did I say"))["status"] == "ok"
            kept = seen[-1] == ["system", "user", "assistant", "user"]
            if complete["status"] in CUT:
                assert not kept, f"#{i}: cancelled, yet its reply is in the history: {complete}"
            else:
                assert complete["status"] == "ok", complete
                assert kept, f"#{i}: ok, yet its reply is not in the history: {complete}"
    print(f"outcomes: {outcomes}")
    assert console.server.state.runner.health()["workers"]["busy"] == 0


# -- commit sections: a late cancel, a partial effect, an effect that may still happen -----


def commit_commands(
    acker: SlowAcker, never: threading.Event, scopes: list[Any] | None = None
) -> CommandSet:
    """``test-commit`` (a COMMIT over loopback), ``test-two-steps``, ``test-hung-commit``.

    ``scopes``, when given, gets the scope of each ``test-commit`` as it starts.
    """

    @command("test-commit", summary="(tests) one COMMIT, acknowledged")
    def commit(ctx: CommandContext, args: Args) -> None:
        if scopes is not None:
            scopes.append(ctx.scope)
        with socket.create_connection(acker.address) as sock:
            with ctx.scope.register_socket(sock), ctx.scope.committing("write"):
                sock.sendall(b"COMMIT\n")
                ack = sock.recv(16)
        ctx.write(f"acknowledged: {ack.decode().strip()}\n")

    @command("test-two-steps", summary="(tests) commits, then blocks")
    def two_steps(ctx: CommandContext, args: Args) -> None:
        with ctx.scope.committing("step 1"):
            pass
        ctx.write("step 1 done\n")
        ctx.scope.wait(never)  # step 2, which the cancel cuts

    @command("test-hung-commit", summary="(tests) a COMMIT that hangs")
    def hung(ctx: CommandContext, args: Args) -> None:
        with ctx.scope.committing("write"):
            ctx.write("committing\n")
            never.wait(60)  # a commit the cancel cannot end

    return builtin_commands().plus(commit, two_steps, hung)


def test_a_cancel_during_a_commit_waits_for_it_and_the_command_is_ok_with_a_late_cancel(
    tmp_path: Path, acker: SlowAcker
) -> None:
    never = threading.Event()
    scopes: list[Any] = []
    commands = commit_commands(acker, never, scopes)
    with running_console(tmp_path, commands=commands) as console, console.client() as client:
        id = client.run("test-commit")
        assert acker.got_commit.wait(BOUND)
        client.cancel(id)
        # The COMMIT is answered only once the server took the cancel: a cancel
        # that came after the command returned would be no late cancel at all.
        until(lambda: scopes[0].cancelled)
        acker.ack.set()
        complete = client.complete(id)
        assert client.output(id) == "acknowledged: OK\n"  # the COMMIT's socket was not cut
    assert (complete["status"], complete["reason"], complete["late_cancel"]) == ("ok", None, "user")
    assert complete["lifecycle"]["commits"] == ["write"]
    assert "commit_open" not in complete["lifecycle"]


def test_work_cut_after_a_commit_is_cancelled_with_the_commit_named(
    tmp_path: Path, acker: SlowAcker
) -> None:
    never = threading.Event()
    commands = commit_commands(acker, never)
    with running_console(tmp_path, commands=commands) as console, console.client() as client:
        id = client.run("test-two-steps")
        client.wait_output(id)
        client.cancel(id)
        complete = client.complete(id)
    assert (complete["status"], complete["reason"], complete["late_cancel"]) == (
        "cancelled",
        "user",
        None,
    )
    assert complete["lifecycle"]["commits"] == ["step 1"]
    assert complete["lifecycle"]["worker_exited"] is True


def test_a_commit_still_running_at_the_unwind_bound_is_never_reported_cancelled(
    tmp_path: Path, acker: SlowAcker
) -> None:
    never = threading.Event()
    commands = commit_commands(acker, never)
    try:
        with (
            running_console(tmp_path, commands=commands, unwind_timeout=0.3) as console,
            console.client() as client,
        ):
            id = client.run("test-hung-commit")
            client.wait_output(id)
            client.cancel(id)
            complete = client.complete(id)
            never.set()  # the commit ends, and the leaked worker with it
    finally:
        never.set()
    assert (complete["status"], complete["reason"]) == ("error", "user")
    assert complete["error"] == COMMIT_OPEN_ERROR
    assert complete["lifecycle"]["commit_open"] is True
    assert complete["lifecycle"]["worker_exited"] is False


class _AfterCommit:
    """Holds ``memory add``'s worker at its first output, which comes after its store write.

    ``OutputBuffer.write`` is wrapped (the test's ``monkeypatch``): the
    worker that writes "added note #..." (its COMMIT done, the command not
    yet returned) waits there until ``release`` is set, and the test sends
    its cancel into exactly that moment.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from wirecut.console.runner import OutputBuffer

        self.held = threading.Event()
        self.release = threading.Event()
        write = OutputBuffer.write

        def held_write(buffer: OutputBuffer, stream: Any, data: str) -> None:
            if data.startswith("added note #") and not self.held.is_set():
                self.held.set()
                self.release.wait(BOUND)
            write(buffer, stream, data)

        monkeypatch.setattr(OutputBuffer, "write", held_write)


def test_a_built_in_write_cancelled_after_its_commit_is_ok_with_a_late_cancel_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    after = _AfterCommit(monkeypatch)
    try:
        with running_console(tmp_path) as console, console.client() as client:
            store = NoteStore.in_data_dir(console.data_dir)
            id = client.run("memory add 'Kept' -- 'written before the cancel'")
            assert after.held.wait(BOUND)  # the note is committed; the command still runs
            assert [note.title for note in store.notes()] == ["Kept"]
            client.cancel(id)
            # The cancel reached the command: its scope's timeline has it.
            runner = console.server.state.runner
            command = next(c for c in runner.live() if c.id == id)
            until(lambda: command.scope.cancelled)
            after.release.set()
            complete = client.complete(id)
    finally:
        after.release.set()
    assert (complete["status"], complete["reason"], complete["late_cancel"]) == ("ok", None, "user")
    assert complete["lifecycle"]["commits"] == ["commit"]
    assert [note.title for note in store.notes()] == ["Kept"]
