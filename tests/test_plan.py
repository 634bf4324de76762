"""A consolidation plan that writes only what the notes say: grouping, schema, reading, checks.

Pure functions here (no provider, no store): which notes may go together,
the JSON schema the request carries, how a reply is read, the umbrella's
body (its notes' own text), every kind of title and summary that
``validate_plan`` refuses with its reason, and the table the confirmation
shows. The end-to-end runs through the console command are in
tests/test_curator.py.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from wirecut.memory import (
    MERGE_ALL_MIN_NOTES,
    UMBRELLA_MAX_NOTES,
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
    summary_problems,
    title_problems,
    title_words,
    umbrella_body,
    validate_plan,
)
from wirecut.memory._umbrella_text import shared_title

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


#: Six active notes: ids 1..6, all titled "Note k" (their titles share "note").
NOTES = [note(i) for i in range(1, 7)]

#: Issue 37's store: three notes on a sourdough starter, three on a bike, two loners.
SOURDOUGH = [
    note(1, "Sourdough starter", "Feed it 50 g flour and 50 g water every 12 hours."),
    note(2, "Starter smells of acetone", "Feed the sourdough twice a day and keep it at 24 C."),
    note(3, "Reviving the starter", "After the fridge, discard half and feed it for 2 days."),
]
BIKE = [
    note(4, "Bike tyres", "Pump to 60 psi front and 65 psi rear; check every 200 km."),
    note(5, "Bike chain", "Clean and oil the chain every 300 km."),
    note(6, "Bike brakes", "New pads from Cycle Hub before the Alps ride in June."),
]
DENTIST = note(7, "Dentist appointment", "Dr Patel, Tuesday 14 May at 9:30.")
SHOPPING = note(8, "Shopping list", "Flour, eggs, milk and chain oil.")
ISSUE_STORE = [*SOURDOUGH, *BIKE, DENTIST, SHOPPING]


def over(
    notes: list[Note], title: str, ids: tuple[int, ...], summary: str | None = None
) -> Umbrella:
    """An umbrella over ``ids`` of ``notes`` with the body a plan must have."""
    by_id = {n.id: n for n in notes}
    members = [by_id[i] for i in ids if i in by_id]
    return Umbrella(title, umbrella_body(members, summary), ids, summary)


def plan(*umbrellas: Umbrella) -> Plan:
    return Plan(umbrellas=umbrellas)


def validate_against(schema: dict[str, Any], data: Any) -> bool:
    try:
        jsonschema.validate(data, schema)
    except jsonschema.ValidationError:
        return False
    return True


# -- which notes go together ------------------------------------------------------------


def test_notes_go_together_by_a_word_in_all_their_titles_and_a_topic_is_offered_whole() -> None:
    # The shopping list shares "flour" with a sourdough note and "chain" with
    # a bike note, but only in its body: it joins neither.
    assert related_groups(ISSUE_STORE) == [(4, 5, 6), (1, 2, 3)]


def test_words_shared_only_in_bodies_make_no_group() -> None:
    coffee = note(1, "Coffee machine", "Descale it every month.")
    seedlings = note(2, "Tomato seedlings", "Water them every morning in May.")
    assert subject_words(coffee) & subject_words(seedlings) == {"every"}
    assert related_groups([coffee, seedlings]) == []


def test_a_loner_that_shares_a_title_word_with_one_note_of_a_larger_group_is_left_alone() -> None:
    letter = note(9, "Chain letter", "Forward it to five friends.")
    groups = related_groups([*BIKE, letter])
    assert groups == [(4, 5, 6), (5, 9)]  # the bike first: the chain note goes with it


def test_a_topic_is_offered_whole_before_a_smaller_group_that_takes_one_of_its_notes() -> None:
    # "Sourdough" starts both titles of its pair, "starter" one of the three:
    # the larger group still goes first, or a starter note would be left out.
    bakery = note(9, "Sourdough bakery", "Open from 8 on Saturdays.")
    assert related_groups([*SOURDOUGH, bakery]) == [(1, 2, 3), (1, 9)]


def test_among_groups_of_one_size_the_word_that_starts_more_titles_goes_first() -> None:
    # "Tax receipts" could go with "Tax return" or with "Receipt printer":
    # "tax" starts both of its group's titles, "receipt" one of its group's.
    notes = [
        note(1, "Receipt printer", "Paper rolls of 57 mm."),
        note(2, "Tax receipts", "Keep them in the blue box."),
        note(3, "Tax return", "File it before May 31."),
    ]
    assert related_groups(notes) == [(2, 3), (1, 2)]


def test_plurals_match_and_stop_words_do_not() -> None:
    tomatoes = [note(1, "Tomato plants"), note(2, "Watering tomatoes"), note(3, "The plan")]
    assert title_words(tomatoes[1]) == {"watering", "tomato"}
    assert related_groups(tomatoes) == [(1, 2)]
    assert related_groups([note(1, "About the trip"), note(2, "About the house")]) == []


def test_a_word_in_more_titles_than_an_umbrella_holds_makes_several_groups() -> None:
    many = [note(i, f"Garden job {i}") for i in range(1, 13)]
    groups = related_groups(many)
    assert [len(g) for g in groups] == [UMBRELLA_MAX_NOTES, UMBRELLA_MAX_NOTES, 2]
    assert sorted(i for g in groups for i in g) == list(range(1, 13))


# -- the request: the group, listed by id, and its schema -------------------------------


def test_the_request_lists_the_notes_by_id_and_offers_the_whole_group() -> None:
    request = plan_request(BIKE)
    assert request.prompt == (
        "Notes:\n"
        "#4 Bike tyres\n   Pump to 60 psi front and 65 psi rear; check every 200 km.\n"
        "#5 Bike chain\n   Clean and oil the chain every 300 km.\n"
        "#6 Bike brakes\n   New pads from Cycle Hub before the Alps ride in June.\n"
        "Answer:"
    )
    # The whole group or none: offered its parts, a small model leaves notes out.
    assert request.groups == ((4, 5, 6),)
    items = request.schema["properties"]["umbrellas"]["items"]
    assert request.schema["properties"]["umbrellas"]["maxItems"] == 1
    assert items["properties"]["notes"]["enum"] == [[4, 5, 6]]
    assert items["required"] == ["notes", "title"]  # no summary unless asked for
    assert validate_against(request.schema, {"umbrellas": []})
    assert not validate_against(request.schema, {"umbrellas": [{"notes": [4, 5], "title": "Bike"}]})


def test_a_request_over_notes_whose_titles_share_no_word_offers_nothing() -> None:
    request = plan_request([note(1, "Lyon trip"), note(2, "Lyon hotel"), note(3, "Hotel bill")])
    assert request.groups == ()


def test_a_request_with_summarize_asks_for_a_summary() -> None:
    items = plan_request(BIKE, summarize=True).schema["properties"]["umbrellas"]["items"]
    assert items["required"] == ["notes", "title", "summary"]


def test_a_request_is_about_one_group() -> None:
    with pytest.raises(ValueError, match=f"at most {UMBRELLA_MAX_NOTES} notes"):
        plan_request([note(i, "Bike") for i in range(1, UMBRELLA_MAX_NOTES + 2)])


# -- the schema: what the grammar already forbids ------------------------------------

GROUPS = [(1, 2), (3, 4), (1, 2, 5)]


def umbrella(
    notes: list[int], title: str = "Lyon", summary: str = "The train trip to Lyon."
) -> dict[str, Any]:
    return {"notes": notes, "title": title, "summary": summary}


def test_the_schema_is_valid_and_allows_a_good_plan() -> None:
    schema = plan_schema(GROUPS, max_umbrellas=2, summarize=True)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert validate_against(schema, {"umbrellas": [umbrella([1, 2]), umbrella([3, 4], "Été")]})
    assert validate_against(schema, {"umbrellas": [umbrella([1, 2, 5])]})
    assert validate_against(schema, {"umbrellas": []})
    titled = plan_schema(GROUPS, max_umbrellas=2)
    assert validate_against(titled, {"umbrellas": [{"notes": [1, 2], "title": "Lyon"}]})


@pytest.mark.parametrize(
    ("umbrellas", "why"),
    [
        ([umbrella([1, 3])], "a group not offered"),
        ([umbrella([2, 1])], "not in increasing order"),
        ([umbrella([1])], "one note"),
        ([umbrella([1, 1])], "a repeated note"),
        ([umbrella([1, 2], title="L" * 41)], "a long title"),
        ([umbrella([1, 2], title="Ly")], "a short title"),
        ([umbrella([1, 2], summary="The trip")], "a short summary"),
        ([umbrella([1, 2], summary="x" * 161)], "a long summary"),
        ([{**umbrella([1, 2]), "x": 1}], "a key of its own"),
        ([{"note_ids": [1, 2], "title": "Lyon", "summary": "The train trip."}], "another key"),
        ([umbrella([1, 2]), umbrella([3, 4]), umbrella([1, 2, 5])], "too many umbrellas"),
    ],
)
def test_the_schema_forbids(umbrellas: list[dict[str, Any]], why: str) -> None:
    schema = plan_schema(GROUPS, max_umbrellas=2, summarize=True)
    assert not validate_against(schema, {"umbrellas": umbrellas}), why


def test_the_schema_without_summarize_forbids_a_summary() -> None:
    schema = plan_schema(GROUPS, max_umbrellas=2)
    assert not validate_against(schema, {"umbrellas": [umbrella([1, 2])]})


# -- reading a reply -----------------------------------------------------------------


def test_a_reply_names_notes_by_id_and_each_umbrella_holds_their_own_text() -> None:
    text = json.dumps({"umbrellas": [{"notes": [4, 5, 6], "title": "Bike upkeep"}]})
    (read,) = parse_plan(text, notes=ISSUE_STORE).umbrellas
    assert read == Umbrella(
        "Bike upkeep",
        "Bike tyres\nPump to 60 psi front and 65 psi rear; check every 200 km.\n\n"
        "Bike chain\nClean and oil the chain every 300 km.\n\n"
        "Bike brakes\nNew pads from Cycle Hub before the Alps ride in June.",
        (4, 5, 6),
    )
    by_note_ids = json.dumps({"umbrellas": [{"note_ids": [4, 5, 6], "title": "Bike upkeep"}]})
    assert parse_plan(by_note_ids, notes=ISSUE_STORE).umbrellas == (read,)


def test_a_summary_is_read_only_when_asked_for_and_leads_the_notes_text() -> None:
    reply = {"notes": [1, 2], "title": "Starter care", "summary": "Feed the starter."}
    text = json.dumps({"umbrellas": [reply]})
    (plain,) = parse_plan(text, notes=SOURDOUGH).umbrellas
    assert plain.summary is None
    assert plain.body == umbrella_body(SOURDOUGH[:2])
    (summed,) = parse_plan(text, notes=SOURDOUGH, summarize=True).umbrellas
    assert summed.summary == "Feed the starter."
    assert summed.body == "Feed the starter.\n\n" + umbrella_body(SOURDOUGH[:2])
    missing = json.dumps({"umbrellas": [{"notes": [1, 2], "title": "Starter care"}]})
    assert parse_plan(missing, notes=SOURDOUGH, summarize=True).defect == (
        'the reply is not a plan: umbrella 1: "summary" must be a string'
    )


def test_an_umbrella_body_keeps_each_note_verbatim() -> None:
    notes = [note(1, "Lyon trip", "Train at 9:12\n\n  Seat 42  \n"), note(2, "Lyon hotel", "")]
    assert umbrella_body(notes) == "Lyon trip\nTrain at 9:12\n\n  Seat 42\n\nLyon hotel"
    assert umbrella_body(notes, " The trip. ") == "The trip.\n\n" + umbrella_body(notes)


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


# -- titles ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("title", "members", "problems"),
    [
        ("Bike upkeep", BIKE, []),
        ("Bike", BIKE, []),
        ("Starter care", SOURDOUGH, []),
        ("Lyon", [note(1, "Lyon"), note(2, "Lyon hotel")], []),  # all that the titles share
        (
            "Sourdough Sourdough Sourdough Sourdough",
            SOURDOUGH,
            # And note #3 does not say "sourdough".
            ["the title repeats 'Sourdough'", "the title names no word that all its notes hold"],
        ),
        ("Bike bikes", BIKE, ["the title repeats 'Bike'"]),
        ("Bike tyres", BIKE, ["the title is the title of note #4 alone, not of all 3"]),
        ("bike TYRES!", BIKE, ["the title is the title of note #4 alone, not of all 3"]),
        ("The Bike, tyres", BIKE, ["the title is the title of note #4 alone, not of all 3"]),
        ("Trips, part 12", [note(1, "Trips, part 3"), note(2, "Trip 9 train")], []),
        ("Cycling maintenance", BIKE, ["the title names no word that all its notes hold"]),
        ("Bike upkeep", BIKE[1:], []),  # a word no note holds
        ("Dentist bike", BIKE, []),  # a word of another title: not that note's title
        (
            "Bike tyres",  # over the chain and the brakes: the tyres are another note's
            BIKE[1:],
            ["the title is the title of note #4, which it does not merge"],
        ),
        ("...", BIKE, ["the title has no words ('...')"]),
        ("TODO", BIKE, ["the title is a placeholder ('TODO')"]),
        ("a\nb", BIKE, ["the title must be one line"]),
    ],
)
def test_a_title_must_name_what_all_its_notes_share(
    title: str, members: list[Note], problems: list[str]
) -> None:
    others = [n for n in ISSUE_STORE if n not in members]
    assert title_problems(title, members, others) == problems


def test_the_shared_title_is_what_all_titles_share_as_the_first_spells_it() -> None:
    assert shared_title(BIKE) == "Bike"
    assert shared_title([note(1, "Book club"), note(2, "Book club list")]) == "Book club"
    assert shared_title([note(1, "my tomatoes"), note(2, "Tomato plants")]) == "Tomatoes"
    assert shared_title([note(1, "Note 1"), note(2, "Note 2")]) is None  # a placeholder
    assert shared_title([DENTIST, SHOPPING]) is None


# -- summaries ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("summary", "problems"),
    [
        ("Pump the tyres to 60 psi and oil the chain every 300 km.", []),
        ("New pads from Cycle Hub before the Alps ride.", []),
        ("I check the tyres every 200 km.", []),  # "I" is no name
        ('Clean the chain, "every 300 km."', []),
        ("Halfords sells pads.", []),  # a name that starts a sentence is not caught
        (
            "Bike tyres are a crucial component of the bike's design, providing a lightweight "
            "yet powerful alternative to traditional",
            ["the summary ends mid-sentence ('…powerful alternative to traditional')"],
        ),
        ("Bike care. It is ", ["the summary ends mid-sentence ('…Bike care. It is')"]),
        ("Pump the tyres to 80 psi.", ["the summary says '80', which none of its notes says"]),
        (
            "Get pads at Halfords and from the Cycle Hub shop.",
            ["the summary says 'Halfords', which none of its notes says"],
        ),
        ("Service it with the RAC.", ["the summary says 'RAC', which none of its notes says"]),
        ("Bike tyres", ["the summary only repeats the title"]),
        ("TBD", ["the summary is a placeholder ('TBD')"]),
    ],
)
def test_a_summary_must_end_a_sentence_and_say_no_number_or_name_its_notes_do_not(
    summary: str, problems: list[str]
) -> None:
    assert summary_problems(summary, "Bike tyres", BIKE) == problems


# -- what only validation can say -----------------------------------------------------


def test_a_plan_of_fit_titles_over_its_notes_own_text_is_valid() -> None:
    fit = plan(over(ISSUE_STORE, "Starter care", (1, 2, 3)), over(ISSUE_STORE, "Bike", (4, 5, 6)))
    assert validate_plan(fit, ISSUE_STORE) == []
    summed = over(BIKE, "Bike", (4, 5), "Pump to 60 psi; oil the chain every 300 km.")
    assert validate_plan(plan(summed), ISSUE_STORE) == []


@pytest.mark.parametrize(
    ("degenerate", "problems"),
    [
        (
            plan(over(NOTES, "...", (1, 2))),
            ["umbrella 1: the title has no words ('...')"],
        ),
        (
            plan(over(NOTES, "title", (1, 2))),
            ["umbrella 1: the title is a placeholder ('title')"],
        ),
        (plan(over(NOTES, "TODO", (1, 2))), ["umbrella 1: the title is a placeholder ('TODO')"]),
        (
            plan(over(NOTES, "Notes A", (1, 2), "Notes, a!")),
            ["umbrella 1: the summary only repeats the title"],
        ),
        (
            plan(over(NOTES, "Notes A", (1, 2)), over(NOTES, "notes a!", (3, 4))),
            ["umbrella 2 has the title of umbrella 1"],
        ),
        (
            plan(over(NOTES, "Notes A", (1, 2)), over(NOTES, "Notes B", (2, 3))),
            ["note #2 is in umbrellas 1 and 2"],
        ),
        (
            plan(over(NOTES, "Notes A", (1, 1))),
            ["umbrella 1 merges fewer than two notes", "umbrella 1 names note #1 twice"],
        ),
        (
            plan(over(NOTES, "Notes A", (1, 99))),
            ["umbrella 1: note #99 does not exist"],
        ),
        (
            plan(Umbrella("Notes A", "What the notes say, in other words.", (1, 2))),
            ["umbrella 1: its body is not its notes' own text"],
        ),
        (
            plan(Umbrella("Notes A", umbrella_body(NOTES[:2]), (1, 2), "A summary, kept out.")),
            ["umbrella 1: its body is not its summary, then its notes' own text"],
        ),
        (
            plan(over(NOTES, "All notes", (1, 2, 3, 4, 5, 6))),
            [f"umbrella 1 merges 6 notes; an umbrella holds at most {UMBRELLA_MAX_NOTES}"],
        ),
    ],
)
def test_a_degenerate_plan_is_refused_with_the_reason(
    degenerate: Plan, problems: list[str]
) -> None:
    assert validate_plan(degenerate, NOTES) == problems


def test_issue_37s_plan_is_refused_for_each_of_its_faults() -> None:
    cut = (
        "Bike tyres are a crucial component of the bike's design, providing a lightweight "
        "yet powerful alternative to traditional"
    )
    issue = plan(
        over(ISSUE_STORE, "Sourdough Sourdough Sourdough Sourdough", (1, 2)),
        over(ISSUE_STORE, "Bike tyres", (4, 5, 6), cut),
    )
    assert validate_plan(issue, ISSUE_STORE) == [
        "umbrella 1: the title repeats 'Sourdough'",
        "umbrella 2: the title is the title of note #4 alone, not of all 3",
        "umbrella 2: the summary ends mid-sentence ('…powerful alternative to traditional')",
    ]


def test_an_umbrella_over_notes_that_share_no_word_or_no_title_word_is_refused() -> None:
    passport = note(7, "Passport", "Expires in 2031")
    assert validate_plan(plan(over([*NOTES, passport], "Note", (1, 7))), [*NOTES, passport]) == [
        "umbrella 1: the title is a placeholder ('Note')",
        "umbrella 1: its notes share no word",
    ]
    # Coffee and tomatoes: "every" in both bodies, no word in both titles.
    coffee = note(1, "Coffee machine", "Descale it every month.")
    seedlings = note(2, "Tomato seedlings", "Water them every morning.")
    both = [coffee, seedlings]
    assert validate_plan(plan(over(both, "Every day", (1, 2))), both) == [
        "umbrella 1 joins two topics: no word is in all its notes' titles"
    ]


def test_merging_every_note_of_a_small_store_is_allowed_and_of_a_larger_one_is_not() -> None:
    three = NOTES[:3]
    assert len(three) < MERGE_ALL_MIN_NOTES
    assert validate_plan(plan(over(three, "All notes", (1, 2, 3))), three) == []
    # Every *active* note counts: an archived one does not make the store large.
    four = [*three, note(9, state=NoteState.ARCHIVED)]
    assert validate_plan(plan(over(four, "All notes", (1, 2, 3))), four) == []
    five = NOTES[:5]
    assert validate_plan(plan(over(five, "All notes", (1, 2, 3, 4, 5))), five) == [
        "umbrella 1 merges every active note (5): that groups nothing"
    ]


# -- the table the confirmation shows ------------------------------------------------------


def test_the_plan_table_shows_each_title_and_the_notes_it_archives_by_id() -> None:
    table = plan_table(
        ISSUE_STORE,
        plan(over(ISSUE_STORE, "Starter care", (1, 2, 3)), over(ISSUE_STORE, "Bike", (4, 5))),
    )
    assert table == [
        "new note      archives",
        "Starter care  #1 Sourdough starter",
        "              #2 Starter smells of acetone",
        "              #3 Reviving the starter",
        "Bike          #4 Bike tyres",
        "              #5 Bike chain",
    ]
    assert plan_table(ISSUE_STORE, Plan()) == []


def test_the_plan_table_shows_summaries_when_the_plan_has_them() -> None:
    long = "A very long summary that goes on and on past the column, for sure."
    table = plan_table(
        ISSUE_STORE,
        plan(
            over(ISSUE_STORE, "Bike", (4, 5), "Pump the tyres.\nOil the chain."),
            over(ISSUE_STORE, "Starter care", (1, 2), long),
        ),
    )
    assert table == [
        "new note      summary                                       archives",
        "Bike          Pump the tyres.                               #4 Bike tyres",
        "                                                            #5 Bike chain",
        "Starter care  A very long summary that goes on and on pas…  #1 Sourdough starter",
        "                                                            #2 Starter smells of acetone",
    ]
