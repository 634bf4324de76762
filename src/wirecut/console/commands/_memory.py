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

from wirecut.console.commands._context import CommandContext, CommandError, UsageError
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

ADD_USAGE = "memory add TITLE -- BODY"
LIST_USAGE = "memory list"
SHOW_USAGE = "memory show ID"
STATUS_USAGE = "curator status"
#: The longest threshold ``--stale-days``/``--archive-days`` take (a century).
MAX_DAYS = 36_500
#: The shortest: one second (a shorter one would round to no time at all).
MIN_DAYS = 1 / 86_400
#: Note ids are SQLite's positive 64-bit integers: at most 19 digits.
MAX_ID_DIGITS = 19
RUN_USAGE = (
    "curator run [--consolidate] [--dry-run] [--yes] [--summarize] [--stale-days DAYS]"
    " [--archive-days DAYS]"
)


_BLANKS = re.compile(r"\s+")


def _usage(problem: str, usage: str) -> UsageError:
    return UsageError(f"{problem}; usage: {usage}")


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


@command("memory add", usage=ADD_USAGE, summary="add a note")
def memory_add(ctx: CommandContext, args: list[str]) -> None:
    """Add an active note: the words before ``--`` are its title, the words after it its body."""
    if "--" not in args:
        raise _usage("put -- between the title and the body", ADD_USAGE)
    split = args.index("--")
    title, body = " ".join(args[:split]), " ".join(args[split + 1 :])
    if not title.strip():
        raise _usage("the title is missing", ADD_USAGE)
    if not body.strip():
        raise _usage("the body is missing", ADD_USAGE)
    with _notes(ctx) as store:
        try:
            note = store.add(title, body)
        except ValueError as exc:
            raise _usage(str(exc), ADD_USAGE) from None
    ctx.write(f"added note #{note.id}\n")


@command("memory list", usage=LIST_USAGE, summary="list the notes")
def memory_list(ctx: CommandContext, args: list[str]) -> None:
    """One line per note: id, state, last use, title."""
    if args:
        raise _usage(f"unexpected {args[0]!r}", LIST_USAGE)
    with _notes(ctx) as store:
        notes = store.notes()
    _lines(ctx, format_notes(notes))


@command("memory show", usage=SHOW_USAGE, summary="show a note (and count it as used)")
def memory_show(ctx: CommandContext, args: list[str]) -> None:
    """Print a note in full. Showing a note is a use: it stays active (a stale one is again)."""
    if len(args) != 1:
        raise _usage("give one note id", SHOW_USAGE)
    word = args[0].removeprefix("#")
    # isdigit() alone lets "²" and other digits that int() refuses through,
    # and int() refuses more than 4,300 digits: check both here, at the edge.
    if not (word.isascii() and word.isdigit()):
        raise _usage(f"the note id must be a number, not {args[0]!r:.40}", SHOW_USAGE)
    word = word.lstrip("0") or "0"
    if len(word) > MAX_ID_DIGITS:
        raise _usage(f"the note id has more than {MAX_ID_DIGITS} digits", SHOW_USAGE)
    with _notes(ctx) as store:
        note = store.touch(int(word))
        if note is None:
            raise CommandError(f"there is no note #{word}")
        umbrella = store.get(note.umbrella_id) if note.umbrella_id is not None else None
        merged = store.merged_into(note.id)
    _lines(ctx, format_note(note, umbrella=umbrella, merged=merged))


@command("curator status", usage=STATUS_USAGE, summary="count the active, stale and archived notes")
def curator_status(ctx: CommandContext, args: list[str]) -> None:
    """One line per state: how many notes are in it."""
    if args:
        raise _usage(f"unexpected {args[0]!r}", STATUS_USAGE)
    with _notes(ctx) as store:
        counts = store.counts()
    _lines(ctx, [f"{state}: {counts[state]}" for state in NoteState])


@command(
    "curator run",
    usage=RUN_USAGE,
    summary="mark unused notes stale, archive old stale ones; --consolidate merges related notes",
)
def curator_run(ctx: CommandContext, args: list[str]) -> None:
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
    consolidate = dry_run = yes = summarize = False
    stale_after, archive_after = STALE_AFTER, ARCHIVE_AFTER
    words = iter(args)
    for word in words:
        if word == "--consolidate":
            consolidate = True
        elif word == "--dry-run":
            dry_run = True
        elif word == "--yes":
            yes = True
        elif word == "--summarize":
            summarize = True
        elif word in ("--stale-days", "--archive-days"):
            days = _days(word, next(words, None))
            if word == "--stale-days":
                stale_after = days
            else:
                archive_after = days
        else:
            raise _usage(f"unknown option {word!r}", RUN_USAGE)
    if summarize and not consolidate:
        raise _usage("--summarize needs --consolidate", RUN_USAGE)

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
                dry_run=dry_run,
                summarize=summarize,
                confirm=None if yes else ctx.confirm,
                stale_after=stale_after,
                archive_after=archive_after,
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


def _days(option: str, value: str | None) -> timedelta:
    if value is None:
        raise _usage(f"{option} needs a number of days", RUN_USAGE)
    try:
        days = float(value)
    except ValueError:
        days = math.nan
    if not math.isfinite(days) or not 0 < days <= MAX_DAYS:
        raise _usage(
            f"{option} must be a number of days in (0, {MAX_DAYS}], not {value!r:.40}", RUN_USAGE
        )
    if days < MIN_DAYS:
        # timedelta rounds to microseconds: 1e-300 days would be no time at all.
        raise _usage(
            f"{option} must be at least one second ({MIN_DAYS:.3g} days), not {value!r:.40}",
            RUN_USAGE,
        )
    return timedelta(days=days)


#: The note store's commands, for the console's command set.
MEMORY_COMMANDS = (memory_add, memory_list, memory_show, curator_status, curator_run)
