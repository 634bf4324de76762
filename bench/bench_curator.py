"""Benchmark consolidation on the embedded default model: does the curator write only what
the notes say?

Run: ``python bench/bench_curator.py [--stores 20] [--model smollm2] [--summarize]``.
Builds ``--stores`` seeded note stores. Store 0 is the one of issue 37 (three
notes about a sourdough starter, three about a bike, a dentist appointment, a
shopping list); the others hold two to four *topics* of two or three notes
each, a few loners, and *decoys*: loners that share a word with a topic (a
"Chain letter" beside the bike notes, a dinner party whose starter is melon
beside the sourdough starter), shuffled. Then it runs ``curator run
--consolidate --dry-run`` on each (``curate``, the function the console
command calls) against the embedded llama.cpp, started as ``wirecut serve``
starts it. Nothing is written: a dry run only plans and validates.

Prints a Markdown table of what the plans would have written:

- *valid plans*: ``validate_plan`` found nothing wrong (the others are
  refused and write nothing; ``--verbose`` says why);
- over the umbrellas of valid plans: *invented facts* (an umbrella whose text
  holds a number or a proper name that none of its notes holds), *cut
  summaries* (a summary that does not end a sentence), *degenerate titles*
  (a title that repeats a word, is one member's title while the members'
  titles differ, or names no word all its notes hold), *cross-topic* (the
  notes of one umbrella are not all of one topic: two topics, a decoy or a
  loner with them);
- *titles replaced*: umbrellas whose title the model gave was refused and
  replaced by what their notes' titles share (the plan's ``remarks``);
- *members left out*: the notes of a topic that an umbrella grouped, left
  out of it; *topics whole*: topics whose notes are exactly one umbrella;
- *decoys merged*, by kind: a decoy that shares a word with a topic only in
  its body (``body``), in its title with one note of the topic (``one
  title``), or in its title with every note of the topic (``all titles``:
  only a model can tell those apart, a word rule cannot);
- the time per plan (p50/p90, from the request to the validated plan), the
  completion tokens per plan, and the machine's load.

These checks are the bench's own, written apart from ``validate_plan`` so
that they measure it. Asserts nothing; read the table. With ``--verbose`` it
also prints each plan and why an invalid one was refused.

The traffic goes to the loopback llama.cpp only; the model must be in the
per-user cache (``wirecut local --fetch-model`` puts it there).
"""

from __future__ import annotations

import argparse
import inspect
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from _procs import percentile
from wirecut.local import LocalServer
from wirecut.memory import CuratorOutcome, Note, NoteStore, Plan, curate
from wirecut.provider import ChatClient
from wirecut.scope import InterruptScope

Text = tuple[str, str]

#: Notes about one thing each: a consolidation should group each topic whole.
TOPICS: dict[str, list[Text]] = {
    "sourdough": [
        ("Sourdough starter", "Feed it 50 g flour and 50 g water every 12 hours."),
        ("Starter smells of acetone", "Feed the sourdough twice a day and keep it at 24 C."),
        ("Reviving the starter", "After the fridge, discard half and feed it for 2 days."),
    ],
    "bike": [
        ("Bike tyres", "Pump to 60 psi front and 65 psi rear; check every 200 km."),
        ("Bike chain", "Clean and oil the chain every 300 km."),
        ("Bike brakes", "New pads from Cycle Hub before the Alps ride in June."),
    ],
    "lyon": [
        ("Lyon trip", "Train to Lyon at 9:12 on Friday."),
        ("Lyon hotel", "Hotel Bellecour, 2 nights, paid."),
    ],
    "tax": [
        ("Tax return", "File it before May 31."),
        ("Tax receipts", "Keep the receipts in the blue box."),
    ],
    "tomato": [
        ("Tomato seedlings", "Sowed 12 on 3 April, on the window sill."),
        ("Watering tomatoes", "Every evening in July, at the roots."),
        ("Tomato blight", "Take off the lower leaves; spray copper in August."),
    ],
    "running": [
        ("Running plan", "Run 5 km three times a week."),
        ("Running shoes", "Size 43, Asics; buy them before the race."),
    ],
    "mum": [
        ("Mum's birthday", "June 12, she turns 70."),
        ("Gift for Mum", "A scarf from Liberty, or a book."),
    ],
    "coffee": [
        ("Coffee machine", "Descale it every month with citric acid."),
        ("Coffee beans", "Order from Square Mile, 250 g a week."),
    ],
    "python": [
        ("Python course", "Lessons on Monday evenings with Ana."),
        ("Python homework", "Exercises 3 to 7 for next week."),
    ],
    "car": [
        ("Car insurance", "Renewal due in March, with Aviva."),
        ("Car service", "Oil change at 60,000 km."),
    ],
}

#: Loners that share a word with a topic, and how (see the module docstring).
DECOYS: dict[str, list[tuple[str, Text]]] = {
    "sourdough": [("body", ("Dinner party", "Melon as the starter, then the fish."))],
    "bike": [
        ("one title", ("Chain letter", "Forward it to five friends.")),
        ("body", ("Shopping list", "Flour, eggs, milk and chain oil.")),
    ],
    "lyon": [("one title", ("Hotel booking site", "Password in the manager."))],
    "tax": [("one title", ("Receipt printer", "Paper rolls of 57 mm."))],
    "tomato": [("body", ("Plant food", "Feed the basil every week in summer."))],
    "running": [("one title", ("Shoe rack", "Measure the hall first: 80 cm."))],
    "mum": [("one title", ("Birthday cake", "Chocolate, for Sam's party."))],
    "coffee": [("one title", ("Machine wash", "Wool at 30 degrees."))],
    "python": [("body", ("Reptile house", "The python sleeps all day at the zoo."))],
    "car": [("all titles", ("Car boot sale", "Sunday, bring the old lamps."))],
}

#: Notes that belong with no other.
LONERS: list[Text] = [
    ("Guitar chords", "G, C, D, E minor."),
    ("Passport", "Expires in 2031."),
    ("Cat vaccine", "Next shot in October."),
    ("Chess opening", "Learn the Sicilian."),
    ("Paint colour", "Living room: pale green."),
]

#: The store of issue 37: two topics, a loner, and a loner that shares words with both.
ISSUE_STORE: list[tuple[str, Text]] = [
    *(("sourdough", note) for note in TOPICS["sourdough"]),
    *(("bike", note) for note in TOPICS["bike"]),
    ("loner", ("Dentist appointment", "Dr Patel, Tuesday 14 May at 9:30.")),
    ("decoy:body", ("Shopping list", "Flour, eggs, milk and chain oil.")),
]

_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_WORD = re.compile(r"[^\W\d_]+")
_SENTENCE_END = re.compile(r"[.!?…][\"')\]]*$")
_STOP = frozenset(
    "and the for with from that this into over under about after before their them they"
    " are was were has have had its our your his her all any some every".split()
)


@dataclass
class Seeded:
    """A seeded store: which topic (or ``decoy:KIND``, ``loner``) each note id belongs to."""

    kind: dict[int, str] = field(default_factory=dict)

    def topics(self) -> dict[str, set[int]]:
        by_topic: dict[str, set[int]] = {}
        for note_id, kind in self.kind.items():
            if ":" not in kind and kind != "loner":
                by_topic.setdefault(kind, set()).add(note_id)
        return by_topic


def build_store(folder: str, seed: int) -> tuple[NoteStore, Seeded]:
    """Store ``seed``: 0 is issue 37's; others 2-4 topics, their decoys, 1-2 loners."""
    rng = random.Random(seed)
    if seed == 0:
        notes = list(ISSUE_STORE)
    else:
        notes = []
        for topic in rng.sample(sorted(TOPICS), rng.randint(2, 4)):
            notes += [(topic, note) for note in TOPICS[topic]]
            notes += [(f"decoy:{kind}", note) for kind, note in DECOYS[topic]]
        notes += [("loner", note) for note in rng.sample(LONERS, rng.randint(1, 2))]
        rng.shuffle(notes)
    store = NoteStore.in_data_dir(folder)
    seeded = Seeded()
    for kind, (title, body) in notes:
        seeded.kind[store.add(title, body).id] = kind
    return store, seeded


def _words(text: str) -> set[str]:
    """Words of letters, lower case, each also without a final "s" or "es" (plurals match)."""
    words = {w.casefold() for w in _WORD.findall(text) if len(w) >= 3}
    return words | {w.removesuffix("s") for w in words} | {w.removesuffix("es") for w in words}


def invented(text: str, members: Sequence[Note]) -> list[str]:
    """Numbers and proper names in ``text`` that no member holds."""
    source = " ".join(f"{n.title}\n{n.body}" for n in members)
    numbers = set(_NUMBER.findall(source))
    known = {w.casefold() for w in _WORD.findall(source)}
    found = [n for n in _NUMBER.findall(text) if n not in numbers]
    for sentence in re.split(r"(?<=[.!?:;])\s+|\n+", text):
        for word in _WORD.findall(sentence)[1:]:  # the first word of a sentence is capitalised
            if word[0].isupper() and word != "I" and word.casefold() not in known:
                found.append(word)
    return found


def degenerate_title(title: str, members: Sequence[Note]) -> str | None:
    """Why ``title`` is degenerate for ``members``, or None."""
    listed = [w.casefold() for w in _WORD.findall(title)]
    listed = [w for w in listed if len(w) >= 3 and w not in _STOP]
    if len({w.removesuffix("s") for w in listed}) != len(listed):
        return "repeats a word"
    titles = {" ".join(_WORD.findall(n.title.casefold())) for n in members}
    if len(titles) > 1 and " ".join(_WORD.findall(title.casefold())) in titles:
        return "is one member's title"
    shared = set.intersection(*(_words(f"{n.title} {n.body}") for n in members))
    if not _words(" ".join(listed)) & shared:
        return "names nothing all its notes hold"
    return None


@dataclass
class Trial:
    """One store's consolidation."""

    seconds: float
    tokens: int
    valid: bool
    umbrellas: int = 0
    invented: int = 0
    cut: int = 0
    degenerate: int = 0
    cross: int = 0
    retitled: int = 0
    left_out: int = 0
    whole: int = 0
    topics: int = 0
    decoys: dict[str, list[int]] = field(default_factory=dict)  # kind: [merged, all]
    problems: list[str] = field(default_factory=list)
    text: str = ""
    notes: list[str] = field(default_factory=list)
    remarks: list[str] = field(default_factory=list)


def one_trial(client: ChatClient, seed: int, max_tokens: int, summarize: bool) -> Trial:
    extra: dict[str, Any] = {"summarize": True} if summarize else {}
    with tempfile.TemporaryDirectory() as folder:
        store, seeded = build_store(folder, seed)
        notes = {note.id: note for note in store.notes()}
        scope = InterruptScope("bench-curator")
        started = time.monotonic()
        with scope:
            run = curate(
                store,
                client=client,
                consolidate=True,
                dry_run=True,
                max_tokens=max_tokens,
                **extra,
            )
        seconds = time.monotonic() - started
    plan = run.plan or Plan()  # None: no group to ask about, the model was not asked
    trial = Trial(
        seconds=seconds,
        tokens=plan.usage.completion_tokens or 0,  # None: no count (a cut before any token)
        valid=run.outcome is not CuratorOutcome.INVALID_PLAN,
        problems=run.problems,
        text=plan.text,
    )
    topics = seeded.topics()
    trial.topics = len(topics)
    trial.remarks = list(getattr(plan, "remarks", ()))  # none before titles were checked
    trial.retitled = len(trial.remarks) if trial.valid else 0
    groups = [set(u.note_ids) for u in plan.umbrellas] if trial.valid else []
    for umbrella in plan.umbrellas if trial.valid else ():
        members = [notes[i] for i in umbrella.note_ids]
        trial.umbrellas += 1
        facts = invented(umbrella.body, members)
        trial.invented += bool(facts)
        # Before summaries were optional, the body was the summary.
        summary = getattr(umbrella, "summary", umbrella.body)
        cut = bool(summary) and not _SENTENCE_END.search(summary.strip())
        trial.cut += cut
        why = degenerate_title(umbrella.title, members)
        trial.degenerate += why is not None
        kinds = {seeded.kind[i] for i in umbrella.note_ids}
        cross = len(kinds) > 1 or not kinds <= set(topics)
        trial.cross += cross
        flags = [f"invents {facts}"] if facts else []
        flags += ["ends mid-sentence"] * cut + [f"title {why}"] * (why is not None)
        flags += [f"cross-topic {sorted(kinds)}"] * cross
        trial.notes.append(f"{umbrella.title!r} {sorted(umbrella.note_ids)}: {flags or 'fine'}")
    for ids in topics.values():
        touched = [g for g in groups if g & ids]
        if touched:
            trial.left_out += len(ids - max(touched, key=lambda g: len(g & ids)))
        trial.whole += ids in groups
    for note_id, kind in seeded.kind.items():
        if kind.startswith("decoy:"):
            counts = trial.decoys.setdefault(kind.removeprefix("decoy:"), [0, 0])
            counts[0] += any(note_id in g and len(g) > 1 for g in groups)
            counts[1] += 1
    return trial


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f} %" if whole else "n/a"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", type=int, default=20)
    parser.add_argument("--model", default="smollm2", help="smollm2, gemma or PATH.gguf")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads")
    parser.add_argument(
        "--summarize", action="store_true", help="ask for a checked summary over each umbrella"
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    from wirecut.memory import PLAN_MAX_TOKENS

    if args.summarize and "summarize" not in inspect.signature(curate).parameters:
        parser.error("this wirecut's curate() has no summarize option")
    max_tokens = args.max_tokens or PLAN_MAX_TOKENS
    load_before = os.getloadavg()
    trials: list[Trial] = []
    echo = lambda line: print(line, file=sys.stderr)  # noqa: E731
    with LocalServer(args.model, echo=echo, threads=args.threads) as server:
        with ChatClient(server.base_url, model=server.model) as client:
            for seed in range(args.stores):
                trial = one_trial(client, seed, max_tokens, args.summarize)
                trials.append(trial)
                if args.verbose:
                    verdict = "valid" if trial.valid else "refused: " + "; ".join(trial.problems)
                    print(
                        f"store {seed}: {trial.seconds:.1f} s, {trial.tokens} tokens, {verdict}"
                        + "".join(f"\n  {line}" for line in trial.notes)
                        + "".join(f"\n  remark: {r}" for r in trial.remarks)
                        + f"\n  reply: {' '.join(trial.text.split())}",
                        file=sys.stderr,
                    )
        model, threads = server.model, server.threads
    load_after = os.getloadavg()

    seconds = [t.seconds for t in trials]
    tokens = [float(t.tokens) for t in trials]
    valid = [t for t in trials if t.valid]
    umbrellas = sum(t.umbrellas for t in valid)

    def share(attr: str) -> str:
        count = sum(getattr(t, attr) for t in valid)
        return f"{count}/{umbrellas}"

    decoys: dict[str, list[int]] = {}
    for t in valid:
        for kind, (merged, every) in t.decoys.items():
            decoys.setdefault(kind, [0, 0])
            decoys[kind][0] += merged
            decoys[kind][1] += every
    p50, p90 = percentile(seconds, 50), percentile(seconds, 90)
    mode = "with --summarize" if args.summarize else "default"
    print(f"consolidation on the embedded {model}, {len(trials)} seeded stores ({mode})\n")
    print(
        "| valid plans | umbrellas | invented facts | cut summaries | degenerate titles"
        " | cross-topic | titles replaced | members left out | topics whole | decoys merged"
        " | s/plan p50 | p90 | tokens/plan p50 | max |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {len(valid)}/{len(trials)} ({_pct(len(valid), len(trials))}) | {umbrellas}"
        f" | {share('invented')} | {share('cut')} | {share('degenerate')} | {share('cross')}"
        f" | {share('retitled')}"
        f" | {sum(t.left_out for t in valid)}"
        f" | {sum(t.whole for t in valid)}/{sum(t.topics for t in valid)}"
        f" | {', '.join(f'{k} {m}/{n}' for k, (m, n) in sorted(decoys.items()))}"
        f" | {p50:.1f} | {p90:.1f} | {statistics.median(tokens):.0f} | {max(tokens):.0f} |"
    )
    print(
        f"\nload average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
        f"max_tokens {max_tokens}; llama.cpp threads {threads}"
    )


if __name__ == "__main__":
    main()
