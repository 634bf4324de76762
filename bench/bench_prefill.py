"""A cut during llama.cpp's prompt processing: how long the slot stays busy, per batch size.

Run: ``python bench/bench_prefill.py [--model gemma|smollm2|PATH.gguf] [--rounds 2]
[--cuts 3] [--prompt-tokens 3300] [--rows 2048/512,1024/512,256/256@1,...]
[--burners 1] [--out DIR]``.
Needs the extra ``local``. Prints a Markdown table (``--out DIR`` writes it as
``DIR/bench_prefill.json`` for docs/benchmarks.md) and asserts nothing.

llama.cpp acts on a cancelled task only between batches of ``n_batch`` prompt
tokens (docs/cancellation-limits.md), so a cut during the prompt phase keeps
the slot until the batch under way is done. Each row is the embedded server
(``wirecut.local.LocalServer``, two slots) started with one
``n_batch``/``n_ubatch`` and, after ``@``, a number of llama.cpp threads
(default: ``LocalServer``'s); every row's server is up for the whole run, and the
rounds go row by row, one server busy at a time, so that the rows share the
machine's load alike (read the ratios, not the last digit).

``--burners N`` keeps N processes spinning on a core each for the whole run:
the other work of a machine (the console itself, a build, a browser), which
llama.cpp's threads share the cores with.

Per row and round:

- decode throughput: a short prompt answered with 64 tokens; llama.cpp's own
  ``timings.predicted_per_second``.
- prompt throughput: a fresh prompt of ``--prompt-tokens`` tokens (a new
  random text each time, so no slot's cache holds a prefix of it), answered
  with one token; llama.cpp's own ``timings.prompt_per_second``.
- cut -> idle: the same kind of prompt, streamed through
  ``wirecut.provider.ChatClient`` on a thread of an ``InterruptScope``, pinned
  to slot 0 (``id_slot``), cut by ``scope.cancel()`` 1.0, 1.3, 1.6 ... s after
  it was sent (before any token: the prompt takes longer than that). At once a
  one-token probe request, also pinned to slot 0, is sent: llama.cpp defers it
  until slot 0 is free, so the slot was idle at the probe's answer less the
  probe's own time (its ``timings``). The probe waits on the task queue and
  adds no result that would delay llama.cpp's notice of the closed client,
  as polling ``/slots`` faster than every 1.5 s would. Afterwards ``/slots``
  is read once to check that slot 0 is idle.

The verdict column applies the target of issue 15: idle <= 2 s after every cut,
and prompt throughput within 10 % of the default row's.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from _report import Report
from wirecut.local import LocalServer, is_available
from wirecut.provider import ChatClient
from wirecut.scope import InterruptScope

DEFAULT_ROWS = "2048/512,1024/512,512/512,256/256,256/128,128/128,64/64"
IDLE_TARGET_S = 2.0
THROUGHPUT_TOLERANCE = 0.10
WORDS = (
    "lighthouse keeper harbour storm lamp night sea ship rock wave wind tide gull rope bell "
    "oil wick glass stair door window island fog horn boat anchor chart compass logbook"
).split()


@dataclass
class Row:
    batch: int
    ubatch: int
    threads: int | None = None
    server: LocalServer | None = None
    decode: list[float] = field(default_factory=list)
    throughput: list[float] = field(default_factory=list)
    idle_s: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        threads = self.server.threads if self.server is not None else self.threads
        if threads is None:
            return f"{self.batch}/{self.ubatch}, default threads"
        return f"{self.batch}/{self.ubatch}, {threads} thread{'s' if threads != 1 else ''}"

    @classmethod
    def parse(cls, item: str) -> Row:
        sizes, _, threads = item.partition("@")
        batch, ubatch = map(int, sizes.split("/"))
        return cls(batch, ubatch, int(threads) if threads else None)


def _spin() -> None:
    while True:
        pass


def _decode(row: Row, http: httpx.Client) -> None:
    assert row.server is not None
    body = {
        "messages": [{"role": "user", "content": "Tell a long story about a lighthouse."}],
        "max_tokens": 64,
        "temperature": 1.0,
    }
    answer = http.post(row.server.base_url + "/chat/completions", json=body).json()
    row.decode.append(float(answer["timings"]["predicted_per_second"]))


def _prompt(http: httpx.Client, root: str, tokens: int, rng: random.Random) -> str:
    """A new text of about ``tokens`` tokens (counted by the server's own tokenizer)."""
    words = [f"Record {rng.getrandbits(64):x}."]
    while True:
        words += [rng.choice(WORDS) for _ in range(200)]
        text = " ".join(words)
        count = len(http.post(root + "/tokenize", json={"content": text}).json()["tokens"])
        if count >= tokens:
            return text


def _throughput(row: Row, http: httpx.Client, tokens: int, rng: random.Random) -> None:
    assert row.server is not None
    text = _prompt(http, row.server.root_url, tokens, rng)
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 1}
    answer = http.post(row.server.base_url + "/chat/completions", json=body).json()
    row.throughput.append(float(answer["timings"]["prompt_per_second"]))


def _cut(row: Row, http: httpx.Client, tokens: int, after: float, rng: random.Random) -> None:
    assert row.server is not None
    text = _prompt(http, row.server.root_url, tokens, rng)
    client = ChatClient(row.server.base_url, model=row.server.model, max_retries=0)
    scope = InterruptScope("bench-prefill")
    token = threading.Event()
    try:
        future = scope.spawn(
            client.chat,
            [{"role": "user", "content": text}],
            on_token=lambda _: token.set(),
            max_tokens=16,
            id_slot=0,
        )
        sent = time.monotonic()
        # The prompt's own pace: nothing to wait on but the clock.
        time.sleep(max(0.0, sent + after - time.monotonic()))
        if token.is_set() or future.done():
            row.problems.append(f"the prompt was done before the cut at {after:.1f} s")
            return
        cut_at = time.monotonic()
        scope.cancel("bench")
        probe_body = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            "id_slot": 0,
        }
        probe = http.post(row.server.base_url + "/chat/completions", json=probe_body).json()
        answered = time.monotonic()
        own = (probe["timings"]["prompt_ms"] + probe["timings"]["predicted_ms"]) / 1000
        row.idle_s.append(max(0.0, answered - cut_at - own))
        future.result(10)
        if not scope.wait_quiescent(10):
            row.problems.append("the cut request's thread or socket outlived the cut")
        slots = http.get(row.server.root_url + "/slots").json()
        if slots[0]["is_processing"]:
            row.problems.append("slot 0 still processing after the probe")
    finally:
        scope.cancel("bench")
        client.close()


def _fmt(value: float | None, unit: str = "s") -> str:
    return "-" if value is None else f"{value:.2f} {unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, gemma or a .gguf file")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cuts", type=int, default=3, help="cuts per row and round")
    parser.add_argument("--prompt-tokens", type=int, default=3300)
    parser.add_argument(
        "--rows", default=DEFAULT_ROWS, help="n_batch/n_ubatch[@threads], comma-separated"
    )
    parser.add_argument("--burners", type=int, default=0, help="busy processes beside the server")
    parser.add_argument("--out", type=Path, help="write bench_prefill.json into this folder")
    args = parser.parse_args()
    if not is_available():
        sys.exit("bench_prefill: needs the extra `local` (pip install 'wirecut[local]')")

    rows = [Row.parse(item) for item in args.rows.split(",")]
    rng = random.Random()
    burners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.burners)]
    with ExitStack() as stack:
        for burner in burners:
            burner.start()
            stack.callback(burner.kill)
        http = stack.enter_context(httpx.Client(timeout=300))
        for row in rows:
            print(f"starting n_batch/n_ubatch {row.label} ...", file=sys.stderr, flush=True)
            threads = {} if row.threads is None else {"threads": row.threads}
            row.server = stack.enter_context(
                LocalServer(args.model, batch_size=row.batch, ubatch_size=row.ubatch, **threads)
            )
            warm = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            http.post(row.server.base_url + "/chat/completions", json=warm)
        for round_ in range(args.rounds):
            for row in rows:
                print(f"round {round_ + 1}: {row.label}", file=sys.stderr, flush=True)
                _decode(row, http)
                _throughput(row, http, args.prompt_tokens, rng)
                for k in range(args.cuts):
                    _cut(row, http, args.prompt_tokens, 1.0 + 0.3 * k, rng)

    default = statistics.median(rows[0].throughput)
    model = rows[0].server.model if rows[0].server else args.model
    made = Report(
        "bench_prefill",
        "A cut during llama.cpp's prompt processing, per batch size",
        "The embedded llama.cpp (`LocalServer`, two slots) with one `n_batch`/`n_ubatch` "
        "(and llama.cpp threads) a row: its decode and prompt throughput (llama.cpp's own "
        "timings), and how long slot 0 stays busy after `scope.cancel()` cuts a streamed "
        "request in its prompt phase (a one-token probe pinned to slot 0, less its own "
        "time). The verdict: idle within 2 s of every cut, prompt throughput within 10 % "
        "of the first row's.",
    )
    problems = [f"{row.label}: {problem}." for row in rows for problem in sorted(set(row.problems))]
    table = made.table(
        f"Model {model}, a prompt of {args.prompt_tokens} tokens, "
        f"{args.rounds} rounds x {args.cuts} cuts a row, "
        f"{args.burners} busy process{'es' if args.burners != 1 else ''} beside it",
        [
            "n_batch / n_ubatch, threads",
            "decode tok/s",
            "prompt tok/s",
            "vs first row",
            "one batch",
            "cut -> idle p50",
            "max",
            "cuts",
            "verdict",
        ],
        note=" ".join(problems) or None,
    )
    for row in rows:
        rate = statistics.median(row.throughput)
        idle_max = max(row.idle_s) if row.idle_s else None
        ok = (
            idle_max is not None
            and idle_max <= IDLE_TARGET_S
            and rate >= (1 - THROUGHPUT_TOLERANCE) * default
            and not row.problems
        )
        table.add(
            row.label,
            f"{statistics.median(row.decode):.1f}",
            f"{rate:.0f}",
            f"{rate / default:.0%}",
            _fmt(row.batch / rate),
            _fmt(statistics.median(row.idle_s) if row.idle_s else None),
            _fmt(idle_max),
            len(row.idle_s),
            "meets the target" if ok else "no",
        )
    made.data = {
        "settings": {
            "model": model,
            "prompt_tokens": args.prompt_tokens,
            "rounds": args.rounds,
            "cuts": args.cuts,
            "burners": args.burners,
        },
        "rows": [
            {
                "label": row.label,
                "batch": row.batch,
                "ubatch": row.ubatch,
                "decode_tokens_per_s": row.decode,
                "prompt_tokens_per_s": row.throughput,
                "cut_to_idle_s": row.idle_s,
                "problems": row.problems,
            }
            for row in rows
        ],
    }
    made.print()
    if args.out:
        made.write(args.out)


if __name__ == "__main__":
    main()
