"""The model's part of consolidation: ask for a plan of umbrella notes, read it, check it.

``make_plan`` is an ``AIAgent`` conversation that needs no store: it gets the
notes as read and returns a ``Plan``. It writes nothing and holds no
transaction, so a slow model locks nothing, and the same call can run
somewhere else (a cluster worker) while the store stays with the host.
``validate_plan`` checks a plan against the notes before anything is written.

The model chooses among groups and names them; it writes nothing else that
is kept (docs/memory.md, "What a plan must be"). Each request is about one
group of notes whose titles share a word (``related_groups``) and carries
``response_format`` with a JSON schema (``plan_schema``) that llama.cpp
turns into a grammar: the group, by note id, or no umbrella;
a short title; a summary only when one was asked for. The umbrella's body
is its notes' own text (``umbrella_body``). What a grammar cannot say,
``validate_plan`` refuses with the reason: a title that repeats a word, is
one member's title or names nothing the notes share; a summary that ends
mid-sentence or says a number or a name the notes do not; notes whose titles
share no word; a body that is not the notes' own text; a note in two
umbrellas. A reply that pads (whitespace, or text after the JSON closed) is
cut as soon as that shows instead of decoding until ``max_tokens``
(docs/architecture.md, fact 9); a reply whose JSON closed is read up to
there, and one cut at ``max_tokens`` before its JSON closed is never a plan.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import wirecut.scope as ws
from wirecut.agent import AIAgent, ConversationStatus
from wirecut.memory._notes import Note, NoteState, Umbrella, check_body
from wirecut.memory._related import (
    UMBRELLA_MAX_NOTES,
    related_groups,
    shared_title_words,
    subject_words,
)
from wirecut.memory._umbrella_text import (
    normal,
    shared_title,
    summary_problems,
    title_problems,
    umbrella_body,
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
#: The plan request's ``frequency_penalty``: none, so that a title may use its notes' words.
PLAN_FREQUENCY_PENALTY = 0.0
#: How much of each note's body the model sees.
PROMPT_BODY_CHARS = 160
#: The bounds of an umbrella's title and summary. (No ``pattern``: llama.cpp's
#: grammar took some patterns as no constraint at all, docs/memory.md.)
TITLE_MIN_CHARS = 3
PLAN_TITLE_MAX_CHARS = 40
SUMMARY_MIN_CHARS = 20
SUMMARY_MAX_CHARS = 160
#: At most this many umbrellas in one plan (and requests for one).
PLAN_MAX_UMBRELLAS = 5
#: From this many active notes on, an umbrella over all of them is refused.
MERGE_ALL_MIN_NOTES = 4
#: A reply with this many whitespace characters in a row is cut: padding.
WHITESPACE_RUN_CUT = 48

SYSTEM_PROMPT = (
    "You file a person's notes. The notes below share a word in their titles. If they "
    "are about one thing, answer with an umbrella: the numbers of the notes about it and "
    "a short title, two or three words, that names what all of them are about. If they "
    "are not about one thing, answer with no umbrella. Answer with JSON only."
)
SUMMARY_PROMPT = (
    " Also write a summary: one sentence that ends with a full stop and uses only the "
    "notes' own words, numbers and names."
)


@dataclass(frozen=True)
class Plan:
    """A consolidation plan: the umbrella notes to create over existing notes.

    ``defect`` says why the model's reply is no plan at all (cut short,
    padded, not JSON, not of the plan's shape, the provider failed);
    ``interrupted`` is True when a cancel cut the conversation. ``text`` is
    the reply as the model gave it and ``usage`` what the provider produced
    for it (also when it was cut). ``remarks`` say, for people, where the
    plan differs from the reply (a title refused and replaced). A plan
    built by hand only needs ``umbrellas``.
    """

    umbrellas: tuple[Umbrella, ...] = ()
    defect: str | None = None
    interrupted: bool = False
    text: str = ""
    usage: Usage = field(default_factory=Usage)
    remarks: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanRequest:
    """What the model is asked about one group: its notes, listed, and the answer's schema.

    ``listing`` are the notes in id order; ``groups`` are the groups of note
    ids the schema offers (the whole group, or none), ``prompt`` the user
    message.
    """

    listing: tuple[Note, ...]
    groups: tuple[tuple[int, ...], ...]
    schema: dict[str, Any]
    prompt: str


def plan_request(notes: Sequence[Note], *, summarize: bool = False) -> PlanRequest:
    """The request for an umbrella over ``notes``, one group (pure; call from anywhere).

    The notes are listed by id (``#7 Lyon trip``), the ids the plan names
    them by and the confirmation shows. The schema offers ``notes`` whole,
    or no umbrella: offered the group's parts as well, SmolLM2 answered
    with a part, leaving a note out, for about half of the groups
    (docs/memory.md). With ``summarize`` it asks for a summary too. Empty
    ``groups``: the titles share no word, and there is nothing to ask. At
    most ``UMBRELLA_MAX_NOTES`` notes (``related_groups`` makes groups that
    size).
    """
    if len(notes) > UMBRELLA_MAX_NOTES:
        raise ValueError(f"a request is about at most {UMBRELLA_MAX_NOTES} notes, not {len(notes)}")
    listing = tuple(sorted(notes, key=lambda note: note.id))
    whole = tuple(note.id for note in listing)
    groups = (whole,) if len(whole) >= 2 and shared_title_words(listing) else ()
    return PlanRequest(
        listing=listing,
        groups=groups,
        schema=plan_schema(groups, max_umbrellas=1, summarize=summarize),
        prompt=_prompt(listing),
    )


def plan_schema(
    groups: Sequence[Sequence[int]],
    *,
    max_umbrellas: int = PLAN_MAX_UMBRELLAS,
    summarize: bool = False,
) -> dict[str, Any]:
    """The JSON schema of a plan whose umbrellas may group only ``groups``, tight as a grammar goes.

    Each umbrella's ``notes`` is one of ``groups`` (an enum of sorted lists
    of note ids, never any others); at most ``max_umbrellas`` umbrellas; a
    title of bounded length, and with ``summarize`` a summary of bounded
    length. Ids first: the title is then written about the notes chosen.
    What a schema cannot say (a note in two umbrellas, a title that repeats
    a word) ``validate_plan`` checks.
    """
    properties: dict[str, Any] = {
        "notes": {"enum": [sorted(group) for group in groups]},
        "title": {
            "type": "string",
            "minLength": TITLE_MIN_CHARS,
            "maxLength": PLAN_TITLE_MAX_CHARS,
        },
    }
    if summarize:
        properties["summary"] = {
            "type": "string",
            "minLength": SUMMARY_MIN_CHARS,
            "maxLength": SUMMARY_MAX_CHARS,
        }
    return {
        "type": "object",
        "properties": {
            "umbrellas": {
                "type": "array",
                "maxItems": max_umbrellas,
                "items": {
                    "type": "object",
                    "properties": properties,
                    "required": list(properties),
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
    summarize: bool = False,
    model: str | None = None,
    max_tokens: int = PLAN_MAX_TOKENS,
    temperature: float | None = 0.0,
    frequency_penalty: float | None = PLAN_FREQUENCY_PENALTY,
    on_token: Callable[[str], None] | None = None,
) -> Plan:
    """Ask the model for a plan of umbrella notes over ``notes``; return what it answered.

    Asks about one group at a time, each in a fresh ``AIAgent``
    conversation: the best group of notes whose titles share a word among
    those no umbrella took yet (``related_groups``: the largest first),
    listed alone (``plan_request``). The model answers with one umbrella
    over the whole group, titled, or with none: then no group that holds two
    notes of it is offered again. Asked about the whole list,
    SmolLM2 picked the first group but titled it after some other note
    (docs/memory.md, "The model and the numbers"). Each umbrella's body is
    its notes' own text (``umbrella_body``), after a summary when
    ``summarize`` asks the model for one. A title that ``title_problems``
    refuses is replaced by what all the notes' titles share
    (``shared_title``: SmolLM2 gives nearly every group its first note's
    title), and a remark says so; a summary is never replaced. Up to ``PLAN_MAX_UMBRELLAS``
    requests; it stops early when no group is left, or when a reply is not
    a single umbrella over notes still free (a provider that ignored the
    schema: that reply is the rest of the plan, for ``validate_plan`` to
    judge). Runs in the calling thread, under the scope bound there (the
    host's); reads and writes no store. ``on_token`` gets the replies as
    they stream, a newline between two. ``max_tokens`` bounds each reply.
    Never raises for what the model or the provider did: a reply that is no
    plan makes a ``Plan`` with a ``defect`` (and no umbrellas), with the
    usage of every request.

    ``temperature`` defaults to 0: a plan wants no invention, and with the
    tiny local models the default sampling padded whitespace until
    ``max_tokens`` where greedy decoding closed the JSON (None: the
    provider's default). ``frequency_penalty`` (OpenAI's, which llama.cpp
    honours) defaults to 0: at 0.5 SmolLM2 avoided the notes' own words for
    invented ones (docs/memory.md).

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
    remarks: list[str] = []
    usage = Usage()
    free = list(notes)
    declined: list[frozenset[int]] = []
    for _ in range(PLAN_MAX_UMBRELLAS):
        group = _next_group(free, declined)
        if group is None:
            break  # no two free titles share a word (or the model declined them)
        if texts and on_token is not None:
            on_token("\n")
        request = plan_request([note for note in free if note.id in group], summarize=summarize)
        part = _ask(client, request, notes, summarize, model, params, on_token)
        texts.append(part.text)
        usage.add(part.usage)
        if part.defect is not None:
            return dataclasses.replace(
                part, text="\n".join(texts), usage=usage, remarks=tuple(remarks)
            )
        if not part.umbrellas:
            declined.append(group)  # the model says they do not belong together
            continue
        for umbrella in part.umbrellas:
            umbrella, remark = _retitled(umbrella, notes)
            umbrellas.append(umbrella)
            remarks += [remark] if remark else []
        taken = {note_id for umbrella in part.umbrellas for note_id in umbrella.note_ids}
        if len(part.umbrellas) != 1 or not taken <= {note.id for note in free}:
            break
        free = [note for note in free if note.id not in taken]
    return Plan(
        umbrellas=tuple(umbrellas), text="\n".join(texts), usage=usage, remarks=tuple(remarks)
    )


def _retitled(umbrella: Umbrella, notes: Sequence[Note]) -> tuple[Umbrella, str | None]:
    """``umbrella`` with its title replaced by ``shared_title`` if it is unfit, and a remark."""
    by_id = {note.id: note for note in notes}
    if not all(note_id in by_id for note_id in umbrella.note_ids):
        return umbrella, None  # validate_plan says which note is missing
    members = [by_id[note_id] for note_id in umbrella.note_ids]
    others = [note for note in notes if note.id not in umbrella.note_ids]
    problems = title_problems(umbrella.title, members, others)
    title = shared_title(members) if problems else None
    if title is None:
        return umbrella, None  # fit, or nothing better: validate_plan judges it
    ids = " ".join(f"#{note_id}" for note_id in umbrella.note_ids)
    remark = (
        f"the model's title {umbrella.title!r} for {ids} is refused ({'; '.join(problems)}); "
        f"titled {title!r}, what all their titles share"
    )
    return dataclasses.replace(umbrella, title=title), remark


def _next_group(free: Sequence[Note], declined: Sequence[frozenset[int]]) -> frozenset[int] | None:
    """The best group of ``free`` notes that holds no two notes of a group the model declined.

    The model found that a declined group's notes are not about one thing:
    neither that group nor another that would bring two of its notes
    together again (a larger group, or one that swaps a note) is offered.
    """
    for group in related_groups(free):
        if not any(len(no & set(group)) >= 2 for no in declined):
            return frozenset(group)
    return None


def _ask(
    client: Chat,
    request: PlanRequest,
    notes: Sequence[Note],
    summarize: bool,
    model: str | None,
    params: dict[str, Any],
    on_token: Callable[[str], None] | None,
) -> Plan:
    """One request of ``make_plan``: the plan (or the defect) of one reply.

    The umbrellas' bodies are made of ``notes`` (all of the plan's notes: a
    reply that ignored the schema may name others than the group's).
    """
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "consolidation_plan", "strict": True, "schema": request.schema},
    }
    agent = AIAgent(
        client,
        model=model,
        system_prompt=SYSTEM_PROMPT + (SUMMARY_PROMPT if summarize else ""),
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
        plan = parse_plan(watcher.json_text, notes=notes, summarize=summarize)
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
    return dataclasses.replace(parse_plan(text, notes=notes, summarize=summarize), usage=usage)


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


def parse_plan(text: str, *, notes: Sequence[Note] = (), summarize: bool = False) -> Plan:
    """Read a plan from the model's JSON text; a ``Plan`` with a ``defect`` if it is not one.

    An umbrella names its notes by id, as ``"notes"`` (what the schema of
    ``plan_request`` asks) or ``"note_ids"``. Its body is made of ``notes``
    (``umbrella_body``: the notes' own text, in the order named; a note not
    among ``notes`` is left out, and ``validate_plan`` says it is missing).
    With ``summarize`` each umbrella must carry a ``"summary"``, which leads
    its body; without, a summary the model wrote anyway is not read. Checks
    the shape only (``validate_plan`` checks the content); keys the schema
    does not know are ignored. JSON nested too deeply to read is a defect
    like any other.
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
    by_id = {note.id: note for note in notes}
    umbrellas = []
    for i, item in enumerate(data["umbrellas"], start=1):
        if not isinstance(item, dict):
            return defect(f"umbrella {i} is not an object")
        title = item.get("title")
        key = "notes" if "notes" in item else "note_ids"
        ids = item.get(key)
        if not isinstance(title, str):
            return defect(f'umbrella {i}: "title" must be a string')
        summary = item.get("summary") if summarize else None
        if summarize and not isinstance(summary, str):
            return defect(f'umbrella {i}: "summary" must be a string')
        if not isinstance(ids, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in ids
        ):
            return defect(f'umbrella {i}: "{key}" must be an array of integers')
        members = [by_id[n] for n in ids if n in by_id]
        umbrellas.append(
            Umbrella(
                title=title,
                body=umbrella_body(members, summary),
                note_ids=tuple(ids),
                summary=summary,
            )
        )
    return Plan(umbrellas=tuple(umbrellas), text=text)


def validate_plan(plan: Plan, notes: Sequence[Note]) -> list[str]:
    """Every reason why ``plan`` cannot be applied to ``notes``; empty if it can.

    ``notes`` are the notes as read (all of them, any state). A plan is
    valid when it has no ``defect`` and every umbrella

    - merges two to ``UMBRELLA_MAX_NOTES`` distinct notes that exist and are
      active, in no other umbrella, and not every active one of
      ``MERGE_ALL_MIN_NOTES`` or more;
    - is about one thing: its notes share a content word, and one is in all
      their titles (else it joins two topics);
    - has a fit title (``title_problems``, the other notes as ``others``)
      that no other umbrella has;
    - has for body its notes' own text (``umbrella_body``), after its
      summary if it has one, and that summary is fit (``summary_problems``:
      it ends a sentence and says no number or name its notes do not).

    A plan with no umbrellas is valid: it changes nothing. Pure; call from
    anywhere.
    """
    if plan.defect is not None:
        return [plan.defect]
    by_id = {note.id: note for note in notes}
    active = {note.id for note in notes if note.state is NoteState.ACTIVE}
    owner: dict[int, int] = {}
    problems: list[str] = []
    titles: dict[str, int] = {}
    for i, umbrella in enumerate(plan.umbrellas, start=1):
        ids = set(umbrella.note_ids)
        members = [by_id[n] for n in umbrella.note_ids if n in by_id]
        whole = len(members) == len(umbrella.note_ids)
        others = [note for note in notes if note.id not in ids]
        fit = title_problems(umbrella.title, members if whole else [], others if whole else [])
        problems += [f"umbrella {i}: {why}" for why in fit]
        # A small model copies its first umbrella's title onto the next one.
        first = titles.setdefault(normal(umbrella.title), i)
        if first != i:
            problems.append(f"umbrella {i} has the title of umbrella {first}")
        grouped = len(problems)
        if len(ids) < 2:
            problems.append(f"umbrella {i} merges fewer than two notes")
        elif len(ids) > UMBRELLA_MAX_NOTES:
            problems.append(
                f"umbrella {i} merges {len(ids)} notes; an umbrella holds at most "
                f"{UMBRELLA_MAX_NOTES}"
            )
        elif len(active) >= MERGE_ALL_MIN_NOTES and active <= ids:
            problems.append(
                f"umbrella {i} merges every active note ({len(active)}): that groups nothing"
            )
        elif whole and not frozenset.intersection(*(subject_words(note) for note in members)):
            problems.append(f"umbrella {i}: its notes share no word")
        elif whole and not shared_title_words(members):
            problems.append(f"umbrella {i} joins two topics: no word is in all its notes' titles")
        sound = len(problems) == grouped and ids <= active and len(ids) == len(umbrella.note_ids)
        if sound:  # a group refused as such is not also refused for its text
            problems += _body_problems(i, umbrella, members)
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


def _body_problems(i: int, umbrella: Umbrella, members: Sequence[Note]) -> list[str]:
    """Why umbrella ``i``'s body (and summary) cannot be written over ``members``."""
    problems = []
    if umbrella.summary is not None:
        problems += [
            f"umbrella {i}: {why}"
            for why in summary_problems(umbrella.summary, umbrella.title, members)
        ]
    if umbrella.body != umbrella_body(members, umbrella.summary):
        what = "its summary, then " if umbrella.summary is not None else ""
        problems.append(f"umbrella {i}: its body is not {what}its notes' own text")
    else:
        try:
            check_body(umbrella.body)
        except ValueError as exc:
            problems.append(f"umbrella {i}: its body {exc}")
    return problems


def _prompt(listing: Sequence[Note]) -> str:
    """The notes as a compact list, each by its id, in ``listing``'s order.

    The body goes on its own indented line: on one line with the title, the
    model copied "title: body" into its umbrella titles.
    """
    lines = []
    for note in listing:
        body = " ".join(note.body.split())[:PROMPT_BODY_CHARS]
        title = " ".join(note.title.split())
        lines.append(f"#{note.id} {title}\n   {body}" if body else f"#{note.id} {title}")
    return "Notes:\n" + "\n".join(lines) + "\nAnswer:"
