"""Benchmark consolidation on the embedded default model: how often is the plan usable?

Run: ``python bench/bench_curator.py [--stores 20] [--model smollm2] [--decoys 1]``.
Builds ``--stores`` seeded note stores of 6 to 10 notes, each from two to four
pairs of related notes (a trip and its train, a recipe and its starter ...)
and a few loners, plus ``--decoys`` pairs of notes that share a word and
nothing else (orange juice, an orange jacket), in a shuffled order, then runs
``curator run --consolidate --dry-run`` on each (``curate``, the function the
console command calls) against the embedded llama.cpp, started as ``wirecut
serve`` starts it. Nothing is written: a dry run only plans and validates.

Prints a Markdown table: the share of valid plans (``validate_plan`` found
nothing wrong), the share of their umbrellas that group notes of one seeded
pair only ("right"), the share of seeded pairs found, the decoy pairs the
model kept apart (the word rule offers them together: only the model can
decline them), the time per plan
(p50/p90, from the request to the validated plan), the completion tokens per
plan, and the machine's load. Asserts nothing: the targets (valid >= 80 %,
right >= 60 %, p50 <= 20 s on a 2-core machine) are checked by reading it.
With ``--verbose`` it also prints each plan and why an invalid one was refused.

The traffic goes to the loopback llama.cpp only; the model must be in the
per-user cache (``wirecut local --fetch-model`` puts it there).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

from _procs import percentile
from wirecut.local import LocalServer
from wirecut.memory import CuratorOutcome, NoteStore, Plan, curate
from wirecut.provider import ChatClient
from wirecut.scope import InterruptScope

#: Pairs of notes about one subject: a consolidation should group each pair.
PAIRS = [
    (("Lyon trip", "Train to Lyon at 9:12 on Friday"), ("Lyon hotel", "Hotel Bellecour, 2 nights")),
    (("Bread recipe", "Flour, water, salt"), ("Sourdough starter", "Feed the bread starter")),
    (("Dentist appointment", "Tuesday 14:30, Dr Martin"), ("Dentist bill", "85 euros, paid")),
    (("Car insurance", "Renewal due in March"), ("Car service", "Oil change at 60,000 km")),
    (("Mum's birthday", "June 12, she turns 70"), ("Gift for Mum", "A scarf or a book")),
    (("Python course", "Lessons on Monday evenings"), ("Python homework", "Exercises 3 to 7")),
    (("Tomato plants", "Planted six in May"), ("Watering tomatoes", "Every evening in July")),
    (("Wifi password", "kitchen-42-blue"), ("Wifi router", "Restart it if wifi drops")),
    (("Tax return", "File before May 31"), ("Tax receipts", "Keep the tax receipts in a box")),
    (("Running plan", "Run 5 km three times a week"), ("Running shoes", "Size 43, buy new ones")),
    (("Book club", "Meets first Thursday"), ("Book club list", "Next book: Dune")),
    (("Flat rent", "950 a month, due on the 1st"), ("Landlord", "Mr Roy, for the flat")),
]
#: Pairs that share a word and nothing else: a consolidation should leave them apart.
DECOYS = [
    (("Orange juice", "A litre for breakfast"), ("Orange jacket", "Pick it up from the tailor")),
    (("Apple pie", "Grandma's, with cinnamon"), ("Apple laptop", "Battery swap booked")),
    (("Match tickets", "Football on Saturday, row F"), ("Matches", "Light the stove with them")),
    (("Spring cleaning", "Wash the windows"), ("Mattress spring", "One broke, call the shop")),
]
#: Notes that belong with no other.
LONERS = [
    ("Guitar chords", "G, C, D, E minor"),
    ("Passport", "Expires in 2031"),
    ("Cat vaccine", "Next shot in October"),
    ("Chess opening", "Learn the Sicilian"),
    ("Bank card PIN", "Not written here"),
    ("Paint colour", "Living room: pale green"),
]


@dataclass
class Trial:
    """One store's consolidation."""

    seconds: float
    tokens: int
    valid: bool
    umbrellas: int
    right: int
    pairs: int
    found: int
    decoys: int
    declined: int
    problems: list[str]
    text: str


def build_store(
    folder: str, seed: int, decoys: int = 0
) -> tuple[NoteStore, list[tuple[int, int]], list[tuple[int, int]]]:
    """A store from ``seed`` (6 to 10 notes, and ``decoys`` decoy pairs); its pairs and decoys."""
    rng = random.Random(seed)
    n_pairs = rng.randint(2, 4)
    n_loners = rng.randint({2: 2, 3: 1, 4: 1}[n_pairs], {2: 3, 3: 3, 4: 2}[n_pairs])
    notes: list[tuple[int, tuple[str, str]]] = []
    for group, pair in enumerate(rng.sample(PAIRS, n_pairs)):
        notes += [(group, pair[0]), (group, pair[1])]
    notes += [(-1 - i, loner) for i, loner in enumerate(rng.sample(LONERS, n_loners))]
    # Their own generator: the pairs and loners of a seed are the same with or without.
    for k, decoy in enumerate(random.Random(-1 - seed).sample(DECOYS, decoys)):
        notes += [(100 + k, decoy[0]), (100 + k, decoy[1])]
    rng.shuffle(notes)
    store = NoteStore.in_data_dir(folder)
    members: dict[int, list[int]] = {}
    for group, (title, body) in notes:
        members.setdefault(group, []).append(store.add(title, body).id)
    pairs = [(ids[0], ids[1]) for group, ids in members.items() if 0 <= group < 100]
    decoy_pairs = [(ids[0], ids[1]) for group, ids in members.items() if group >= 100]
    return store, pairs, decoy_pairs


def one_trial(client: ChatClient, seed: int, max_tokens: int, decoys: int = 0) -> Trial:
    with tempfile.TemporaryDirectory() as folder:
        store, pairs, decoy_pairs = build_store(folder, seed, decoys)
        scope = InterruptScope("bench-curator")
        started = time.monotonic()
        with scope:
            run = curate(
                store, client=client, consolidate=True, dry_run=True, max_tokens=max_tokens
            )
        seconds = time.monotonic() - started
    plan = run.plan or Plan()  # None: no two notes shared a word, the model was not asked
    valid = run.outcome is not CuratorOutcome.INVALID_PLAN
    pair_sets = [set(pair) for pair in pairs]
    groups = [set(u.note_ids) for u in plan.umbrellas] if valid else []
    right = sum(1 for group in groups if any(group <= pair for pair in pair_sets))
    found = sum(1 for pair in pair_sets if pair in groups)
    merged = sum(1 for a, b in decoy_pairs if any({a, b} <= group for group in groups))
    return Trial(
        seconds=seconds,
        tokens=plan.usage.completion_tokens or 0,  # None: no count (a cut before any token)
        valid=valid,
        umbrellas=len(groups),
        right=right,
        pairs=len(pairs),
        found=found,
        decoys=len(decoy_pairs),
        declined=len(decoy_pairs) - merged if valid else 0,
        problems=run.problems,
        text=plan.text,
    )


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f} %" if whole else "n/a"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", type=int, default=20)
    parser.add_argument("--model", default="smollm2", help="smollm2, gemma or PATH.gguf")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads")
    parser.add_argument(
        "--decoys", type=int, default=1, choices=range(len(DECOYS) + 1), help="per store"
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    from wirecut.memory import PLAN_MAX_TOKENS

    max_tokens = args.max_tokens or PLAN_MAX_TOKENS
    load_before = os.getloadavg()
    trials: list[Trial] = []
    echo = lambda line: print(line, file=sys.stderr)  # noqa: E731
    with LocalServer(args.model, echo=echo, threads=args.threads) as server:
        with ChatClient(server.base_url, model=server.model) as client:
            for seed in range(args.stores):
                trial = one_trial(client, seed, max_tokens, args.decoys)
                trials.append(trial)
                if args.verbose:
                    verdict = "valid" if trial.valid else "; ".join(trial.problems)
                    print(
                        f"store {seed}: {trial.seconds:.1f} s, {trial.tokens} tokens, "
                        f"{trial.right}/{trial.umbrellas} right, {trial.found}/{trial.pairs} "
                        f"pairs, {trial.declined}/{trial.decoys} decoys kept apart: {verdict}"
                        f"\n  {' '.join(trial.text.split())}",
                        file=sys.stderr,
                    )
        model, threads = server.model, server.threads
    load_after = os.getloadavg()

    seconds = [t.seconds for t in trials]
    tokens = [float(t.tokens) for t in trials]
    valid = [t for t in trials if t.valid]
    umbrellas = sum(t.umbrellas for t in valid)
    right = sum(t.right for t in valid)
    p50, p90 = percentile(seconds, 50), percentile(seconds, 90)
    print(
        f"consolidation on the embedded {model}, {len(trials)} seeded stores of 6-10 notes"
        f" and {args.decoys} decoy pair{'s' if args.decoys != 1 else ''} each\n"
    )
    print(
        "| valid plans | umbrellas right | pairs found | decoys kept apart | empty plans |"
        " s/plan p50 | p90 | tokens/plan p50 | max |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {len(valid)}/{len(trials)} ({_pct(len(valid), len(trials))})"
        f" | {right}/{umbrellas} ({_pct(right, umbrellas)})"
        f" | {sum(t.found for t in trials)}/{sum(t.pairs for t in trials)}"
        f" | {sum(t.declined for t in trials)}/{sum(t.decoys for t in trials)}"
        f" | {sum(1 for t in valid if t.umbrellas == 0)}"
        f" | {p50:.1f} | {p90:.1f} | {statistics.median(tokens):.0f} | {max(tokens):.0f} |"
    )
    print(
        f"\nload average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
        f"max_tokens {max_tokens}; llama.cpp threads {threads}"
    )


if __name__ == "__main__":
    main()
