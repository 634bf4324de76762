"""Which notes may go together: the notes whose titles share a word, the largest groups first.

A consolidation plan may only merge notes that are about one thing
(docs/memory.md, "Which notes go together"). The rule is plain, so that a
person can check it: notes go together when one *content word* (three
letters or more, not a number, not a stop word, compared without a final
"s" or "e") is in all their titles. A title is where a person says what a
note is about; a word that notes only share in their bodies ("every",
"June", "oil") links two topics as often as one, and a loner that shares a
word with one note of a group ("Chain letter" beside "Bike chain") is not
about the group. Two notes that share a title word can still be about two
things ("Orange juice", "Orange jacket"): no word rule can tell, which is
why the model may decline a group and the confirmation shows it.

The groups are offered largest first, so that a topic's notes are offered
together and none is left out. Among groups of one size, a note that could
join either ("Tax receipts" beside "Tax return" and "Receipt printer") goes
first with the group whose word starts more of its titles: a title's first
word most often names its subject ("Tax return", "Bike chain"). The plan's
schema offers only these groups, so no model, however confused, can merge
notes that the rule keeps apart. Pure functions; call from anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from wirecut.memory._notes import Note

__all__ = [
    "UMBRELLA_MAX_NOTES",
    "content_words",
    "related_groups",
    "shared_title_words",
    "subject_words",
    "title_words",
]

#: At most this many notes in one umbrella (a word in more titles makes several groups).
UMBRELLA_MAX_NOTES = 5

_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
_STOP = frozenset(
    """
    about after again all also and any are back been before but can could did does done
    down each few for from get got had has have her here him his how into its just like
    made make many more most much must need new next not now off old once one only other
    our out over own same she should some such than that the their them then there these
    they this those too two under until use very was way were what when where which while
    who why will with would yes yet you your
    """.split()
)


def content_words(text: str) -> list[str]:
    """The content words of ``text`` in order, folded so that plurals match.

    Lower case; three letters or more, not a stop word; a final "s", then a
    final "e", dropped ("tomatoes" and "tomato", "notes" and "note" are the same).
    """
    words = []
    for word in _WORD.findall(text.casefold()):
        if len(word) < 3 or word in _STOP:
            continue
        word = word.removesuffix("s").removesuffix("e")
        if len(word) >= 3:
            words.append(word)
    return words


def subject_words(note: Note) -> frozenset[str]:
    """The content words of ``note``'s title and body."""
    return frozenset(content_words(f"{note.title} {note.body}"))


def title_words(note: Note) -> frozenset[str]:
    """The content words of ``note``'s title: what the note says it is about."""
    return frozenset(content_words(note.title))


def shared_title_words(notes: Sequence[Note]) -> frozenset[str]:
    """The content words that are in the title of every one of ``notes``."""
    if not notes:
        return frozenset()
    return frozenset.intersection(*(title_words(note) for note in notes))


def related_groups(
    notes: Sequence[Note], *, max_size: int = UMBRELLA_MAX_NOTES
) -> list[tuple[int, ...]]:
    """The groups of ``notes`` that may become an umbrella, best first (sorted id tuples).

    For each content word in the titles of two notes or more: the notes
    whose titles hold it (a word in more than ``max_size`` titles makes
    groups of ``max_size`` in id order, and a last smaller one). Larger
    groups first; among groups of one size, the one whose word is the first
    content word of more of its titles; then the one whose notes share the
    most content words (titles and bodies); then the lower ids.
    """
    if max_size < 2:
        raise ValueError(f"max_size must be at least 2, not {max_size}")
    by_word: dict[str, list[int]] = {}
    first: dict[int, str | None] = {}
    for note in sorted(notes, key=lambda n: n.id):
        for word in title_words(note):
            by_word.setdefault(word, []).append(note.id)
        first[note.id] = next(iter(content_words(note.title)), None)
    leads: dict[tuple[int, ...], int] = {}  # group: titles its word starts
    for word, ids in by_word.items():
        for start in range(0, len(ids), max_size):
            chunk = tuple(ids[start : start + max_size])
            if len(chunk) >= 2:
                led = sum(first[i] == word for i in chunk)
                leads[chunk] = max(leads.get(chunk, 0), led)
    words = {note.id: subject_words(note) for note in notes}

    def rank(group: tuple[int, ...]) -> tuple[int, int, int, tuple[int, ...]]:
        shared = frozenset.intersection(*(words[i] for i in group))
        return -len(group), -leads[group], -len(shared), group

    return sorted(leads, key=rank)
