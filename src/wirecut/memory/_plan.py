"""The model's part of consolidation: ask for a plan of umbrella notes, read it, check it.

``make_plan`` is an ``AIAgent`` conversation that needs no store: it gets the
notes as read and returns a ``Plan``. It writes nothing and holds no
transaction, so a slow model locks nothing, and the same call can run
somewhere else (a cluster worker) while the store stays with the host.
``validate_plan`` checks a plan against the notes before anything is written.

The request carries ``response_format`` with a JSON schema (``plan_schema``):
llama.cpp turns it into a grammar, so even a tiny base model answers with
JSON of that shape, and only with note ids that exist. Such a model may pad
the JSON with whitespace until ``max_tokens`` (docs/architecture.md, fact 9): the request
always sets ``max_tokens``, and a reply cut short is never a plan.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from wirecut.agent import AIAgent, ConversationStatus
from wirecut.memory._notes import (
    TITLE_MAX_CHARS,
    Note,
    NoteState,
    Umbrella,
    check_body,
    check_title,
)
from wirecut.provider import ChatClient, Usage

__all__ = [
    "PLAN_MAX_TOKENS",
    "PROMPT_BODY_CHARS",
    "SUMMARY_MAX_CHARS",
    "Plan",
    "make_plan",
    "parse_plan",
    "plan_schema",
    "validate_plan",
]

#: ``max_tokens`` of the plan request unless the caller gives one.
PLAN_MAX_TOKENS = 512
#: How much of each note's body the model sees.
PROMPT_BODY_CHARS = 300
#: The longest umbrella summary the schema lets the model write.
SUMMARY_MAX_CHARS = 1000

SYSTEM_PROMPT = """\
You organise a person's notes. Find notes that are about the same subject and \
group each such set under one umbrella note: a short title and a summary of \
what the grouped notes say. Use only the note ids you are given. A note goes \
into at most one umbrella, and an umbrella groups at least two notes. Leave \
notes that fit nowhere out. Answer with JSON only, in this shape: \
{"umbrellas": [{"title": "...", "summary": "...", "note_ids": [1, 2]}]}. \
If nothing belongs together, answer {"umbrellas": []}."""


@dataclass(frozen=True)
class Plan:
    """A consolidation plan: the umbrella notes to create over existing notes.

    ``defect`` says why the model's reply is no plan at all (cut short, not
    JSON, not of the plan's shape, the provider failed); ``interrupted`` is
    True when a cancel cut the conversation. ``text`` is the reply as the
    model gave it and ``usage`` what the provider produced for it (also when
    it was cut). A plan built by hand only needs ``umbrellas``.
    """

    umbrellas: tuple[Umbrella, ...] = ()
    defect: str | None = None
    interrupted: bool = False
    text: str = ""
    usage: Usage = field(default_factory=Usage)


def plan_schema(note_ids: Sequence[int]) -> dict[str, Any]:
    """The JSON schema of a plan over ``note_ids``: the model can name no other note."""
    return {
        "type": "object",
        "properties": {
            "umbrellas": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "title": {"type": "string", "minLength": 1, "maxLength": TITLE_MAX_CHARS},
                        "summary": {"type": "string", "maxLength": SUMMARY_MAX_CHARS},
                        "note_ids": {
                            "type": "array",
                            "items": {"type": "integer", "enum": sorted(set(note_ids))},
                            "minItems": 2,
                        },
                    },
                    "required": ["title", "summary", "note_ids"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["umbrellas"],
        "additionalProperties": False,
    }


def make_plan(
    client: ChatClient,
    notes: Sequence[Note],
    *,
    model: str | None = None,
    max_tokens: int = PLAN_MAX_TOKENS,
    temperature: float | None = 0.0,
    on_token: Callable[[str], None] | None = None,
) -> Plan:
    """Ask the model for a plan of umbrella notes over ``notes``; return what it answered.

    Runs one ``AIAgent`` conversation in the calling thread, under the scope
    bound there (the host's). It reads and writes no store. ``on_token``
    gets the reply as it streams. Never raises for what the model or the
    provider did: a reply that is no plan is a ``Plan`` with a ``defect``.

    ``temperature`` defaults to 0: a plan wants no invention, and with the
    tiny local model the default sampling padded whitespace until
    ``max_tokens`` where greedy decoding closed the JSON (None: the
    provider's default).

    Cancellation: a cancel of the bound scope cuts the request (the provider
    sees the close) and returns at once a ``Plan`` with ``interrupted=True``,
    a ``defect``, and the usage of what was produced before the cut. The
    caller checks its scope after this returns.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, not {max_tokens!r}")
    params: dict[str, Any] = {
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "consolidation_plan",
                "strict": True,
                "schema": plan_schema([note.id for note in notes]),
            },
        },
        "max_tokens": max_tokens,
    }
    if temperature is not None:
        params["temperature"] = temperature
    agent = AIAgent(
        client,
        model=model,
        system_prompt=SYSTEM_PROMPT,
        max_iterations=1,
        **params,
    )
    result = agent.run_conversation(_prompt(notes), on_token=on_token)
    text, usage = result.final_text, result.usage
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
        return Plan(
            defect=f"the model's reply was cut short at max_tokens ({max_tokens})",
            text=text,
            usage=usage,
        )
    return dataclasses.replace(parse_plan(text), usage=usage)


def parse_plan(text: str) -> Plan:
    """Read a plan from the model's JSON text; a ``Plan`` with a ``defect`` if it is not one.

    Checks the shape only (``validate_plan`` checks the content); keys the
    schema does not know are ignored.
    """

    def defect(why: str) -> Plan:
        return Plan(defect=f"the reply is not a plan: {why}", text=text)

    try:
        data = json.loads(text)
    except ValueError as exc:
        return defect(f"not JSON ({exc})")
    if not isinstance(data, dict) or not isinstance(data.get("umbrellas"), list):
        return defect('it must be an object with an array "umbrellas"')
    umbrellas = []
    for i, item in enumerate(data["umbrellas"], start=1):
        if not isinstance(item, dict):
            return defect(f"umbrella {i} is not an object")
        title, summary, ids = item.get("title"), item.get("summary", ""), item.get("note_ids")
        if not isinstance(title, str):
            return defect(f'umbrella {i}: "title" must be a string')
        if not isinstance(summary, str):
            return defect(f'umbrella {i}: "summary" must be a string')
        if not isinstance(ids, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in ids
        ):
            return defect(f'umbrella {i}: "note_ids" must be an array of integers')
        umbrellas.append(Umbrella(title=title, body=summary, note_ids=tuple(ids)))
    return Plan(umbrellas=tuple(umbrellas), text=text)


def validate_plan(plan: Plan, notes: Sequence[Note]) -> list[str]:
    """Every reason why ``plan`` cannot be applied to ``notes``; empty if it can.

    ``notes`` are the notes as read (all of them, any state). A plan is
    valid when it has no ``defect``, every umbrella has a fit title and body
    and merges at least two distinct notes, every note it names exists and is
    active, and no note is in two umbrellas. A plan with no umbrellas is
    valid: it changes nothing. Pure; call from anywhere.
    """
    if plan.defect is not None:
        return [plan.defect]
    by_id = {note.id: note for note in notes}
    owner: dict[int, int] = {}
    problems: list[str] = []
    for i, umbrella in enumerate(plan.umbrellas, start=1):
        try:
            check_title(umbrella.title)
        except ValueError as exc:
            problems.append(f"umbrella {i}: the title {exc}")
        try:
            check_body(umbrella.body)
        except ValueError as exc:
            problems.append(f"umbrella {i}: the summary {exc}")
        if len(set(umbrella.note_ids)) < 2:
            problems.append(f"umbrella {i} merges fewer than two notes")
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


def _prompt(notes: Sequence[Note]) -> str:
    lines = [
        json.dumps(
            {"id": note.id, "title": note.title, "body": note.body[:PROMPT_BODY_CHARS]},
            ensure_ascii=False,
        )
        for note in notes
    ]
    return "The notes, one JSON object a line:\n" + "\n".join(lines)
