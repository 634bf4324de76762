"""The curator: the sweep, and a whole curator run in three steps that can be split.

A run reads the notes once (the *snapshot*), works out the sweep
(``plan_sweep``: notes unused for long become stale, notes stale for long
are archived) and, with ``consolidate``, asks the model for a plan of
umbrella notes (``make_plan``) with no transaction open. ``validate_plan``
checks the plan; ``apply_plan`` then writes the sweep and the plan in one
short transaction that first checks that every note it changes is still as
in the snapshot. A cut or a failure anywhere leaves the store as it was.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta

import wirecut.scope as ws
from wirecut.memory._errors import PlanError
from wirecut.memory._notes import Note, NoteState
from wirecut.memory._plan import PLAN_MAX_TOKENS, Plan, make_plan, validate_plan
from wirecut.memory._related import related_groups
from wirecut.memory._store import NoteStore
from wirecut.provider import Chat, Usage

__all__ = [
    "ARCHIVE_AFTER",
    "PLAN_MAX_NOTES",
    "STALE_AFTER",
    "CuratorOutcome",
    "CuratorRun",
    "SweepPlan",
    "apply_plan",
    "curate",
    "describe_changes",
    "describe_run",
    "plan_sweep",
    "plan_table",
    "sweep",
]

#: An active note unused for this long becomes stale.
STALE_AFTER = timedelta(days=30)
#: A note stale for this long is archived.
ARCHIVE_AFTER = timedelta(days=60)
#: At most this many notes go into the plan's prompt.
PLAN_MAX_NOTES = 20


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep changes: notes to mark stale and stale notes to archive (ids)."""

    stale: tuple[int, ...] = ()
    archive: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.stale or self.archive)

    def apply_to(self, notes: Sequence[Note]) -> list[Note]:
        """``notes`` as they will be after the sweep (states only; nothing is written)."""
        stale, archive = set(self.stale), set(self.archive)
        return [
            replace(note, state=NoteState.STALE)
            if note.id in stale
            else replace(note, state=NoteState.ARCHIVED)
            if note.id in archive
            else note
            for note in notes
        ]


def plan_sweep(
    notes: Sequence[Note],
    *,
    now: float,
    stale_after: timedelta = STALE_AFTER,
    archive_after: timedelta = ARCHIVE_AFTER,
) -> SweepPlan:
    """The sweep over ``notes`` at ``now`` (Unix seconds). Pure; call from anywhere.

    An active note whose last use is at least ``stale_after`` ago becomes
    stale; a note stale for at least ``archive_after`` (since its state
    changed) is archived. A note goes one step per sweep.
    """
    for name, value in (("stale_after", stale_after), ("archive_after", archive_after)):
        if value <= timedelta(0):
            raise ValueError(f"{name} must be a positive duration, not {value}")
    stale_s, archive_s = stale_after.total_seconds(), archive_after.total_seconds()
    return SweepPlan(
        stale=tuple(
            n.id for n in notes if n.state is NoteState.ACTIVE and now - n.last_used_at >= stale_s
        ),
        archive=tuple(
            n.id
            for n in notes
            if n.state is NoteState.STALE and now - n.state_changed_at >= archive_s
        ),
    )


def sweep(
    store: NoteStore,
    *,
    now: float | None = None,
    stale_after: timedelta = STALE_AFTER,
    archive_after: timedelta = ARCHIVE_AFTER,
    dry_run: bool = False,
) -> SweepPlan:
    """Sweep the store (see ``plan_sweep``) in one transaction; return what changed.

    With ``dry_run`` nothing is written. Raises ``ConflictError`` (nothing
    written) if a note it changes was used or changed between its read and
    its write; run it again.
    """
    at = time.time() if now is None else now
    snapshot = store.notes()
    plan = plan_sweep(snapshot, now=at, stale_after=stale_after, archive_after=archive_after)
    if plan and not dry_run:
        apply_plan(store, Plan(), snapshot, sweep=plan, now=at)
    return plan


def apply_plan(
    store: NoteStore,
    plan: Plan,
    snapshot: Sequence[Note],
    *,
    sweep: SweepPlan | None = None,
    now: float | None = None,
) -> list[Note]:
    """Write ``plan`` (and ``sweep``) in one short transaction; return the umbrella notes created.

    ``snapshot`` is the notes as read before the plan was made. The plan is
    validated against them first (``PlanError`` if invalid); then, inside
    the transaction, every note the write changes must still be exactly as
    in the snapshot, else ``ConflictError``. Either error writes nothing.

    Cancellation: the transaction checks the bound scope before it commits;
    a cancel up to then rolls it back and raises ``Interrupted``.
    """
    sweep = sweep or SweepPlan()
    problems = validate_plan(plan, sweep.apply_to(snapshot))
    if problems:
        raise PlanError(problems)
    by_id = {note.id: note for note in snapshot}
    changed = [*sweep.stale, *sweep.archive, *(i for u in plan.umbrellas for i in u.note_ids)]
    missing = sorted({i for i in changed if i not in by_id})
    if missing:
        raise PlanError([f"note #{i} is not in the snapshot" for i in missing])
    return store.apply_changes(
        [by_id[i] for i in dict.fromkeys(changed)],
        stale=sweep.stale,
        archive=sweep.archive,
        umbrellas=plan.umbrellas,
        now=now,
    )


class CuratorOutcome(enum.StrEnum):
    """How a ``curate`` run ended."""

    APPLIED = "applied"  # the sweep and the plan were written, in one transaction
    NOTHING_TO_DO = "nothing_to_do"  # no note to sweep and no umbrella planned: nothing written
    DRY_RUN = "dry_run"  # asked not to write: the changes were worked out, nothing written
    DECLINED = "declined"  # the confirmation was refused: nothing written
    INVALID_PLAN = "invalid_plan"  # the model's plan is invalid (see ``problems``): nothing written


@dataclass
class CuratorRun:
    """What a curator run found and did.

    ``notes`` is the snapshot it read; ``plan`` is None when it did not
    consolidate (``skipped`` says why, if it was asked to); ``umbrellas``
    are the notes it created.
    """

    outcome: CuratorOutcome
    notes: list[Note]
    sweep: SweepPlan
    plan: Plan | None = None
    problems: list[str] = field(default_factory=list)
    skipped: str | None = None
    umbrellas: list[Note] = field(default_factory=list)

    def changes(self) -> list[str]:
        """The changes of the run (planned, or made if applied), one line each."""
        return describe_changes(self.notes, self.sweep, self.plan)


def describe_changes(notes: Sequence[Note], sweep: SweepPlan, plan: Plan | None) -> list[str]:
    """What writing ``sweep`` and ``plan`` changes, one line each, for people."""
    by_id = {note.id: note for note in notes}

    def name(note_id: int) -> str:
        note = by_id.get(note_id)
        return f"#{note_id} {note.title!r}" if note is not None else f"#{note_id}"

    lines = []
    if sweep.stale:
        lines.append("mark stale (unused for long): " + ", ".join(map(name, sweep.stale)))
    if sweep.archive:
        lines.append("archive (stale for long): " + ", ".join(map(name, sweep.archive)))
    for umbrella in plan.umbrellas if plan is not None else ():
        merged = ", ".join(map(name, umbrella.note_ids))
        lines.append(f"merge {merged} into a new note {umbrella.title!r}")
    return lines


#: The widest a column of ``plan_table`` gets (longer text is cut with "…").
TABLE_TITLE_CHARS = 28
TABLE_SUMMARY_CHARS = 44


def plan_table(notes: Sequence[Note], plan: Plan) -> list[str]:
    """The plan as a short plain-text table for people, one line each.

    A row per umbrella: its title (and, if the plan has summaries, the first
    line of its summary) and the first note it archives, named as
    everywhere by ``#id`` and title; then a line per further note it
    archives. Long text is cut with "…" so the table stays narrow.
    """
    if not plan.umbrellas:
        return []
    by_id = {note.id: note for note in notes}
    summaries = any(umbrella.summary is not None for umbrella in plan.umbrellas)

    def name(note_id: int) -> str:
        note = by_id.get(note_id)
        return f"#{note_id} {_cut(note.title, TABLE_TITLE_CHARS)}" if note else f"#{note_id}"

    rows = [
        (
            _cut(umbrella.title, TABLE_TITLE_CHARS),
            _cut((umbrella.summary or "").strip().split("\n")[0], TABLE_SUMMARY_CHARS),
            [name(note_id) for note_id in umbrella.note_ids],
        )
        for umbrella in plan.umbrellas
    ]
    title_w = max(len("new note"), *(len(title) for title, _, _ in rows))
    summary_w = max(len("summary"), *(len(summary) for _, summary, _ in rows))

    def line(title: str, summary: str, archived: str) -> str:
        middle = f"{summary:<{summary_w}}  " if summaries else ""
        return f"{title:<{title_w}}  {middle}{archived}".rstrip()

    lines = [line("new note", "summary", "archives")]
    for title, summary, archived in rows:
        first, *rest = archived or [""]
        lines.append(line(title, summary, first))
        lines += [line("", "", more) for more in rest]
    return lines


def describe_run(run: CuratorRun) -> str:
    """What a run will write, for the confirmation: the sweep's lines, then the plan's table."""
    lines = ["curator run will:"]
    lines += [f"  {line}" for line in describe_changes(run.notes, run.sweep, None)]
    if run.plan is not None and run.plan.umbrellas:
        count = len(run.plan.umbrellas)
        summary = any(umbrella.summary is not None for umbrella in run.plan.umbrellas)
        lines.append(
            f"  create {count} umbrella note{'' if count == 1 else 's'} holding "
            f"{'a summary and ' if summary else ''}the text of the notes it archives:"
        )
        lines += [f"    {line}" for line in plan_table(run.notes, run.plan)]
    return "\n".join(lines)


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


def curate(
    store: NoteStore,
    *,
    client: Chat | None = None,
    consolidate: bool = False,
    dry_run: bool = False,
    summarize: bool = False,
    confirm: Callable[[str], bool] | None = None,
    now: float | None = None,
    stale_after: timedelta = STALE_AFTER,
    archive_after: timedelta = ARCHIVE_AFTER,
    model: str | None = None,
    max_tokens: int = PLAN_MAX_TOKENS,
    max_notes: int = PLAN_MAX_NOTES,
    on_token: Callable[[str], None] | None = None,
    on_usage: Callable[[Usage], None] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> CuratorRun:
    """One curator run: sweep, and with ``consolidate`` merge related notes into umbrellas.

    Runs in the calling thread, under the scope bound there. Reads the
    notes once; plans the sweep; with ``consolidate`` and at least two
    active notes left after the sweep, two of whose titles share a word,
    asks the model (``client``) for a plan over the ``max_notes`` most
    recently used of them (``make_plan``; with ``summarize`` each umbrella
    gets a checked summary above its notes' text; ``on_token`` gets the
    reply as it streams, ``on_usage`` what the provider produced,
    ``on_progress`` a line before the model is asked and the plan's
    ``remarks`` after).
    An invalid plan ends the run with nothing written. Otherwise, unless
    ``dry_run``, it asks ``confirm`` (if given) with a description of the
    changes (``describe_run``: the sweep, and the plan as a table), and
    writes them in one transaction (``apply_plan``).

    Raises ``ConflictError`` if a note changed while the model worked
    (nothing written) and ``StoreError`` if the store fails.

    Cancellation: a cancel while the model works cuts its request and
    raises ``Interrupted`` once ``on_usage`` got what was produced; a cancel
    during ``confirm`` is ``confirm``'s to raise; a cancel before the commit
    rolls the transaction back. In every case nothing is written.
    """
    at = time.time() if now is None else now
    snapshot = store.notes()
    swept = plan_sweep(snapshot, now=at, stale_after=stale_after, archive_after=archive_after)
    run = CuratorRun(CuratorOutcome.NOTHING_TO_DO, snapshot, swept)
    if consolidate:
        after_sweep = swept.apply_to(snapshot)
        active = [note for note in after_sweep if note.state is NoteState.ACTIVE]
        # The prompt must fit a small model's context (4096 tokens a slot for
        # the local one): the most recently used notes first.
        recent = sorted(active, key=lambda note: note.last_used_at, reverse=True)[:max_notes]
        candidates = sorted(recent, key=lambda note: note.id)
        if len(candidates) < 2:
            run.skipped = (
                f"consolidation needs at least two active notes; there are {len(candidates)}"
            )
        elif not related_groups(candidates):
            # The schema could offer the model no group: do not ask it.
            run.skipped = "no two active notes share a word in their titles: nothing to consolidate"
        else:
            if client is None:
                raise ValueError("consolidate needs a client")
            if on_progress is not None:
                on_progress(f"asking the model for a plan over {len(candidates)} active notes")
            plan = make_plan(
                client,
                candidates,
                summarize=summarize,
                model=model,
                max_tokens=max_tokens,
                on_token=on_token,
            )
            if on_usage is not None:
                on_usage(plan.usage)
            ws.check()  # a cut conversation is the end of the run, not an invalid plan
            if on_progress is not None:
                for remark in plan.remarks:
                    on_progress(remark)
            run.plan = plan
            run.problems = validate_plan(plan, after_sweep)
            if run.problems:
                run.outcome = CuratorOutcome.INVALID_PLAN
                return run
    if not swept and not (run.plan and run.plan.umbrellas):
        return run
    if dry_run:
        run.outcome = CuratorOutcome.DRY_RUN
        return run
    if confirm is not None:
        if not confirm(describe_run(run)):
            run.outcome = CuratorOutcome.DECLINED
            return run
    run.umbrellas = apply_plan(store, run.plan or Plan(), snapshot, sweep=swept, now=at)
    run.outcome = CuratorOutcome.APPLIED
    return run
