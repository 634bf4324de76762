"""The console commands over the note store: ``memory ...`` and ``curator ...``.

Each runs on a worker thread with the command's scope bound (see
``_context``). The store calls are short SQLite transactions; the only long
step is the model's plan in ``curator run --consolidate``, which runs with no
transaction open and is cut by a cancel like any agent turn.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from datetime import timedelta

from wirecut.console.commands._context import CommandContext, CommandError
from wirecut.console.commands._params import Args, Argument, Flag, Option
from wirecut.console.commands._registry import command
from wirecut.memory import (
    ARCHIVE_AFTER,
    PLAN_MAX_TOKENS,
    STALE_AFTER,
    ConflictError,
    CuratorOutcome,
    NoteState,
    NoteStore,
    StoreError,
    curate,
    format_note,
    format_notes,
    plan_table,
)

__all__ = [
    "MEMORY_COMMANDS",
    "curator_run",
    "curator_status",
    "memory_add",
    "memory_list",
    "memory_show",
]

#: The longest threshold ``--stale-days``/``--archive-days`` take (a century).
MAX_DAYS = 36_500
#: The shortest: one second (a shorter one would round to no time at all).
MIN_DAYS = 1 / 86_400
#: Note ids are SQLite's positive 64-bit integers: at most 19 digits.
MAX_ID_DIGITS = 19
_BLANKS = re.compile(r"\s+")


@contextlib.contextmanager
def _notes(ctx: CommandContext) -> Iterator[NoteStore]:
    """The note store, its errors turned into the command's one-line error."""
    store = ctx.services.store
    if store is None:
        raise CommandError("there is no note store here (it stays with the serve process)")
    try:
        yield store
    except StoreError as exc:
        raise CommandError(str(exc)) from None


@contextlib.contextmanager
def _conflicts_said() -> Iterator[None]:
    """A conflict (notes changed while the model worked) is said as such, not as a store error."""
    try:
        yield
    except ConflictError as exc:
        raise CommandError(f"{exc} (they were used or changed while the model worked)") from None


def _lines(ctx: CommandContext, lines: list[str]) -> None:
    ctx.write("".join(f"{line}\n" for line in lines))


def _title_and_body(words: list[str]) -> tuple[str, str]:
    """The words before ``--`` as the title, the words after it as the body."""
    if "--" not in words:
        raise ValueError("put -- between the title and the body")
    split = words.index("--")
    title, body = " ".join(words[:split]), " ".join(words[split + 1 :])
    if not title.strip():
        raise ValueError("the title is missing")
    if not body.strip():
        raise ValueError("the body is missing")
    return title, body


@command(
    "memory add",
    Argument("TITLE -- BODY", dest="note", many=True, convert=_title_and_body),
    summary="add a note",
)
def memory_add(ctx: CommandContext, args: Args) -> None:
    """Add an active note: the words before ``--`` are its title, the words after it its body."""
    title, body = args["note"]
    with _notes(ctx) as store:
        try:
            note = store.add(title, body)
        except ValueError as exc:
            raise memory_add.usage_error(str(exc)) from None
    ctx.write(f"added note #{note.id}\n")


@command("memory list", summary="list the notes")
def memory_list(ctx: CommandContext, args: Args) -> None:
    """One line per note: id, state, last use, title."""
    with _notes(ctx) as store:
        notes = store.notes()
    _lines(ctx, format_notes(notes))


def _note_id(given: str) -> int:
    """``ID`` or ``#ID``: at most ``MAX_ID_DIGITS`` ASCII digits (leading zeros aside)."""
    word = given.removeprefix("#")
    # isdigit() alone lets "²" and other digits that int() refuses through,
    # and int() refuses more than 4,300 digits: check both here, at the edge.
    if not (word.isascii() and word.isdigit()):
        raise ValueError(f"the note id must be a number, not {given!r:.40}")
    word = word.lstrip("0") or "0"
    if len(word) > MAX_ID_DIGITS:
        raise ValueError(f"the note id has more than {MAX_ID_DIGITS} digits")
    return int(word)


@command(
    "memory show",
    Argument("ID", convert=_note_id, missing="give one note id"),
    summary="show a note (and count it as used)",
)
def memory_show(ctx: CommandContext, args: Args) -> None:
    """Print a note in full. Showing a note is a use: it stays active (a stale one is again)."""
    with _notes(ctx) as store:
        note = store.touch(args["id"])
        if note is None:
            raise CommandError(f"there is no note #{args['id']}")
        umbrella = store.get(note.umbrella_id) if note.umbrella_id is not None else None
        merged = store.merged_into(note.id)
    _lines(ctx, format_note(note, umbrella=umbrella, merged=merged))


@command("curator status", summary="count the active, stale and archived notes")
def curator_status(ctx: CommandContext, args: Args) -> None:
    """One line per state: how many notes are in it."""
    with _notes(ctx) as store:
        counts = store.counts()
    _lines(ctx, [f"{state}: {counts[state]}" for state in NoteState])


def _days(option: str, value: str) -> timedelta:
    """A threshold in days: in (0, ``MAX_DAYS``], and at least one second."""
    try:
        days = float(value)
    except ValueError:
        days = math.nan
    if not math.isfinite(days) or not 0 < days <= MAX_DAYS:
        raise ValueError(f"{option} must be a number of days in (0, {MAX_DAYS}], not {value!r:.40}")
    if days < MIN_DAYS:
        # timedelta rounds to microseconds: 1e-300 days would be no time at all.
        raise ValueError(
            f"{option} must be at least one second ({MIN_DAYS:.3g} days), not {value!r:.40}"
        )
    return timedelta(days=days)


@command(
    "curator run",
    Flag("--consolidate"),
    Flag("--dry-run"),
    Flag("--yes"),
    Flag("--summarize"),
    Option("--stale-days", "DAYS", _days, STALE_AFTER, missing="needs a number of days"),
    Option("--archive-days", "DAYS", _days, ARCHIVE_AFTER, missing="needs a number of days"),
    summary="mark unused notes stale, archive old stale ones; --consolidate merges related notes",
)
def curator_run(ctx: CommandContext, args: Args) -> None:
    """The curator pass; asks for confirmation before it writes unless ``--yes``.

    With ``--consolidate`` the model plans umbrella notes (its reply streams
    as ``token`` output with whitespace runs collapsed, its usage is
    counted); each holds its notes' own text, and with ``--summarize`` a
    checked summary above it. An invalid plan fails the command with the
    reasons, said once (in the error), and nothing is written. The
    confirmation shows the plan as a table (``describe_run``). ``--dry-run``
    prints what would change, the same table, and writes nothing.

    Cancellation: a cancel while the model works cuts its request; during
    the confirmation it ends the wait; before the commit it rolls the write
    back. The store is left as it was in each case.
    """
    consolidate = args["consolidate"]
    if args["summarize"] and not consolidate:
        raise curator_run.usage_error("--summarize needs --consolidate")

    # A small model's JSON may come with screens of blank lines: the user
    # sees it with every whitespace run collapsed to one space.
    streamed = blank = False

    def on_token(text: str) -> None:
        nonlocal streamed, blank
        compact = _BLANKS.sub(" ", text)
        if blank:
            compact = compact.lstrip(" ")
        if compact:
            blank = compact.endswith(" ")
            streamed = True
            ctx.token(compact)

    try:
        with _notes(ctx) as store, _conflicts_said():
            run = curate(
                store,
                client=ctx.services.chat_client() if consolidate else None,
                consolidate=consolidate,
                dry_run=args["dry_run"],
                summarize=args["summarize"],
                confirm=None if args["yes"] else ctx.confirm,
                stale_after=args["stale_days"],
                archive_after=args["archive_days"],
                model=ctx.services.model,
                max_tokens=max(PLAN_MAX_TOKENS, ctx.services.max_tokens),
                on_token=on_token,
                on_usage=ctx.add_usage,
                on_progress=lambda line: ctx.write(line + "\n"),
            )
    finally:
        # A reply read to its end ends its line; after a cut, nothing more
        # is written (a frame each, in the middle of a burst of cancels).
        if streamed and not ctx.scope.cancelled:
            ctx.token("\n")

    lines = [run.skipped] if run.skipped else []
    changes = [f"  {line}" for line in run.changes()]
    if run.outcome is CuratorOutcome.INVALID_PLAN:
        # Said once: the error is the command's outcome (``complete.error``).
        if lines:
            _lines(ctx, lines)
        raise CommandError("the plan is invalid, nothing was changed: " + "; ".join(run.problems))
    if run.outcome is CuratorOutcome.NOTHING_TO_DO:
        lines.append("nothing to change")
    elif run.outcome is CuratorOutcome.DRY_RUN:
        lines += ["dry run, nothing was changed; a run would:", *changes]
        if run.plan is not None:
            lines += [f"    {line}" for line in plan_table(run.notes, run.plan)]
    elif run.outcome is CuratorOutcome.DECLINED:
        lines.append("not confirmed; nothing was changed")
    else:
        made = ", ".join(f"#{note.id}" for note in run.umbrellas)
        lines += ["done:", *changes]
        if made:
            lines.append(f"  new umbrella notes: {made}")
    _lines(ctx, lines)


#: The note store's commands, for the console's command set.
MEMORY_COMMANDS = (memory_add, memory_list, memory_show, curator_status, curator_run)
