"""The note store and the curator.

``NoteStore`` keeps notes in one SQLite file in the data directory (WAL
mode, a versioned schema). The curator sweeps it (``sweep``: notes unused for
long become stale, notes stale for long are archived) and consolidates it in
three steps that can run apart: ``make_plan`` (the model chooses among
groups of notes whose titles share a word and titles them, and each
umbrella holds its notes' own text; no store, no transaction),
``validate_plan``, and ``apply_plan`` (one short transaction that first
checks the notes are unchanged since they were read). ``curate``
is a whole run. A cut or a failure at any point leaves the store as it was.

Imports ``wirecut.scope``, ``wirecut.provider`` and ``wirecut.agent``.
See docs/memory.md.
"""

from wirecut.memory._curator import (
    ARCHIVE_AFTER,
    PLAN_MAX_NOTES,
    STALE_AFTER,
    CuratorOutcome,
    CuratorRun,
    SweepPlan,
    apply_plan,
    curate,
    describe_changes,
    describe_run,
    plan_sweep,
    plan_table,
    sweep,
)
from wirecut.memory._errors import ConflictError, NoteImportError, PlanError, StoreError
from wirecut.memory._format import format_note, format_notes, format_time
from wirecut.memory._notes import Note, NoteState, Umbrella, check_body, check_title
from wirecut.memory._plan import (
    MERGE_ALL_MIN_NOTES,
    PLAN_MAX_TOKENS,
    PLAN_MAX_UMBRELLAS,
    WHITESPACE_RUN_CUT,
    Plan,
    PlanRequest,
    make_plan,
    parse_plan,
    plan_request,
    plan_schema,
    validate_plan,
)
from wirecut.memory._related import (
    UMBRELLA_MAX_NOTES,
    related_groups,
    subject_words,
    title_words,
)
from wirecut.memory._store import FILE_NAME, SCHEMA_VERSION, NoteStore
from wirecut.memory._umbrella_text import summary_problems, title_problems, umbrella_body

__all__ = [
    "ARCHIVE_AFTER",
    "FILE_NAME",
    "MERGE_ALL_MIN_NOTES",
    "PLAN_MAX_NOTES",
    "PLAN_MAX_TOKENS",
    "PLAN_MAX_UMBRELLAS",
    "SCHEMA_VERSION",
    "STALE_AFTER",
    "UMBRELLA_MAX_NOTES",
    "WHITESPACE_RUN_CUT",
    "ConflictError",
    "CuratorOutcome",
    "CuratorRun",
    "Note",
    "NoteImportError",
    "NoteState",
    "NoteStore",
    "Plan",
    "PlanError",
    "PlanRequest",
    "StoreError",
    "SweepPlan",
    "Umbrella",
    "apply_plan",
    "check_body",
    "check_title",
    "curate",
    "describe_changes",
    "describe_run",
    "format_note",
    "format_notes",
    "format_time",
    "make_plan",
    "parse_plan",
    "plan_request",
    "plan_schema",
    "plan_sweep",
    "plan_table",
    "related_groups",
    "subject_words",
    "summary_problems",
    "sweep",
    "title_problems",
    "title_words",
    "umbrella_body",
    "validate_plan",
]
