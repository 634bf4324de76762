"""A consolidation plan that a small model cannot make destructive: schema, reading, checks.

Pure functions here (no provider, no store): the JSON schema the request
carries, how a reply is read, every kind of degenerate plan that
``validate_plan`` refuses with its reason, the prompt, and the table the
confirmation shows. The end-to-end runs through the console command are in
tests/test_curator.py.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from wirecut.memory import (
    MERGE_ALL_MIN_NOTES,
    PLAN_MAX_UMBRELLAS,
    Note,
    NoteState,
    Plan,
    Umbrella,
    parse_plan,
    plan_schema,
    plan_table,
    validate_plan,
)
from wirecut.memory._plan import EXAMPLE_PLAN, SYSTEM_PROMPT, _prompt

NOW = 1_700_000_000.0


def note(
    note_id: int, title: str = "", body: str = "", state: NoteState = NoteState.ACTIVE
) -> Note:
    return Note(
        id=note_id,
        title=title or f"Note {note_id}",
        body=body,
        state=state,
        created_at=NOW,
        last_used_at=NOW,
        state_changed_at=NOW,
    )


#: Six active notes: ids 1..6.
NOTES = [note(i) for i in range(1, 7)]


def plan(*umbrellas: tuple[str, str, tuple[int, ...]]) -> Plan:
    return Plan(umbrellas=tuple(Umbrella(t, s, ids) for t, s, ids in umbrellas))


def validate_against(schema: dict[str, Any], data: Any) -> bool:
    try:
        jsonschema.validate(data, schema)
    except jsonschema.ValidationError:
        return False
    return True


# -- the schema: what the grammar already forbids ------------------------------------


def test_the_schema_is_valid_and_allows_a_good_plan() -> None:
    schema = plan_schema([3, 1, 2, 4, 5, 6])
    jsonschema.Draft202012Validator.check_schema(schema)
    good = {"umbrellas": [{"note_ids": [1, 2], "title": "Lyon", "summary": "The Lyon trip."}]}
    assert validate_against(schema, good)
    assert validate_against(schema, {"umbrellas": []})


@pytest.mark.parametrize(
    ("umbrellas", "why"),
    [
        ([{"note_ids": [1, 99], "title": "Lyon", "summary": "The trip."}], "an unknown id"),
        ([{"note_ids": [1], "title": "Lyon", "summary": "The trip."}], "one note"),
        ([{"note_ids": [1, 1], "title": "Lyon", "summary": "The trip."}], "a repeated id"),
        ([{"note_ids": [1, 2, 3, 4, 5, 6], "title": "All", "summary": "Everything."}], "all"),
        ([{"note_ids": [1, 2], "title": "", "summary": "The trip."}], "an empty title"),
        ([{"note_ids": [1, 2], "title": "L" * 61, "summary": "The trip."}], "a long title"),
        ([{"note_ids": [1, 2], "title": "Lyon", "summary": "Trip"}], "a short summary"),
        ([{"note_ids": [1, 2], "title": "Lyon", "summary": "x" * 301}], "a long summary"),
        ([{"note_ids": [1, 2], "title": "Lyon", "summary": "The trip.", "x": 1}], "a new key"),
        ([{"note_ids": [1, 2], "title": "Lyon", "summary": "The trip."}] * 4, "too many"),
    ],
)
def test_the_schema_forbids(umbrellas: list[dict[str, Any]], why: str) -> None:
    assert not validate_against(plan_schema([1, 2, 3, 4, 5, 6]), {"umbrellas": umbrellas}), why


def test_the_schema_caps_the_umbrellas_and_allows_all_notes_only_in_a_small_store() -> None:
    many = plan_schema(list(range(1, 41)))["properties"]["umbrellas"]
    assert many["maxItems"] == PLAN_MAX_UMBRELLAS
    ids = many["items"]["properties"]["note_ids"]
    assert (ids["minItems"], ids["maxItems"], ids["uniqueItems"]) == (2, 39, True)
    small = plan_schema([1, 2, 3])["properties"]["umbrellas"]
    assert small["maxItems"] == 1
    assert small["items"]["properties"]["note_ids"]["maxItems"] == 3  # 3 < MERGE_ALL_MIN_NOTES
    assert MERGE_ALL_MIN_NOTES == 4


# -- what only validation can say -----------------------------------------------------


def test_a_plan_with_fit_text_over_distinct_active_notes_is_valid() -> None:
    assert validate_plan(plan(("Lyon", "Train and hotel for Lyon.", (1, 2))), NOTES) == []
    assert validate_plan(plan(("Lyon", "Train", (1, 2)), ("Bread", "Starter", (3, 4))), NOTES) == []


@pytest.mark.parametrize(
    ("degenerate", "problems"),
    [
        (
            plan(("...", "...", (1, 2))),
            [
                "umbrella 1: the title has no words ('...')",
                "umbrella 1: the summary has no words ('...')",
            ],
        ),
        (
            plan(("Lyon", "  \n\t ", (1, 2))),
            ["umbrella 1: the summary has no words"],
        ),
        (
            plan(("title", "summary", (1, 2))),
            [
                "umbrella 1: the title is a placeholder ('title')",
                "umbrella 1: the summary is a placeholder ('summary')",
            ],
        ),
        (plan(("TODO", "The trip.", (1, 2))), ["umbrella 1: the title is a placeholder ('TODO')"]),
        (plan(("Lyon", "T.B.D.", (1, 2))), ["umbrella 1: the summary is a placeholder ('T.B.D.')"]),
        (
            plan(("Lyon trip", "lyon TRIP!", (1, 2))),
            ["umbrella 1: the summary only repeats the title"],
        ),
        (
            plan(
                ("Rome trip", "Flight on Friday at 7:05 and two paid nights at Hotel Sole.", (1, 2))
            ),
            [
                "umbrella 1: the title is copied from the prompt's example",
                "umbrella 1: the summary is copied from the prompt's example",
            ],
        ),
        (
            plan(("Everything", "All my notes.", (1, 2, 3, 4, 5, 6))),
            ["umbrella 1 merges every active note (6): that groups nothing"],
        ),
        (
            plan(("Lyon", "The trip.", (1, 2)), ("Train", "The train.", (2, 3))),
            ["note #2 is in umbrellas 1 and 2"],
        ),
        (
            plan(("Lyon", "The trip.", (1, 1))),
            ["umbrella 1 merges fewer than two notes", "umbrella 1 names note #1 twice"],
        ),
        (plan(("Lyon", "The trip.", (1, 99))), ["umbrella 1: note #99 does not exist"]),
    ],
)
def test_a_degenerate_plan_is_refused_with_the_reason(
    degenerate: Plan, problems: list[str]
) -> None:
    assert validate_plan(degenerate, NOTES) == problems


def test_merging_every_note_of_a_small_store_is_allowed() -> None:
    three = NOTES[:3]
    assert len(three) < MERGE_ALL_MIN_NOTES
    assert validate_plan(plan(("All three", "One subject.", (1, 2, 3))), three) == []
    # Every *active* note counts: an archived one does not make the store large.
    four = [*three, note(9, state=NoteState.ARCHIVED)]
    assert validate_plan(plan(("All three", "One subject.", (1, 2, 3))), four) == []


# -- reading a reply -----------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"umbrellas": [' + "[" * 50_000 + "]" * 50_000 + "]}",
        '{"umbrellas": [{"title": "t", "summary": '
        + '{"a": ' * 50_000
        + "1"
        + "}" * 50_000
        + "}]}",
    ],
)
def test_deeply_nested_json_is_a_defect_not_a_crash(text: str) -> None:
    parsed = parse_plan(text)
    assert parsed.defect == "the reply is not a plan: its JSON is nested too deeply"
    assert validate_plan(parsed, NOTES) == [parsed.defect]


# -- the prompt ------------------------------------------------------------------------


def test_the_prompt_is_a_compact_numbered_list_after_a_worked_example() -> None:
    notes = [note(7, "Lyon trip", "Train at 9:12\n\n  on Friday"), note(12, "Passport", "")]
    assert _prompt(notes) == "Notes:\n7. Lyon trip: Train at 9:12 on Friday\n12. Passport\nAnswer:"
    assert SYSTEM_PROMPT.endswith("Answer:\n" + json.dumps(EXAMPLE_PLAN))
    example_ids = [i for u in EXAMPLE_PLAN["umbrellas"] for i in u["note_ids"]]  # type: ignore[index]
    assert len(example_ids) == len(set(example_ids))  # the example itself is a valid plan


# -- the table the confirmation shows ------------------------------------------------------


def test_the_plan_table_shows_title_first_summary_line_and_the_archived_titles() -> None:
    notes = [note(1, "Lyon trip"), note(2, "Train to Lyon"), note(3, "Bread"), note(4, "Starter")]
    table = plan_table(
        notes,
        plan(
            ("Lyon", "The train trip to Lyon.\nSeat 42.", (1, 2)),
            ("Baking", "A very long summary that goes on and on past the column", (3, 4)),
        ),
    )
    assert table == [
        "new note  summary                                       archives",
        "Lyon      The train trip to Lyon.                       #1 Lyon trip",
        "                                                        #2 Train to Lyon",
        "Baking    A very long summary that goes on and on pas…  #3 Bread",
        "                                                        #4 Starter",
    ]
    assert plan_table(notes, Plan()) == []
