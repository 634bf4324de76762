"""What a benchmark reports: Markdown tables, printed and written as JSON for docs/benchmarks.md.

A benchmark builds a ``Report`` (its name, the command that ran it, the
machine it ran on), adds its tables, prints them, and with ``--out DIR``
writes ``DIR/NAME.json``. ``scripts/benchmarks.py`` renders every such file
under ``docs/bench/`` into ``docs/benchmarks.md``, each section headed with
the machine, CPU count, Python, commit and date, so that no number in the
docs is typed by hand.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _procs import machine

__all__ = ["Report", "Table", "cell"]


def cell(value: Any, unit: str = "", digits: int = 2) -> str:
    """A table cell: a number with its unit, "never" for None, text as it is."""
    if value is None:
        return "never"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}{(' ' + unit) if unit else ''}"
    if isinstance(value, int):
        return f"{value}{(' ' + unit) if unit else ''}"
    return str(value)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str | None = None

    def add(self, *cells: Any) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([c if isinstance(c, str) else cell(c) for c in cells])

    def markdown(self) -> str:
        lines = [
            "| " + " | ".join(self.columns) + " |",
            "|" + "---|" * len(self.columns),
            *("| " + " | ".join(row) + " |" for row in self.rows),
        ]
        return "\n".join(lines)


@dataclass
class Report:
    """One benchmark run's tables; ``name`` is the file it is written to (``NAME.json``)."""

    name: str
    title: str
    about: str
    command: str = field(default_factory=lambda: "python " + " ".join(sys.argv))
    machine: dict[str, Any] = field(default_factory=machine)
    tables: list[Table] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def table(self, title: str, columns: list[str], note: str | None = None) -> Table:
        made = Table(title, columns, note=note)
        self.tables.append(made)
        return made

    def print(self) -> None:
        for table in self.tables:
            print(f"\n{table.title}\n")
            print(table.markdown())
            if table.note:
                print(f"\n{table.note}")

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.name}.json"
        path.write_text(
            json.dumps(
                {
                    "name": self.name,
                    "title": self.title,
                    "about": self.about,
                    "command": self.command,
                    "machine": self.machine,
                    "tables": [
                        {
                            "title": t.title,
                            "columns": t.columns,
                            "rows": t.rows,
                            "note": t.note,
                        }
                        for t in self.tables
                    ],
                    "data": self.data,
                },
                indent=1,
            )
            + "\n"
        )
        return path
