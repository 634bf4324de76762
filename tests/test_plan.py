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
    Note,
    NoteState,
    Plan,
    Umbrella,
    parse_plan,
    plan_request,
    plan_schema,
    plan_table,
    related_groups,
    subject_words,
    validate_plan,
)

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

GROUPS = [(1, 2), (3, 4), (1, 2, 5)]


def umbrella(
    notes: list[int], title: str = "Lyon", summary: str = "The train trip to Lyon."
) -> dict[str, Any]:
    return {"notes": notes, "title": title, "summary": summary}


def test_the_schema_is_valid_and_allows_a_good_plan() -> None:
    schema = plan_schema(GROUPS, max_umbrellas=2)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert validate_against(schema, {"umbrellas": [umbrella([1, 2]), umbrella([3, 4], "Été")]})
    assert validate_against(schema, {"umbrellas": [umbrella([1, 2, 5])]})
    assert validate_against(schema, {"umbrellas": []})


@pytest.mark.parametrize(
    ("umbrellas", "why"),
    [
        ([umbrella([1, 3])], "a group that shares no word"),
        ([umbrella([2, 1])], "not in increasing order"),
        ([umbrella([1])], "one note"),
        ([umbrella([1, 1])], "a repeated note"),
        ([umbrella([1, 2], title="L" * 41)], "a long title"),
        ([umbrella([1, 2], title="Ly")], "a short title"),
        ([umbrella([1, 2], summary="The trip")], "a short summary"),
        ([umbrella([1, 2], summary="x" * 121)], "a long summary"),
        ([{**umbrella([1, 2]), "x": 1}], "a key of its own"),
        ([{"note_ids": [1, 2], "title": "Lyon", "summary": "The train trip."}], "another key"),
        ([umbrella([1, 2]), umbrella([3, 4]), umbrella([1, 2, 5])], "too many umbrellas"),
    ],
)
def test_the_schema_forbids(umbrellas: list[dict[str, Any]], why: str) -> None:
    schema = plan_schema(GROUPS, max_umbrellas=2)
    assert not validate_against(schema, {"umbrellas": umbrellas}), why


# -- the request: which groups are offered, how the notes are listed ---------------------


def test_only_notes_that_share_a_word_are_offered_together() -> None:
    notes = [
        note(1, "Guitar chords", "G, C, D"),
        note(2, "Lyon trip", "Train at 9:12"),
        note(3, "Tomato plants", "Six in May"),
        note(4, "Lyon hotel", "Two nights"),
        note(5, "Watering tomatoes", "Every evening"),
        note(6, "Train to Lyon", "Seat 42"),
    ]
    assert subject_words(notes[4]) == {"watering", "tomato", "every", "evening"}
    assert related_groups(notes) == [(2, 6), (2, 4), (2, 4, 6), (3, 5), (4, 6)]
    request = plan_request(notes)
    # The best disjoint pairs first (Lyon trip + Train to Lyon, the tomatoes), then the rest.
    assert [n.id for n in request.listing] == [2, 6, 3, 5, 1, 4]
    assert request.groups == ((1, 2), (1, 6), (1, 2, 6), (3, 4), (2, 6))
    assert request.prompt == (
        "Notes:\n1. Lyon trip\n   Train at 9:12\n2. Train to Lyon\n   Seat 42\n"
        "3. Tomato plants\n   Six in May\n4. Watering tomatoes\n   Every evening\n"
        "5. Guitar chords\n   G, C, D\n6. Lyon hotel\n   Two nights\nAnswer:"
    )
    umbrellas = request.schema["properties"]["umbrellas"]
    assert umbrellas["maxItems"] == 1  # one umbrella a request: see make_plan
    assert umbrellas["items"]["properties"]["notes"]["enum"] == [list(g) for g in request.groups]


def test_notes_that_share_no_word_make_no_request() -> None:
    request = plan_request([note(1, "Passport", "Expires 2031"), note(2, "Guitar", "G, C, D")])
    assert request.groups == ()


def test_a_reply_by_list_number_is_read_as_ids() -> None:
    listing = [note(7, "Lyon trip"), note(3, "Train to Lyon"), note(9, "Chess")]
    text = json.dumps({"umbrellas": [umbrella([1, 2])]})
    assert parse_plan(text, listing=listing).umbrellas == (
        Umbrella("Lyon", "The train trip to Lyon.", (7, 3)),
    )
    out_of_range = parse_plan(json.dumps({"umbrellas": [umbrella([1, 4])]}), listing=listing)
    assert out_of_range.defect == (
        "the reply is not a plan: umbrella 1: the notes are numbered 1 to 3"
    )


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
            plan(("Lyon trip", "Train and hotel.", (1, 2)), ("lyon TRIP", "Bread.", (3, 4))),
            ["umbrella 2 has the title of umbrella 1"],
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


def test_an_umbrella_over_notes_that_share_no_word_is_refused() -> None:
    notes = [*NOTES, note(7, "Passport", "Expires in 2031")]
    assert validate_plan(plan(("Mixed", "Two unrelated notes.", (1, 7))), notes) == [
        "umbrella 1: its notes share no word"
    ]
    # Three notes: all three must share one word.
    lyon = [note(1, "Lyon trip"), note(2, "Lyon hotel"), note(3, "Hotel bill")]
    assert validate_plan(plan(("Lyon", "Trip, hotel, bill.", (1, 2, 3))), lyon) == [
        "umbrella 1: its notes share no word"
    ]


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
