"""What an umbrella note may say: a title that names its notes, and their own text.

An umbrella's body is *extractive* (``umbrella_body``): the title and body
of each note it merges, verbatim, in the plan's order; so it says exactly
what the notes say. The model only chooses the group and a short title, and
a title is refused (``title_problems``) when it repeats a word
("Sourdough Sourdough"), is one member's title while the group holds more
("Bike tyres" over the tyres, the chain and the brakes), or names no word
that all the notes hold.

A generative summary is written only on request, above the notes' text, and
is checked (``summary_problems``): it must end a sentence (a reply cut at
the schema's length ends mid-word), and every number and proper name in it
must be in the notes. A model that writes "Halfords" or "80 psi" where the
notes say "Cycle Hub" and "60 psi" has its plan refused. Spelled-out numbers
and a name that starts a sentence are not caught: a word that starts a
sentence is capitalised whether it is a name or not (docs/memory.md). Pure
functions; call from anywhere.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence

from wirecut.memory._notes import Note, check_body, check_title
from wirecut.memory._related import (
    content_words,
    shared_title_words,
    subject_words,
)

__all__ = [
    "PLACEHOLDERS",
    "normal",
    "shared_title",
    "summary_problems",
    "title_problems",
    "umbrella_body",
]

#: What a lazy or confused model writes instead of a title or a summary.
PLACEHOLDERS = frozenset(
    {
        "a short title",
        "example",
        "fixme",
        "n a",
        "na",
        "none",
        "note",
        "notes",
        "null",
        "placeholder",
        "short title",
        "string",
        "summary",
        "summary here",
        "tba",
        "tbd",
        "text",
        "title",
        "title here",
        "todo",
        "umbrella",
        "umbrella title",
        "untitled",
        "xxx",
    }
)

#: A number as written: "60", "9:12", "60,000", "2.5", "14/05".
_NUMBER = re.compile(r"\d+(?:[.,:/]\d+)*")
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
#: What may close a sentence after its full stop: quotes (straight or curly) and brackets.
_CLOSERS = "\"')]\u201d\u2019"
#: The end of a sentence, perhaps inside quotes or brackets.
_SENTENCE_END = re.compile(f"[.!?\u2026][{re.escape(_CLOSERS)}]*$")
_SENTENCE_BREAK = re.compile(f"(?<=[.!?\u2026])[{re.escape(_CLOSERS)}]*\\s+")


def umbrella_body(members: Sequence[Note], summary: str | None = None) -> str:
    """The body of an umbrella over ``members``: each note's title and body, verbatim.

    In ``members``' order, a blank line between two notes; a note's trailing
    whitespace is dropped. With ``summary``, it comes first, then a blank line.
    """
    parts = [f"{note.title}\n{note.body.rstrip()}".rstrip() for note in members]
    if summary is not None:
        parts.insert(0, summary.strip())
    return "\n\n".join(parts)


def normal(text: str) -> str:
    """``text`` in lower case, its punctuation dropped and its spaces collapsed."""
    return " ".join(re.sub(r"[^\w\s]|_", " ", text.casefold()).split())


def _unfit(what: str, text: str, check: Callable[[str], object]) -> str | None:
    """Why ``text`` is no title or summary at all, or None.

    ``check`` is the store's own check of such a field (``check_title`` or
    ``check_body``, a ``ValueError`` saying why); past it, no words or a
    placeholder is unfit too.
    """
    try:
        check(text)
    except ValueError as exc:
        return f"the {what} {exc}"
    if not any(char.isalnum() for char in text):
        shown = f" ({text.strip()!r})" if text.strip() else ""
        return f"the {what} has no words{shown}"
    if {normal(text), normal(text).replace(" ", "")} & PLACEHOLDERS:
        return f"the {what} is a placeholder ({text.strip()!r})"
    return None


def title_problems(title: str, members: Sequence[Note], others: Sequence[Note] = ()) -> list[str]:
    """Why ``title`` does not fit an umbrella over ``members``; empty if it does.

    A title must be a fit one-line title with words, not a placeholder; must
    not repeat a content word; must not be the title of one member when that
    title names more than all the members' titles share ("Bike tyres" over
    the bike's tyres, chain and brakes; "Lyon" over "Lyon" and "Lyon hotel"
    is fine); must hold a content word that every member holds (in its
    title or body); and must not be the title of one of ``others``, the
    notes it does not merge ("Bike tyres" over the chain and the brakes,
    the tyres left out).
    """
    unfit = _unfit("title", title, check_title)
    if unfit is not None:
        return [unfit]
    problems = []
    words = content_words(title)
    counts = Counter(words)
    repeated = [word for word in dict.fromkeys(words) if counts[word] > 1]
    if repeated:
        shown = ", ".join(repr(_spelled(title, word)) for word in repeated)
        problems.append(f"the title repeats {shown}")
    if members and not set(words) <= shared_title_words(members):
        for note in members:
            if _title_key(title) == _title_key(note.title):
                problems.append(
                    f"the title is the title of note #{note.id} alone, not of all {len(members)}"
                )
                break
    shared = frozenset.intersection(*(subject_words(n) for n in members)) if members else None
    if shared and not set(words) & shared:  # notes that share nothing are refused as such
        problems.append("the title names no word that all its notes hold")
    named = next((note for note in others if _title_key(title) == _title_key(note.title)), None)
    if named is not None:
        problems.append(f"the title is the title of note #{named.id}, which it does not merge")
    return problems


def shared_title(members: Sequence[Note]) -> str | None:
    """A title made of what all ``members``' titles share, or None if that is no fit title.

    The shared title words in the order and spelling of the first member's
    title, the first letter in upper case: "Bike" for "Bike tyres", "Bike
    chain" and "Bike brakes"; "Book club" for "Book club" and "Book club
    list". It passes ``title_problems`` or it is None (a placeholder such as
    "Note", or words that make no title).
    """
    shared = shared_title_words(members)
    if not members or not shared:
        return None
    kept: dict[str, str] = {}  # folded: as spelled
    for word in _WORD.findall(members[0].title):
        folded = content_words(word)
        if folded and folded[0] in shared:
            kept.setdefault(folded[0], word)
    title = " ".join(kept.values())
    title = title[:1].upper() + title[1:]
    return title if not title_problems(title, members) else None


def summary_problems(summary: str, title: str, members: Sequence[Note]) -> list[str]:
    """Why ``summary`` cannot stand above ``members``' text under ``title``; empty if it can.

    A summary must have words, not be a placeholder or only its title, end
    a sentence, and hold no number or proper name that no member holds.
    """
    unfit = _unfit("summary", summary, check_body)
    if unfit is not None:
        return [unfit]
    if normal(summary) == normal(title):
        return ["the summary only repeats the title"]
    problems = []
    text = summary.strip()
    if not _SENTENCE_END.search(text):
        tail = "…" + " ".join(text.split()[-4:])
        problems.append(f"the summary ends mid-sentence ({tail!r})")
    source = "\n".join(f"{note.title}\n{note.body}" for note in members)
    numbers = set(_NUMBER.findall(source))
    invented = [number for number in _NUMBER.findall(text) if number not in numbers]
    known = {word.casefold() for word in _WORD.findall(source)}
    for sentence in _SENTENCE_BREAK.split(text):
        for k, word in enumerate(_WORD.findall(sentence)):
            # A capital that starts a sentence says nothing; "I" is no name.
            name = (word[0].isupper() and k > 0 and word != "I") or (
                len(word) > 1 and word.isupper()
            )
            if name and word.casefold() not in known:
                invented.append(word)
    for fact in dict.fromkeys(invented):
        problems.append(f"the summary says {fact!r}, which none of its notes says")
    return problems


def _title_key(title: str) -> frozenset[str]:
    """What two titles must share to be one title: content words and numbers, any case or order.

    "The Receipt Printer" is "Receipt printer"; "Trips, part 12" is not "Trips, part 3".
    """
    return frozenset(content_words(title)) | frozenset(_NUMBER.findall(title))


def _spelled(text: str, folded: str) -> str:
    """The first word of ``text`` that folds to ``folded``, as ``text`` spells it."""
    words: list[str] = _WORD.findall(text)
    return next((word for word in words if content_words(word) == [folded]), folded)
