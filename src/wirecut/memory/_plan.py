"""The model's part of consolidation: ask for a plan of umbrella notes, read it, check it.

``make_plan`` is an ``AIAgent`` conversation that needs no store: it gets the
notes as read and returns a ``Plan``. It writes nothing and holds no
transaction, so a slow model locks nothing, and the same call can run
somewhere else (a cluster worker) while the store stays with the host.
``validate_plan`` checks a plan against the notes before anything is written.

Nothing a small model says can make a plan destructive (docs/memory.md,
"What a plan must be"). The request carries ``response_format`` with a JSON
schema (``plan_schema``) that llama.cpp turns into a grammar: only groups
of notes that share a word (``related_groups``), at most one umbrella a
request, bounded title and summary lengths. What a grammar cannot say,
``validate_plan`` refuses with the reason: a title or summary with no words
or a placeholder, a summary that repeats its title, two umbrellas with one
title, an umbrella over every active note, a note in two umbrellas. A reply
that pads (whitespace, or text after the JSON closed) is cut as soon as that
shows instead of decoding until ``max_tokens``
(docs/architecture.md, fact 9); a reply whose JSON closed is read up to
there, and one cut at ``max_tokens`` before its JSON closed is never a plan.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import wirecut.scope as ws
from wirecut.agent import AIAgent, ConversationStatus
from wirecut.memory._notes import (
    Note,
    NoteState,
    Umbrella,
    check_body,
    check_title,
)
from wirecut.memory._related import (
    listing_order,
    related_groups,
    subject_words,
)
from wirecut.provider import Chat, Usage
from wirecut.scope import InterruptScope, bind_scope

__all__ = [
    "MERGE_ALL_MIN_NOTES",
    "PLAN_FREQUENCY_PENALTY",
    "PLAN_MAX_TOKENS",
    "PLAN_MAX_UMBRELLAS",
    "PROMPT_BODY_CHARS",
    "SUMMARY_MAX_CHARS",
    "UMBRELLA_MAX_NOTES",
    "WHITESPACE_RUN_CUT",
    "Plan",
    "PlanRequest",
    "make_plan",
    "parse_plan",
    "plan_request",
    "plan_schema",
    "validate_plan",
]

#: ``max_tokens`` of the plan request unless the caller gives one.
PLAN_MAX_TOKENS = 384
#: The plan request's ``frequency_penalty``: none, so that a summary may use its notes' words.
PLAN_FREQUENCY_PENALTY = 0.0
#: How much of each note's body the model sees.
PROMPT_BODY_CHARS = 160
#: The bounds of an umbrella's title and summary. (No ``pattern``: llama.cpp's
#: grammar took some patterns as no constraint at all, docs/memory.md.)
TITLE_MIN_CHARS = 3
PLAN_TITLE_MAX_CHARS = 40
SUMMARY_MIN_CHARS = 20
SUMMARY_MAX_CHARS = 120
#: At most this many umbrellas in one plan.
PLAN_MAX_UMBRELLAS = 5
#: At most this many notes in one umbrella.
UMBRELLA_MAX_NOTES = 3
#: From this many active notes on, an umbrella over all of them is refused.
MERGE_ALL_MIN_NOTES = 4
#: A reply with this many whitespace characters in a row is cut: padding.
WHITESPACE_RUN_CUT = 48

SYSTEM_PROMPT = (
    "You group a person's notes. If the notes below are about the same subject, put them "
    "under an umbrella: the numbers of its notes, a short title, and a summary that says "
    "what the notes say, in one sentence, using their words. If they are not, answer "
    "with no umbrella. Answer with JSON only."
)

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


@dataclass(frozen=True)
class Plan:
    """A consolidation plan: the umbrella notes to create over existing notes.

    ``defect`` says why the model's reply is no plan at all (cut short,
    padded, not JSON, not of the plan's shape, the provider failed);
    ``interrupted`` is True when a cancel cut the conversation. ``text`` is
    the reply as the model gave it and ``usage`` what the provider produced
    for it (also when it was cut). A plan built by hand only needs
    ``umbrellas``.
    """

    umbrellas: tuple[Umbrella, ...] = ()
    defect: str | None = None
    interrupted: bool = False
    text: str = ""
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class PlanRequest:
    """What the model is asked for a plan: the notes as a numbered list, and the answer's schema.

    Note number ``k`` of the list is ``listing[k - 1]``; ``groups`` are the
    groups of numbers the schema offers (notes that share a word, the best
    first: ``related_groups``), ``prompt`` the user message.
    """

    listing: tuple[Note, ...]
    groups: tuple[tuple[int, ...], ...]
    schema: dict[str, Any]
    prompt: str


def plan_request(notes: Sequence[Note]) -> PlanRequest:
    """The request for a plan over ``notes`` (pure; call from anywhere).

    The notes are listed so that the best disjoint pairs of related notes
    come first (``listing_order``), numbered from 1: short numbers, and the
    first ones a small model picks are the likeliest. Empty ``groups``: no two
    notes share a word, and there is nothing to ask.
    """
    by_id = related_groups(notes, max_size=UMBRELLA_MAX_NOTES)
    listing = tuple(listing_order(notes, by_id))
    number = {note.id: k for k, note in enumerate(listing, start=1)}
    groups = tuple(tuple(sorted(number[i] for i in group)) for group in by_id)
    return PlanRequest(
        listing=listing,
        groups=groups,
        schema=plan_schema(groups, max_umbrellas=1),
        prompt=_prompt(listing),
    )


def plan_schema(
    groups: Sequence[Sequence[int]], *, max_umbrellas: int = PLAN_MAX_UMBRELLAS
) -> dict[str, Any]:
    """The JSON schema of a plan whose umbrellas may group only ``groups``, tight as a grammar goes.

    Each umbrella's ``notes`` is one of ``groups`` (an enum of sorted lists of
    list numbers: two or more distinct notes that share a word, never any
    others); at most ``max_umbrellas`` umbrellas; bounded lengths of title
    and summary. Ids first: the title and summary are
    then written about the notes chosen. What a schema cannot say (a note in
    two umbrellas, a placeholder) ``validate_plan`` checks.
    """
    return {
        "type": "object",
        "properties": {
            "umbrellas": {
                "type": "array",
                "maxItems": max_umbrellas,
                "items": {
                    "type": "object",
                    "properties": {
                        "notes": {"enum": [sorted(group) for group in groups]},
                        "title": {
                            "type": "string",
                            "minLength": TITLE_MIN_CHARS,
                            "maxLength": PLAN_TITLE_MAX_CHARS,
                        },
                        "summary": {
                            "type": "string",
                            "minLength": SUMMARY_MIN_CHARS,
                            "maxLength": SUMMARY_MAX_CHARS,
                        },
                    },
                    "required": ["notes", "title", "summary"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["umbrellas"],
        "additionalProperties": False,
    }


def make_plan(
    client: Chat,
    notes: Sequence[Note],
    *,
    model: str | None = None,
    max_tokens: int = PLAN_MAX_TOKENS,
    temperature: float | None = 0.0,
    frequency_penalty: float | None = PLAN_FREQUENCY_PENALTY,
    on_token: Callable[[str], None] | None = None,
) -> Plan:
    """Ask the model for a plan of umbrella notes over ``notes``; return what it answered.

    Asks about one group at a time, each in a fresh ``AIAgent``
    conversation: the best group of notes that share a word among those no
    umbrella took yet (``related_groups``), listed alone (``plan_request``).
    The model answers with one umbrella over them (it names and summarises
    them) or with none (they do not belong together: that group, and any
    group that holds it, is not offered again). Asked about the whole list,
    SmolLM2 picked the first group but titled it after some other note, and
    copied one title onto the next umbrella (docs/memory.md, "The model and
    the numbers"). Up to ``PLAN_MAX_UMBRELLAS`` requests; it stops early when
    no group is left, or when a reply is not a single umbrella over notes
    still free (a provider that ignored the schema: that reply is the rest
    of the plan, for ``validate_plan`` to judge). Runs in the calling
    thread, under the scope bound there (the host's); reads and writes no
    store. ``on_token`` gets the replies as they stream, a newline between
    two. ``max_tokens`` bounds each reply. Never raises for what the model
    or the provider did: a reply that is no plan makes a ``Plan`` with a
    ``defect`` (and no umbrellas), with the usage of every request.

    ``temperature`` defaults to 0: a plan wants no invention, and with the
    tiny local models the default sampling padded whitespace until
    ``max_tokens`` where greedy decoding closed the JSON (None: the
    provider's default). ``frequency_penalty`` (OpenAI's, which llama.cpp
    honours) defaults to 0: at 0.5 SmolLM2's summaries repeated themselves
    less but avoided the notes' own words for invented ones
    (bench/bench_curator.py, docs/memory.md).

    Each reply is watched as it streams: once its JSON closed, the request
    is cut (what follows is not part of the plan), and after
    ``WHITESPACE_RUN_CUT`` whitespace characters in a row it is cut and is
    no plan (padding, which would otherwise run to ``max_tokens``). Those
    cuts go through a child scope, like a cancel: the provider sees the close.

    Cancellation: a cancel of the bound scope cuts the request in flight
    (the provider sees the close), asks for nothing more, and returns at
    once a ``Plan`` with ``interrupted=True``, a ``defect``, and the usage of
    what was produced before the cut. The caller checks its scope after this
    returns.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, not {max_tokens!r}")
    params: dict[str, Any] = {"max_tokens": max_tokens}
    if temperature is not None:
        params["temperature"] = temperature
    if frequency_penalty is not None:
        params["frequency_penalty"] = frequency_penalty
    umbrellas: list[Umbrella] = []
    texts: list[str] = []
    usage = Usage()
    free = list(notes)
    declined: list[frozenset[int]] = []
    for _ in range(PLAN_MAX_UMBRELLAS):
        group = _next_group(free, declined)
        if group is None:
            break  # no two free notes share a word (or the model declined them)
        if texts and on_token is not None:
            on_token("\n")
        request = plan_request([note for note in free if note.id in group])
        part = _ask(client, request, model, params, on_token)
        texts.append(part.text)
        usage.add(part.usage)
        if part.defect is not None:
            return dataclasses.replace(part, text="\n".join(texts), usage=usage)
        if not part.umbrellas:
            declined.append(group)  # the model says they do not belong together
            continue
        umbrellas += part.umbrellas
        taken = {note_id for umbrella in part.umbrellas for note_id in umbrella.note_ids}
        if len(part.umbrellas) != 1 or not taken <= {note.id for note in free}:
            break
        free = [note for note in free if note.id not in taken]
    return Plan(umbrellas=tuple(umbrellas), text="\n".join(texts), usage=usage)


def _next_group(free: Sequence[Note], declined: Sequence[frozenset[int]]) -> frozenset[int] | None:
    """The best group of ``free`` notes that share a word and hold no group the model declined."""
    for group in related_groups(free, max_size=UMBRELLA_MAX_NOTES):
        if not any(no <= set(group) for no in declined):
            return frozenset(group)
    return None


def _ask(
    client: Chat,
    request: PlanRequest,
    model: str | None,
    params: dict[str, Any],
    on_token: Callable[[str], None] | None,
) -> Plan:
    """One request of ``make_plan``: the plan (or the defect) of one reply."""
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "consolidation_plan", "strict": True, "schema": request.schema},
    }
    agent = AIAgent(
        client,
        model=model,
        system_prompt=SYSTEM_PROMPT,
        max_iterations=1,
        response_format=response_format,
        **params,
    )
    # Our own cuts (the JSON closed, padding) cancel this child; the host's
    # cancel reaches it through the parent.
    reply_scope = InterruptScope("plan-reply", parent=ws.current_scope())
    watcher = _ReplyWatcher(reply_scope, on_token)
    with bind_scope(reply_scope):
        result = agent.run_conversation(request.prompt, on_token=watcher)
    reply_scope.close()
    text, usage = result.final_text, result.usage
    host = ws.current_scope()
    ours = host is None or not host.cancelled  # a cut of ours, not the host's cancel
    if ours and watcher.cut is _Cut.CLOSED and result.status in _READ:
        # The JSON closed: that is the whole reply, whatever the provider
        # says next. Its last token may also have been the last one
        # ``max_tokens`` allowed, and whether the provider's "length" or our
        # cut comes first is a race that says nothing about the plan.
        plan = parse_plan(watcher.json_text, listing=request.listing)
        return dataclasses.replace(plan, usage=usage)
    if ours and watcher.cut is _Cut.PADDING and result.status in _READ:
        return Plan(
            defect=(
                f"the model padded its reply with whitespace; it was cut after "
                f"{WHITESPACE_RUN_CUT} blank characters in a row"
            ),
            text=text,
            usage=usage,
        )
    if result.status is ConversationStatus.INTERRUPTED:
        return Plan(
            defect=f"the model's reply was cut short ({result.reason})",
            interrupted=True,
            text=text,
            usage=usage,
        )
    if result.status is ConversationStatus.ERROR:
        return Plan(defect=f"the provider failed: {result.reason}", text=text, usage=usage)
    if result.status is not ConversationStatus.OK:
        return Plan(defect="the model called tools instead of giving a plan", usage=usage)
    if result.finish_reason == "length":
        # Its JSON never closed (that is read above): half a plan.
        max_tokens = params["max_tokens"]
        return Plan(
            defect=f"the model's reply was cut short at max_tokens ({max_tokens})",
            text=text,
            usage=usage,
        )
    return dataclasses.replace(parse_plan(text, listing=request.listing), usage=usage)


#: The ends of a conversation after which ``_ReplyWatcher``'s verdict is read.
_READ = frozenset({ConversationStatus.OK, ConversationStatus.INTERRUPTED})


class _Cut(enum.Enum):
    """Why ``_ReplyWatcher`` cut a reply."""

    CLOSED = "closed"  # the JSON value is complete: the rest is not the plan
    PADDING = "padding"  # a long run of whitespace: the model is padding


class _ReplyWatcher:
    """Follows a streamed reply: where its JSON closes, how long its whitespace runs are.

    Called with each content delta in the thread that reads the reply;
    passes each on to ``forward``, then cuts ``scope`` when the top-level
    JSON value closed or ``WHITESPACE_RUN_CUT`` whitespace characters came
    in a row. ``json_text`` is the reply up to the end of its JSON value.
    """

    def __init__(self, scope: InterruptScope, forward: Callable[[str], None] | None) -> None:
        self._scope = scope
        self._forward = forward
        self.cut: _Cut | None = None
        self.json_text = ""
        self._depth = 0
        self._started = False
        self._in_string = False
        self._escaped = False
        self._blank_run = 0

    def __call__(self, text: str) -> None:
        if self._forward is not None:
            self._forward(text)
        if self.cut is not None:
            return
        for index, char in enumerate(text):
            self._blank_run = self._blank_run + 1 if char.isspace() else 0
            if self._blank_run >= WHITESPACE_RUN_CUT:
                self._stop(_Cut.PADDING)
                return
            if self._step(char):
                self.json_text += text[: index + 1]
                self._stop(_Cut.CLOSED)
                return
        self.json_text += text

    def _step(self, char: str) -> bool:
        """Advance over one character; True when it closed the top-level value."""
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = False
            return False
        if char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
            self._started = True
        elif char in "}]":
            self._depth -= 1
            return self._started and self._depth <= 0
        return False

    def _stop(self, why: _Cut) -> None:
        self.cut = why
        self._scope.cancel(f"plan reply {why.value}")


def parse_plan(text: str, *, listing: Sequence[Note] = ()) -> Plan:
    """Read a plan from the model's JSON text; a ``Plan`` with a ``defect`` if it is not one.

    An umbrella names its notes by id (``"note_ids"``) or, as the schema of
    ``plan_request`` asks, by their numbers in ``listing`` (``"notes"``: 1 is
    ``listing[0]``); either way the plan holds ids. Checks the shape only
    (``validate_plan`` checks the content); keys the schema does not know are
    ignored. JSON nested too deeply to read is a defect like any other.
    """

    def defect(why: str) -> Plan:
        return Plan(defect=f"the reply is not a plan: {why}", text=text)

    try:
        data = json.loads(text)
    except ValueError as exc:
        return defect(f"not JSON ({exc})")
    except RecursionError:
        return defect("its JSON is nested too deeply")
    if not isinstance(data, dict) or not isinstance(data.get("umbrellas"), list):
        return defect('it must be an object with an array "umbrellas"')
    umbrellas = []
    for i, item in enumerate(data["umbrellas"], start=1):
        if not isinstance(item, dict):
            return defect(f"umbrella {i} is not an object")
        title, summary = item.get("title"), item.get("summary", "")
        key = "notes" if "notes" in item and listing else "note_ids"
        ids = item.get(key)
        if not isinstance(title, str):
            return defect(f'umbrella {i}: "title" must be a string')
        if not isinstance(summary, str):
            return defect(f'umbrella {i}: "summary" must be a string')
        if not isinstance(ids, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in ids
        ):
            return defect(f'umbrella {i}: "{key}" must be an array of integers')
        if key == "notes":
            if not all(1 <= n <= len(listing) for n in ids):
                return defect(f"umbrella {i}: the notes are numbered 1 to {len(listing)}")
            ids = [listing[n - 1].id for n in ids]
        umbrellas.append(Umbrella(title=title, body=summary, note_ids=tuple(ids)))
    return Plan(umbrellas=tuple(umbrellas), text=text)


def validate_plan(plan: Plan, notes: Sequence[Note]) -> list[str]:
    """Every reason why ``plan`` cannot be applied to ``notes``; empty if it can.

    ``notes`` are the notes as read (all of them, any state). A plan is
    valid when it has no ``defect``; every umbrella has a fit title and
    summary (words, not a placeholder, a summary that says more than its
    title, a title no other umbrella has) and merges at least two distinct
    notes that share a word (``subject_words``), not every active one of
    ``MERGE_ALL_MIN_NOTES`` or more; every note it names exists and is
    active; and no note is in two umbrellas. A plan with
    no umbrellas is valid: it changes nothing. Pure; call from anywhere.
    """
    if plan.defect is not None:
        return [plan.defect]
    by_id = {note.id: note for note in notes}
    active = {note.id for note in notes if note.state is NoteState.ACTIVE}
    owner: dict[int, int] = {}
    problems: list[str] = []
    titles: dict[str, int] = {}
    for i, umbrella in enumerate(plan.umbrellas, start=1):
        problems += _text_problems(i, umbrella)
        # A small model copies its first umbrella's text onto the next one.
        first = titles.setdefault(_normal(umbrella.title), i)
        if first != i:
            problems.append(f"umbrella {i} has the title of umbrella {first}")
        if len(set(umbrella.note_ids)) < 2:
            problems.append(f"umbrella {i} merges fewer than two notes")
        elif len(active) >= MERGE_ALL_MIN_NOTES and active <= set(umbrella.note_ids):
            problems.append(
                f"umbrella {i} merges every active note ({len(active)}): that groups nothing"
            )
        elif all(note_id in by_id for note_id in umbrella.note_ids) and not frozenset.intersection(
            *(subject_words(by_id[note_id]) for note_id in umbrella.note_ids)
        ):
            problems.append(f"umbrella {i}: its notes share no word")
        seen: set[int] = set()
        for note_id in umbrella.note_ids:
            if note_id in seen:
                problems.append(f"umbrella {i} names note #{note_id} twice")
                continue
            seen.add(note_id)
            note = by_id.get(note_id)
            if note is None:
                problems.append(f"umbrella {i}: note #{note_id} does not exist")
            elif note.state is not NoteState.ACTIVE:
                problems.append(f"umbrella {i}: note #{note_id} is {note.state}, not active")
            if note_id in owner:
                problems.append(f"note #{note_id} is in umbrellas {owner[note_id]} and {i}")
            else:
                owner[note_id] = i
    return problems


def _text_problems(i: int, umbrella: Umbrella) -> list[str]:
    """Why the title or the summary of umbrella ``i`` is unfit; empty if both are fit."""
    problems = []
    for what, text, check in (
        ("title", umbrella.title, check_title),
        ("summary", umbrella.body, check_body),
    ):
        try:
            check(text)
        except ValueError as exc:
            problems.append(f"umbrella {i}: the {what} {exc}")
            continue
        if not any(char.isalnum() for char in text):
            shown = f" ({text.strip()!r})" if text.strip() else ""
            problems.append(f"umbrella {i}: the {what} has no words{shown}")
        elif {_normal(text), _normal(text).replace(" ", "")} & PLACEHOLDERS:
            problems.append(f"umbrella {i}: the {what} is a placeholder ({text.strip()!r})")
    if not problems and _normal(umbrella.body) == _normal(umbrella.title):
        problems.append(f"umbrella {i}: the summary only repeats the title")
    return problems


def _normal(text: str) -> str:
    """``text`` in lower case, its punctuation dropped and its spaces collapsed."""
    return " ".join(re.sub(r"[^\w\s]|_", " ", text.casefold()).split())


def _prompt(listing: Sequence[Note]) -> str:
    """The notes as a compact numbered list, numbered from 1 in ``listing``'s order.

    The body goes on its own indented line: on one line with the title, the
    model copied "title: body" into its umbrella titles.
    """
    lines = []
    for number, note in enumerate(listing, start=1):
        body = " ".join(note.body.split())[:PROMPT_BODY_CHARS]
        title = " ".join(note.title.split())
        lines.append(f"{number}. {title}\n   {body}" if body else f"{number}. {title}")
    return "Notes:\n" + "\n".join(lines) + "\nAnswer:"
