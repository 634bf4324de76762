"""Notes to seed a temporary data directory with, so the curator has something to merge."""

from __future__ import annotations

from pathlib import Path

__all__ = ["SEED_NOTES", "seed_notes"]

#: Two pairs of related notes and one loner: a consolidation has work to do.
SEED_NOTES = (
    ("Green tea", "Brew green tea at 80 C for two minutes; boiling water makes it bitter."),
    ("Black tea", "Black tea wants water just off the boil and four minutes."),
    ("Bike chain", "Clean the chain with a rag and oil it every 300 km."),
    ("Bike tyres", "Road tyres at 6 bar; check them weekly."),
    ("Passport", "The passport expires in March; renew it before the trip."),
)


def seed_notes(data_dir: Path) -> list[int]:
    """Add ``SEED_NOTES`` to the note store in ``data_dir``; return their ids."""
    from wirecut.memory import NoteStore

    store = NoteStore.in_data_dir(data_dir)
    return [store.add(title, body).id for title, body in SEED_NOTES]
