"""The exceptions of the note store and the curator.

The tree::

    Exception
    ├── StoreError              the store cannot be opened, read or written; one line
    │   │                       that names the file and the cause
    │   ├── NoteImportError     a line of a JSONL import is bad: ``line`` and ``field``
    │   │                       say where (nothing of the file was written)
    │   └── ConflictError       notes changed between the read and the write: ``note_ids``
    │                           (nothing was written; read again and retry)
    └── PlanError               ``apply_plan`` got a plan that does not validate:
                                ``problems`` lists why (nothing was written)

    BaseException
    └── wirecut.scope.Interrupted   the bound scope was cancelled: a write in
                                    progress is rolled back, nothing is written

``sqlite3`` errors are translated in one place, ``_store._sqlite_errors``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ConflictError", "NoteImportError", "PlanError", "StoreError"]


class StoreError(Exception):
    """The note store cannot be opened, read or written; the message says which file and why."""


class NoteImportError(StoreError):
    """A line of a JSONL import is bad. ``line`` is 1-based; ``field`` is None for the line itself.

    Raised before anything is written: an import writes every line or none.
    """

    def __init__(self, message: str, *, line: int, field: str | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.field = field


class ConflictError(StoreError):
    """Notes that a write depends on changed since they were read; nothing was written."""

    def __init__(self, message: str, *, note_ids: Sequence[int]) -> None:
        super().__init__(message)
        self.note_ids = tuple(note_ids)


class PlanError(Exception):
    """A consolidation plan does not validate; ``problems`` says why. Nothing was written."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("the plan is invalid: " + "; ".join(problems))
        self.problems = list(problems)
