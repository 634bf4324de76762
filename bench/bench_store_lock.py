"""Cancel -> return of a note-store write that waits for another writer's lock.

Run: ``python bench/bench_store_lock.py [--trials 20] [--before OLD/src] [--out DIR]``.
Another connection holds the store's write lock (``BEGIN IMMEDIATE``); a
``memory add``-like write (``NoteStore.add`` under a scope, on a thread)
waits for it; the scope is cancelled 50 ms later and the time until the
write returned is measured. Each trial runs in a fresh process, with this
checkout's code and, with ``--before``, with the code at that source tree
(e.g. main's ``src``), side by side. Prints a Markdown table (``--out DIR``
writes it as ``DIR/bench_store_lock.json`` for docs/benchmarks.md); asserts
nothing (target: a cancel ends the wait at once, not at SQLite's busy
timeout).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from _procs import percentile
from _report import Report

HERE = Path(__file__).resolve().parent.parent / "src"

TRIAL = r"""
import json, sqlite3, sys, tempfile, threading, time
from pathlib import Path
from wirecut.memory import NoteStore
from wirecut.scope import Interrupted, InterruptScope

store = NoteStore(Path(tempfile.mkdtemp()) / "notes.db")
holder = sqlite3.connect(store.path, isolation_level=None)
holder.execute("BEGIN IMMEDIATE")
scope = InterruptScope("command")
returned = threading.Event()
outcome = []

def write():
    try:
        scope.run(store.add, "Title", "body")
        outcome.append("written")
    except Interrupted:
        outcome.append("interrupted")
    except Exception as exc:
        outcome.append(type(exc).__name__)
    returned.set()

threading.Thread(target=write, daemon=True).start()
time.sleep(0.05)  # the write is waiting for the lock by now
cancelled = time.monotonic()
scope.cancel("user")
returned.wait(30)
took = (time.monotonic() - cancelled) * 1000
holder.execute("ROLLBACK")
print(json.dumps({"ms": took, "outcome": outcome[0]}))
"""


def trial(src: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", TRIAL], env=env, capture_output=True, text=True, check=True
    ).stdout
    result: dict[str, object] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument(
        "--before", type=Path, default=None, help="an older source tree to compare with"
    )
    parser.add_argument("--out", type=Path, help="write bench_store_lock.json into this folder")
    args = parser.parse_args()
    made = Report(
        "bench_store_lock",
        "A store write waiting for the lock, cancelled",
        "A `memory add`-like write (`NoteStore.add` under a scope, on a thread) waits for "
        "the store's write lock, held by another connection (`BEGIN IMMEDIATE`); the scope "
        "is cancelled 50 ms later: the time until the write returned, and how it returned. "
        "A fresh process a trial; with `--before`, an older tree's code beside this one.",
    )
    table = made.table(
        "Cancel -> the waiting write returned",
        ["code", "trials", "p50", "p99", "max", "outcome"],
    )
    trees = [("before", args.before)] if args.before is not None else []
    found: dict[str, list[dict[str, object]]] = {}
    for name, src in [*trees, ("this tree", HERE)]:
        runs = [trial(src) for _ in range(args.trials)]
        ms = [float(str(run["ms"])) for run in runs]
        outcomes = sorted({str(run["outcome"]) for run in runs})
        table.add(
            name,
            len(runs),
            f"{percentile(ms, 50):.2f} ms",
            f"{percentile(ms, 99):.2f} ms",
            f"{max(ms):.2f} ms",
            ", ".join(outcomes),
        )
        found[name] = runs
    made.data = {"settings": {"trials": args.trials}, "trials": found}
    made.print()
    if args.out:
        made.write(args.out)


if __name__ == "__main__":
    main()
