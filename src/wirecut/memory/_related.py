"""Which notes may go together: groups of notes that share a word, best first.

A consolidation plan may only merge notes that have something in common
(docs/memory.md, "What a plan must be"). "In common" is deliberately plain: a
content word (three letters or more, not a number, not a stop word, compared
without a final "s" or "e") in both titles or bodies. The plan's schema offers
only these groups, so no model, however confused, can merge notes that share
nothing; and the prompt lists the notes so that the best disjoint pairs come
first, which is all a tiny model can follow (docs/memory.md, "The model and
the numbers"). Pure functions; call from anywhere.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from wirecut.memory._notes import Note

__all__ = [
    "RELATED_MAX_GROUPS",
    "disjoint_pairs",
    "listing_order",
    "related_groups",
    "subject_words",
]

#: At most this many groups are offered to the model.
RELATED_MAX_GROUPS = 60

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


def subject_words(note: Note) -> frozenset[str]:
    """The content words of ``note``'s title and body, folded so that plurals match."""
    words = set()
    for word in _WORD.findall(f"{note.title} {note.body}".casefold()):
        if len(word) < 3 or word in _STOP:
            continue
        # "tomatoes" and "tomato", "notes" and "note": the same after this.
        word = word.removesuffix("s").removesuffix("e")
        if len(word) >= 3:
            words.add(word)
    return frozenset(words)


def related_groups(notes: Sequence[Note], *, max_size: int = 3) -> list[tuple[int, ...]]:
    """Groups of 2 to ``max_size`` note ids whose notes all share a word; the best first.

    A pair is scored by the words its notes share, a larger group by the
    words all of them share; ties go to the lower ids. At most
    ``RELATED_MAX_GROUPS`` groups.
    """
    words = {note.id: subject_words(note) for note in notes}
    ids = sorted(words)
    scored: list[tuple[int, tuple[int, ...]]] = []
    for size in range(2, max_size + 1):
        for group in itertools.combinations(ids, size):
            shared = frozenset.intersection(*(words[i] for i in group))
            if shared:
                scored.append((-len(shared), group))
    scored.sort()
    return [group for _, group in scored[:RELATED_MAX_GROUPS]]


def disjoint_pairs(groups: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The pairs of ``groups``, taken best first, that share no note with a pair taken before."""
    taken: set[int] = set()
    pairs: list[tuple[int, ...]] = []
    for group in groups:
        if len(group) == 2 and not taken & set(group):
            pairs.append(group)
            taken |= set(group)
    return pairs


def listing_order(notes: Sequence[Note], groups: Sequence[tuple[int, ...]]) -> list[Note]:
    """``notes`` in the order to list them: the best disjoint pairs first, then the rest.

    The rest keep their id order. A small model picks the first numbers it
    is offered; listed this way, those are the likeliest pair.
    """
    by_id = {note.id: note for note in notes}
    placed = [i for pair in disjoint_pairs(groups) for i in pair]
    rest = sorted(set(by_id) - set(placed))
    return [by_id[i] for i in [*placed, *rest]]
