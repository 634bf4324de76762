"""The curator: the sweep, the plan (make, validate, apply), whole runs, and ``curator ...``.

Consolidation runs against the simulator, scripted to answer with a JSON
plan, on a pool thread under a real ``InterruptScope`` (``scope.run``), the
way the console runner runs a command. "The store is unchanged" is always
``dump()`` (``iterdump``) before and after.
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

import wirecut.scope as ws
from _support import BOUND
from wirecut.console.commands import CommandContext, CommandError, Services, Session, UsageError
from wirecut.console.commands._memory import curator_run, curator_status
from wirecut.local import LocalServer, is_available
from wirecut.memory import (
    PLAN_MAX_TOKENS,
    WHITESPACE_RUN_CUT,
    ConflictError,
    CuratorOutcome,
    Note,
    NoteState,
    NoteStore,
    Plan,
    PlanError,
    SweepPlan,
    Umbrella,
    apply_plan,
    curate,
    make_plan,
    parse_plan,
    plan_schema,
    plan_sweep,
    sweep,
    umbrella_body,
    validate_plan,
)
from wirecut.provider import ChatClient, Usage
from wirecut.scope import Interrupted, InterruptScope
from wirecut.simulator import ScriptedReply, SimConfig, SimulatorServer

LOCAL_BOUND = 120.0  # seconds for the real tiny model's plan, on a loaded machine
DAY = 86_400.0
NOW = 1_700_000_000.0


# -- the store the tests start from -----------------------------------------------------


@dataclass(frozen=True)
class Seeded:
    """The ids of the seeded notes. At ``now`` a sweep archives ``ancient`` (stale for 70
    days) and marks ``old`` stale (unused for 40 days); ``lyon``, ``train`` and ``paris``
    stay active and are what the model is asked about."""

    ancient: int
    lyon: int
    train: int
    paris: int
    old: int


def seed(store: NoteStore, now: float) -> Seeded:
    ancient = store.add("Ancient", "to be archived", now=now - 100 * DAY).id
    sweep(store, now=now - 70 * DAY)  # ancient: stale since 70 days before now
    return Seeded(
        ancient=ancient,
        lyon=store.add("Lyon trip", "Train at 9:12", now=now - DAY).id,
        train=store.add("Train to Lyon", "Seat 42, coach 7", now=now - 2 * DAY).id,
        paris=store.add("Paris", "Museum on Sunday", now=now - DAY).id,
        old=store.add("Old recipe", "Flour and water", now=now - 40 * DAY).id,
    )


def plan_reply(*umbrellas: tuple[str, str, list[int]]) -> dict[str, Any]:
    """The assistant message of a model answering with a plan (spaces make many tokens).

    Each umbrella as a provider that ignores the schema writes it: ``note_ids``
    and a summary that was not asked for (and is not read).
    """
    plan = {"umbrellas": [{"title": t, "summary": s, "note_ids": ids} for t, s, ids in umbrellas]}
    return {"content": json.dumps(plan)}


def lyon_plan(ids: Seeded) -> dict[str, Any]:
    return plan_reply(("Lyon", "The train trip to Lyon.", [ids.lyon, ids.train]))


#: The body of the Lyon umbrella: its two notes' own text.
LYON_BODY = "Lyon trip\nTrain at 9:12\n\nTrain to Lyon\nSeat 42, coach 7"


def token_count(reply: Mapping[str, Any]) -> int:
    return sum(1 for _ in ScriptedReply.from_json(reply, "count").pieces())


# -- the provider -----------------------------------------------------------------------


class Provider:
    """A simulator whose reply the test scripts; it records every request body."""

    def __init__(self) -> None:
        self.reply: Callable[[dict[str, Any]], Mapping[str, Any] | None] = lambda body: None
        self.bodies: list[dict[str, Any]] = []
        config = SimConfig(slots=4, tokens_per_second=400, prompt_ms=2)
        self.server = SimulatorServer(config, responder=self._respond)

    def _respond(self, body: dict[str, Any]) -> Mapping[str, Any] | None:
        self.bodies.append(body)
        return self.reply(body)

    def wait_all_ended(self) -> None:
        """Every request so far reached its end (finished, or the provider saw the close)."""
        for summary in self.server.requests():
            self.server.wait_for(
                lambda ev, rid=summary.id: (
                    ev.request_id == rid and ev.kind in ("request_finished", "peer_closed")
                ),
                timeout=BOUND,
            )


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    p = Provider()
    with p.server:
        yield p


@pytest.fixture
def sim(provider: Provider) -> Iterator[Provider]:
    """The module's provider, reset for one test."""
    provider.wait_all_ended()
    provider.server.reset()
    provider.bodies.clear()
    provider.reply = lambda body: None
    yield provider
    provider.wait_all_ended()


@pytest.fixture
def client(provider: Provider) -> Iterator[ChatClient]:
    with ChatClient(provider.server.base_url, model="sim") as c:
        yield c


@pytest.fixture
def store(tmp_path: Path) -> NoteStore:
    return NoteStore.in_data_dir(tmp_path)


def in_host(
    fn: Callable[..., Any], *args: Any, scope: InterruptScope | None = None, **kwargs: Any
) -> Any:
    """Run ``fn`` as the runner runs a command: a pool thread, ``scope.run``; return its result."""
    scope = scope or InterruptScope("command")
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(scope.run, fn, *args, **kwargs).result(BOUND)


# -- the sweep --------------------------------------------------------------------------


def note(note_id: int, state: NoteState, last_used_days: float, changed_days: float) -> Note:
    return Note(
        id=note_id,
        title=f"Lyon note {note_id}",  # notes that share a word
        body="",
        state=state,
        created_at=NOW - 400 * DAY,
        last_used_at=NOW - last_used_days * DAY,
        state_changed_at=NOW - changed_days * DAY,
    )


def test_plan_sweep_marks_long_unused_notes_stale_and_archives_long_stale_ones() -> None:
    notes = [
        note(1, NoteState.ACTIVE, 29.9, 100),  # used recently enough: stays
        note(2, NoteState.ACTIVE, 30, 100),  # unused for exactly 30 days: stale
        note(3, NoteState.STALE, 300, 59.9),  # stale, not long enough: stays
        note(4, NoteState.STALE, 300, 60),  # stale for 60 days: archived
        note(5, NoteState.ARCHIVED, 900, 900),  # archived: never touched again
    ]
    assert plan_sweep(notes, now=NOW) == SweepPlan(stale=(2,), archive=(4,))
    custom = plan_sweep(notes, now=NOW, stale_after=timedelta(days=1), archive_after=timedelta(1))
    assert custom == SweepPlan(stale=(1, 2), archive=(3, 4))


def test_plan_sweep_refuses_a_threshold_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="stale_after must be a positive duration"):
        plan_sweep([], now=NOW, stale_after=timedelta(0))


def test_sweep_writes_the_sweep_and_dry_run_writes_nothing(store: NoteStore) -> None:
    ids = seed(store, NOW)
    before = store.dump()
    planned = sweep(store, now=NOW, dry_run=True)
    assert planned == SweepPlan(stale=(ids.old,), archive=(ids.ancient,))
    assert store.dump() == before
    assert sweep(store, now=NOW) == planned
    states = {n.id: n.state for n in store.notes()}
    assert states[ids.old] is NoteState.STALE
    assert states[ids.ancient] is NoteState.ARCHIVED
    assert sweep(store, now=NOW) == SweepPlan()  # one step per sweep: nothing more today


# -- validating a plan ------------------------------------------------------------------

NOTES = [
    note(1, NoteState.ACTIVE, 1, 1),
    note(2, NoteState.ACTIVE, 1, 1),
    note(3, NoteState.ACTIVE, 1, 1),
    note(4, NoteState.STALE, 50, 10),
    note(5, NoteState.ARCHIVED, 90, 90),
]


def umbrellas(*specs: tuple[str, tuple[int, ...]]) -> Plan:
    """Umbrellas titled ``t`` over ``ids`` of ``NOTES``, each holding its notes' own text."""
    by_id = {n.id: n for n in NOTES}
    return Plan(
        umbrellas=tuple(
            Umbrella(t, umbrella_body([by_id[i] for i in ids if i in by_id]), ids)
            for t, ids in specs
        )
    )


def test_a_plan_over_distinct_active_notes_is_valid() -> None:
    assert validate_plan(umbrellas(("Lyon notes", (1, 2))), NOTES) == []
    assert validate_plan(Plan(), NOTES) == []  # nothing to merge is a valid plan


@pytest.mark.parametrize(
    ("plan", "problems"),
    [
        (umbrellas(("Lyon A", (1, 99))), ["umbrella 1: note #99 does not exist"]),
        (umbrellas(("Lyon A", (1, 4))), ["umbrella 1: note #4 is stale, not active"]),
        (umbrellas(("Lyon A", (1, 5))), ["umbrella 1: note #5 is archived, not active"]),
        (
            umbrellas(("Lyon A", (1, 2)), ("Lyon B", (2, 3))),
            ["note #2 is in umbrellas 1 and 2"],
        ),
        (umbrellas(("Lyon A", (1,))), ["umbrella 1 merges fewer than two notes"]),
        (
            umbrellas(("Lyon A", (1, 1))),
            ["umbrella 1 merges fewer than two notes", "umbrella 1 names note #1 twice"],
        ),
        (umbrellas(("", (1, 2))), ["umbrella 1: the title must not be empty"]),
        (umbrellas((" ", (1, 2))), ["umbrella 1: the title must not be empty"]),
        (umbrellas(("a\nb", (1, 2))), ["umbrella 1: the title must be one line"]),
        (Plan(defect="the reply was cut short"), ["the reply was cut short"]),
    ],
)
def test_an_invalid_plan_says_why(plan: Plan, problems: list[str]) -> None:
    assert validate_plan(plan, NOTES) == problems


@pytest.mark.parametrize(
    ("text", "defect"),
    [
        ("{", "not JSON"),
        ("[]", 'an array "umbrellas"'),
        ('{"umbrellas": {}}', 'an array "umbrellas"'),
        ('{"umbrellas": [1]}', "umbrella 1 is not an object"),
        ('{"umbrellas": [{"note_ids": [1, 2]}]}', '"title" must be a string'),
        ('{"umbrellas": [{"title": "t", "note_ids": 3}]}', '"note_ids" must be an array'),
        ('{"umbrellas": [{"title": "t", "note_ids": [1, "2"]}]}', "array of integers"),
        ('{"umbrellas": [{"title": "t", "note_ids": [true, 2]}]}', "array of integers"),
    ],
)
def test_a_reply_that_is_not_a_plan_has_a_defect(text: str, defect: str) -> None:
    plan = parse_plan(text)
    assert plan.defect is not None
    assert defect in plan.defect
    assert plan.umbrellas == ()


# -- asking the model -------------------------------------------------------------------


def test_make_plan_asks_with_a_json_schema_and_max_tokens_and_reads_the_plan(
    sim: Provider, client: ChatClient, store: NoteStore
) -> None:
    ids = seed(store, NOW)
    candidates = [n for n in store.notes() if n.id in (ids.lyon, ids.train, ids.paris)]
    # As the grammar asks: notes by id, and a title (no summary unless asked for).
    umbrella = {"notes": [ids.lyon, ids.train], "title": "Lyon travel"}
    reply = {"content": json.dumps({"umbrellas": [umbrella]})}
    sim.reply = lambda body: reply
    tokens: list[str] = []
    plan = in_host(make_plan, client, candidates, on_token=tokens.append)

    assert plan.defect is None
    # The umbrella holds its notes' own text: nothing the model wrote but the title.
    assert plan.umbrellas == (Umbrella("Lyon travel", LYON_BODY, (ids.lyon, ids.train)),)
    assert plan.remarks == ()
    assert "".join(tokens) == reply["content"] == plan.text
    assert (plan.usage.requests, plan.usage.completion_tokens) == (1, token_count(reply))

    (body,) = sim.bodies
    assert body["max_tokens"] == PLAN_MAX_TOKENS
    assert body["temperature"] == 0
    assert body["frequency_penalty"] == 0
    assert "summary" not in body["messages"][0]["content"]
    # Only the group asked about, by the ids the confirmation shows: Paris
    # shares no title word with them, and is not sent.
    assert body["messages"][-1]["content"] == (
        f"Notes:\n#{ids.lyon} Lyon trip\n   Train at 9:12\n"
        f"#{ids.train} Train to Lyon\n   Seat 42, coach 7\nAnswer:"
    )
    assert body["response_format"]["type"] == "json_schema"
    schema = body["response_format"]["json_schema"]["schema"]
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(json.loads(reply["content"]), schema)
    offered = schema["properties"]["umbrellas"]["items"]["properties"]["notes"]["enum"]
    assert offered == [[ids.lyon, ids.train]]
    with pytest.raises(jsonschema.ValidationError):  # the grammar offers Paris to no umbrella
        jsonschema.validate({"umbrellas": [{**umbrella, "notes": [ids.lyon, ids.paris]}]}, schema)
    with pytest.raises(jsonschema.ValidationError):  # nor a summary that was not asked for
        jsonschema.validate({"umbrellas": [{**umbrella, "summary": "The trip to Lyon."}]}, schema)


def test_make_plan_with_summarize_asks_for_a_summary_and_puts_it_above_the_notes_text(
    sim: Provider, client: ChatClient, store: NoteStore
) -> None:
    ids = seed(store, NOW)
    umbrella = {"notes": [ids.lyon, ids.train], "title": "Lyon", "summary": "Seat 42 at 9:12."}
    sim.reply = lambda body: {"content": json.dumps({"umbrellas": [umbrella]})}
    plan = in_host(make_plan, client, store.notes(), summarize=True)
    assert plan.umbrellas == (
        Umbrella(
            "Lyon", "Seat 42 at 9:12.\n\n" + LYON_BODY, (ids.lyon, ids.train), umbrella["summary"]
        ),
    )
    assert validate_plan(plan, store.notes()) == []
    (body,) = sim.bodies
    assert "summary" in body["messages"][0]["content"]
    items = body["response_format"]["json_schema"]["schema"]["properties"]["umbrellas"]["items"]
    assert items["required"] == ["notes", "title", "summary"]


def test_a_reply_whose_json_closed_on_the_last_token_max_tokens_allowed_is_the_plan(
    sim: Provider, client: ChatClient, store: NoteStore
) -> None:
    # The JSON closed: the plan is whole, whether the provider then reports
    # "length" or the watcher cut the request first (a race, decided either way
    # the same).
    ids = seed(store, NOW)
    reply = lyon_plan(ids)
    sim.reply = lambda body: reply
    for _ in range(5):
        plan = in_host(make_plan, client, store.notes(), max_tokens=token_count(reply))
        assert plan.defect is None
        assert plan.umbrellas == (Umbrella("Lyon", LYON_BODY, (ids.lyon, ids.train)),)
        assert validate_plan(plan, store.notes()) == []


def test_a_reply_cut_at_max_tokens_before_its_json_closed_is_no_plan(
    sim: Provider, client: ChatClient, store: NoteStore
) -> None:
    ids = seed(store, NOW)
    reply = lyon_plan(ids)
    sim.reply = lambda body: reply
    cut = token_count(reply) - 1  # all but the last token, which closes the JSON
    plan = in_host(make_plan, client, store.notes(), max_tokens=cut)
    assert plan.defect == f"the model's reply was cut short at max_tokens ({cut})"
    assert reply["content"].startswith(plan.text)
    assert plan.text.endswith("[2, ")
    assert validate_plan(plan, store.notes()) == [plan.defect]
    assert plan.umbrellas == ()


def test_a_provider_failure_is_no_plan(store: NoteStore) -> None:
    seed(store, NOW)
    with ChatClient("http://127.0.0.1:9/v1", max_retries=0) as dead:
        plan = in_host(make_plan, dead, store.notes())
    assert plan.defect is not None
    assert plan.defect.startswith("the provider failed: cannot connect")


# -- applying a plan --------------------------------------------------------------------


def test_apply_plan_writes_the_sweep_and_the_umbrellas(store: NoteStore) -> None:
    ids = seed(store, NOW)
    snapshot = store.notes()
    swept = plan_sweep(snapshot, now=NOW)
    plan = parse_plan(lyon_plan(ids)["content"], notes=snapshot)
    (umbrella,) = apply_plan(store, plan, snapshot, sweep=swept, now=NOW)

    assert (umbrella.title, umbrella.body, umbrella.state) == ("Lyon", LYON_BODY, NoteState.ACTIVE)
    assert [n.id for n in store.merged_into(umbrella.id)] == [ids.lyon, ids.train]
    after = {n.id: n for n in store.notes()}
    for merged in (ids.lyon, ids.train):
        assert (after[merged].state, after[merged].umbrella_id) == (NoteState.ARCHIVED, umbrella.id)
        assert after[merged].title == next(n.title for n in snapshot if n.id == merged)
    assert after[ids.old].state is NoteState.STALE
    assert after[ids.ancient].state is NoteState.ARCHIVED
    assert after[ids.paris] == next(n for n in snapshot if n.id == ids.paris)


@pytest.mark.parametrize("changed", ["merged note used", "merged note gone", "swept note used"])
def test_apply_plan_writes_nothing_when_a_note_changed_since_it_was_read(
    store: NoteStore, changed: str
) -> None:
    ids = seed(store, NOW)
    snapshot = store.notes()
    swept = plan_sweep(snapshot, now=NOW)
    plan = parse_plan(lyon_plan(ids)["content"], notes=snapshot)
    if changed == "merged note used":
        store.touch(ids.train, now=NOW + 1)
        culprit = ids.train
    elif changed == "merged note gone":
        # Another writer merged it meanwhile: it is archived now.
        again = plan_reply(("Lyon again", "", [ids.lyon, ids.train]))["content"]
        other = parse_plan(again, notes=snapshot)
        apply_plan(store, other, snapshot, now=NOW)
        culprit = ids.lyon
    else:
        store.touch(ids.old, now=NOW + 1)  # used again: no longer "unused for long"
        culprit = ids.old
    before = store.dump()
    with pytest.raises(ConflictError) as caught:
        apply_plan(store, plan, snapshot, sweep=swept, now=NOW)
    assert culprit in caught.value.note_ids
    assert f"#{culprit}" in str(caught.value)
    assert store.dump() == before


def test_apply_plan_refuses_an_invalid_plan_and_writes_nothing(store: NoteStore) -> None:
    ids = seed(store, NOW)
    before = store.dump()
    notes = store.notes()
    lyon, old = (next(n for n in notes if n.id == i) for i in (ids.lyon, ids.old))
    bad = Plan(umbrellas=(Umbrella("Old ones", umbrella_body([lyon, old]), (lyon.id, old.id)),))
    swept = plan_sweep(store.notes(), now=NOW)  # the sweep makes ``old`` stale
    with pytest.raises(PlanError, match=f"note #{ids.old} is stale, not active"):
        apply_plan(store, bad, store.notes(), sweep=swept, now=NOW)
    assert store.dump() == before


# -- a whole run ------------------------------------------------------------------------


def test_consolidation_end_to_end(sim: Provider, client: ChatClient, store: NoteStore) -> None:
    ids = seed(store, NOW)
    sim.reply = lambda body: lyon_plan(ids)
    questions: list[str] = []
    usage: list[Usage] = []

    def confirm(question: str) -> bool:
        questions.append(question)
        return True

    run = in_host(
        curate,
        store,
        client=client,
        consolidate=True,
        confirm=confirm,
        now=NOW,
        on_usage=usage.append,
    )
    assert run.outcome is CuratorOutcome.APPLIED
    (question,) = questions
    assert f"mark stale (unused for long): #{ids.old} 'Old recipe'" in question
    assert f"archive (stale for long): #{ids.ancient} 'Ancient'" in question
    # The notes by id, as in the model's reply that streamed before it.
    assert question.splitlines()[3:] == [
        "  create 1 umbrella note holding the text of the notes it archives:",
        "    new note  archives",
        f"    Lyon      #{ids.lyon} Lyon trip",
        f"              #{ids.train} Train to Lyon",
    ]
    (umbrella,) = run.umbrellas
    assert umbrella.body == LYON_BODY
    assert [n.id for n in store.merged_into(umbrella.id)] == [ids.lyon, ids.train]
    assert store.counts() == {NoteState.ACTIVE: 2, NoteState.STALE: 1, NoteState.ARCHIVED: 3}
    # The model saw only the notes still active after the sweep.
    (body,) = sim.bodies
    prompt = body["messages"][-1]["content"]
    assert "Lyon trip" in prompt
    assert "Old recipe" not in prompt
    assert [u.requests for u in usage] == [1]


@pytest.mark.parametrize("how", ["dry_run", "declined"])
def test_a_dry_run_or_a_declined_run_writes_nothing(
    sim: Provider, client: ChatClient, store: NoteStore, how: str
) -> None:
    ids = seed(store, NOW)
    sim.reply = lambda body: lyon_plan(ids)
    before = store.dump()
    run = in_host(
        curate,
        store,
        client=client,
        consolidate=True,
        dry_run=how == "dry_run",
        confirm=lambda question: False,
        now=NOW,
    )
    assert run.outcome is (CuratorOutcome.DRY_RUN if how == "dry_run" else CuratorOutcome.DECLINED)
    assert run.plan is not None
    assert len(run.plan.umbrellas) == 1
    assert store.dump() == before


def test_an_invalid_plan_changes_nothing_and_says_why(
    sim: Provider, client: ChatClient, store: NoteStore
) -> None:
    ids = seed(store, NOW)
    sim.reply = lambda body: plan_reply(
        ("Bad", "Lyon and more", [ids.lyon, 999]), ("Worse", "Lyon alone", [ids.lyon])
    )
    before = store.dump()
    run = in_host(curate, store, client=client, consolidate=True, now=NOW)
    assert run.outcome is CuratorOutcome.INVALID_PLAN
    assert run.problems == [
        "umbrella 1: note #999 does not exist",
        "umbrella 2 merges fewer than two notes",
        f"note #{ids.lyon} is in umbrellas 1 and 2",
    ]
    assert store.dump() == before  # not even the sweep


def test_a_note_used_while_the_model_works_makes_the_run_write_nothing(
    sim: Provider, client: ChatClient, store: NoteStore
) -> None:
    ids = seed(store, NOW)
    sim.reply = lambda body: lyon_plan(ids)
    used = threading.Event()

    def on_token(text: str) -> None:
        if not used.is_set():  # someone reads the Lyon note while the model writes
            used.set()
            store.touch(ids.lyon, now=NOW + 5)

    with pytest.raises(ConflictError):
        in_host(curate, store, client=client, consolidate=True, now=NOW, on_token=on_token)
    assert used.is_set()
    note_now = store.get(ids.lyon)
    assert note_now is not None
    assert (note_now.state, note_now.last_used_at) == (NoteState.ACTIVE, NOW + 5)
    assert store.counts()[NoteState.STALE] == 1  # the sweep was not written either
    assert store.get(ids.old) is not None
    assert store.get(ids.old).state is NoteState.ACTIVE  # type: ignore[union-attr]


def test_only_the_most_recently_used_notes_go_into_the_prompt(
    sim: Provider, client: ChatClient, store: NoteStore
) -> None:
    ids = seed(store, NOW)  # active after the sweep: lyon (1 day), train (2 days), paris (1 day)
    tickets = store.add("Paris tickets", "For the museum on Sunday", now=NOW - 0.5 * DAY).id
    sim.reply = lambda body: plan_reply()
    run = in_host(
        curate, store, client=client, consolidate=True, dry_run=True, now=NOW, max_notes=3
    )
    assert run.outcome is CuratorOutcome.DRY_RUN  # the sweep; an empty plan
    # Paris and Paris tickets share a title word: asked about. Train to Lyon
    # is the oldest and left out, so Lyon trip has no partner and no request follows.
    (body,) = sim.bodies
    assert body["messages"][-1]["content"] == (
        f"Notes:\n#{ids.paris} Paris\n   Museum on Sunday\n"
        f"#{tickets} Paris tickets\n   For the museum on Sunday\nAnswer:"
    )


def test_each_umbrella_is_asked_about_one_group_and_a_declined_group_is_not_asked_again(
    sim: Provider, client: ChatClient, store: NoteStore
) -> None:
    lyon = [store.add("Lyon trip", "Train at 9:12").id, store.add("Train to Lyon", "Seat 42").id]
    bread = [store.add("Bread recipe", "Flour, water").id, store.add("Bread starter", "Feed").id]
    store.add("Guitar chords", "G, C, D")  # shares no title word: never sent
    umbrella = {"notes": bread, "title": "Bread baking"}
    # The model declines the Lyon notes (no umbrella) and groups the bread notes.
    sim.reply = lambda body: (
        plan_reply()
        if "Lyon" in body["messages"][-1]["content"]
        else {"content": json.dumps({"umbrellas": [umbrella]})}
    )
    plan = in_host(make_plan, client, store.notes())
    assert plan.defect is None
    by_id = {n.id: n for n in store.notes()}
    assert plan.umbrellas == (
        Umbrella("Bread baking", umbrella_body([by_id[i] for i in bread]), tuple(bread)),
    )
    # "Bread" starts both of its titles, "Lyon" one of its: the bread notes first.
    assert [body["messages"][-1]["content"] for body in sim.bodies] == [
        f"Notes:\n#{bread[0]} Bread recipe\n   Flour, water\n#{bread[1]} Bread starter\n   Feed\n"
        "Answer:",
        f"Notes:\n#{lyon[0]} Lyon trip\n   Train at 9:12\n#{lyon[1]} Train to Lyon\n   Seat 42\n"
        "Answer:",
    ]
    assert plan.usage.requests == 2
    assert validate_plan(plan, store.notes()) == []
    assert not set(lyon) & {i for u in plan.umbrellas for i in u.note_ids}  # declined


def test_a_declined_group_is_not_asked_about_again_inside_a_larger_group(
    sim: Provider, client: ChatClient, store: NoteStore
) -> None:
    times = store.add("Lyon train times", "9:12 on Friday").id
    seats = store.add("Lyon train seats", "Coach 7, seat 42").id
    hotel = store.add("Lyon hotel", "Two nights").id
    paris = store.add("Train to Paris", "Monday").id
    museum = store.add("Paris museum", "Sunday").id
    # The Lyon notes are offered first (three titles, "Lyon" starts each);
    # the model declines them: they are not about one thing. The train notes
    # (times, seats, and the Paris train) would bring two of them together
    # again: never asked. Neither is the Lyon group a second time.
    asked: list[list[int]] = []

    def reply(body: dict[str, Any]) -> Mapping[str, Any]:
        schema = body["response_format"]["json_schema"]["schema"]
        offered = schema["properties"]["umbrellas"]["items"]["properties"]["notes"]["enum"]
        asked.append(offered[0])
        if offered[0] == [paris, museum]:
            return {"content": json.dumps({"umbrellas": [{"notes": offered[0], "title": "Paris"}]})}
        return plan_reply()

    sim.reply = reply
    plan = in_host(make_plan, client, store.notes())
    assert asked == [[times, seats, hotel], [paris, museum]]
    assert [u.note_ids for u in plan.umbrellas] == [(paris, museum)]


def test_notes_that_share_no_word_are_not_sent_to_the_model(
    sim: Provider, client: ChatClient, store: NoteStore
) -> None:
    store.add("Passport", "Expires in 2031", now=NOW)
    store.add("Guitar chords", "G, C, D", now=NOW)
    run = in_host(curate, store, client=client, consolidate=True, now=NOW)
    assert run.outcome is CuratorOutcome.NOTHING_TO_DO
    assert run.skipped == "no two active notes share a word in their titles: nothing to consolidate"
    assert sim.bodies == []


def test_fewer_than_two_active_notes_are_not_sent_to_the_model(
    sim: Provider, client: ChatClient, store: NoteStore
) -> None:
    store.add("Alone", "one note", now=NOW)
    run = in_host(curate, store, client=client, consolidate=True, now=NOW)
    assert run.outcome is CuratorOutcome.NOTHING_TO_DO
    assert run.skipped == "consolidation needs at least two active notes; there are 1"
    assert sim.bodies == []


# -- issue 37's store, through the real curator -------------------------------------------

ISSUE_NOTES = {
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
    "dentist": [("Dentist appointment", "Dr Patel, Tuesday 14 May at 9:30.")],
    "shopping": [("Shopping list", "Flour, eggs, milk and chain oil.")],
}
#: What SmolLM2 answered for this store (issue 37), as far as the schema lets a model.
ISSUE_TITLES = {"Sourdough": "Sourdough Sourdough Sourdough Sourdough", "Bike": "Bike tyres"}
ISSUE_SUMMARIES = {
    "Sourdough": "The sourdough starter is a natural product that is used to create a wide",
    "Bike": "Bike tyres are a crucial component of the bike's design, providing a lightweight "
    "yet powerful alternative to traditional",
}
FIT_TITLES = {"Sourdough": "Starter care", "Bike": "Bike upkeep"}


def scripted_model(
    titles: dict[str, str], summaries: dict[str, str]
) -> Callable[[dict[str, Any]], Any]:
    """A model that, like SmolLM2, takes the first group offered, titled and summarised.

    ``titles`` and ``summaries`` by a word of the first note listed.
    """

    def reply(body: dict[str, Any]) -> Mapping[str, Any]:
        schema = body["response_format"]["json_schema"]["schema"]
        offered = schema["properties"]["umbrellas"]["items"]["properties"]["notes"]["enum"]
        first = body["messages"][-1]["content"].splitlines()[1]
        title = next(t for word, t in titles.items() if word in first)
        summary = next(t for word, t in summaries.items() if word in first)
        umbrella = {"notes": offered[0], "title": title, "summary": summary}
        return {"content": json.dumps({"umbrellas": [umbrella]})}

    return reply


def _numbers(text: str) -> set[str]:
    return set(re.findall(r"\d+(?:[.:,]\d+)*", text))


def _words(text: str) -> list[str]:
    return [w.casefold() for w in re.findall(r"[^\W\d_]{3,}", text)]


@pytest.mark.parametrize("model", ["as in the issue", "fit titles"])
def test_issue_37s_store_is_consolidated_into_its_notes_own_words_one_topic_each(
    sim: Provider, store: NoteStore, client: ChatClient, model: str
) -> None:
    topic = {
        store.add(title, body).id: name
        for name, notes in ISSUE_NOTES.items()
        for title, body in notes
    }
    before = {n.id: n for n in store.notes()}
    titles = ISSUE_TITLES if model == "as in the issue" else FIT_TITLES
    sim.reply = scripted_model(titles, ISSUE_SUMMARIES)
    console = Console(store, client)
    out = console.run(curator_run, "--consolidate")

    # The confirmation named the notes as the model's reply did: by id.
    (question,) = console.questions
    streamed = console.text("token")
    assert '"notes": [1, 2, 3]' in streamed
    assert '"notes": [4, 5, 6]' in streamed
    for note_id in range(1, 7):
        assert f"#{note_id} {before[note_id].title}" in question
    if model == "as in the issue":
        assert "the model's title 'Sourdough Sourdough Sourdough Sourdough' for #1 #2 #3" in out
        assert "the model's title 'Bike tyres' for #4 #5 #6 is refused" in out

    made = [n for n in store.notes() if n.id not in before]
    assert len(made) == 2
    grouped: list[set[int]] = []
    for umbrella in made:
        members = store.merged_into(umbrella.id)
        ids = {n.id for n in members}
        grouped.append(ids)
        source = "\n".join(f"{n.title}\n{n.body}" for n in members)
        # No invented fact: every line is a line of its notes, every number theirs.
        assert set(umbrella.body.splitlines()) <= set(source.splitlines()) | {""}
        assert _numbers(umbrella.body) == _numbers(source)
        assert "crucial" not in umbrella.body
        # No degenerate title: no word twice, not one note's title, a word they all hold.
        words = _words(umbrella.title)
        assert len(words) == len(set(words)), umbrella.title
        assert umbrella.title not in {n.title for n in members}
        assert any(all(w in _words(f"{n.title} {n.body}") for n in members) for w in words)
        # One topic each.
        assert len({topic[i] for i in ids}) == 1
    # No member left out: each topic of several notes is one umbrella, whole.
    assert sorted(map(sorted, grouped)) == [[1, 2, 3], [4, 5, 6]]
    after = {n.id: n for n in store.notes()}
    assert after[7] == before[7]  # the dentist and the shopping list are untouched
    assert after[8] == before[8]


def test_issue_37s_summary_is_refused_and_nothing_is_written(
    sim: Provider, store: NoteStore, client: ChatClient
) -> None:
    for notes in ISSUE_NOTES.values():
        for title, body in notes:
            store.add(title, body)
    before = store.dump()
    sim.reply = scripted_model(FIT_TITLES, ISSUE_SUMMARIES)
    console = Console(store, client)
    with pytest.raises(CommandError) as caught:
        console.run(curator_run, "--consolidate", "--summarize", "--yes")
    assert str(caught.value) == (
        "the plan is invalid, nothing was changed: "
        "umbrella 1: the summary ends mid-sentence ('…powerful alternative to traditional'); "
        "umbrella 2: the summary ends mid-sentence ('…to create a wide')"
    )
    assert store.dump() == before


def test_a_checked_summary_leads_the_notes_own_text(
    sim: Provider, store: NoteStore, client: ChatClient
) -> None:
    for notes in ISSUE_NOTES.values():
        for title, body in notes:
            store.add(title, body)
    summaries = {
        "Sourdough": "Feed the starter every 12 hours and keep it at 24 C.",
        "Bike": "Pump the tyres to 60 psi; get pads at Cycle Hub before the Alps.",
    }
    sim.reply = scripted_model(FIT_TITLES, summaries)
    Console(store, client).run(curator_run, "--consolidate", "--summarize", "--yes")
    made = [n for n in store.notes() if n.id > 8]
    assert [n.title for n in made] == ["Bike upkeep", "Starter care"]
    for umbrella, summary in zip(made, [summaries["Bike"], summaries["Sourdough"]], strict=True):
        members = store.merged_into(umbrella.id)
        assert umbrella.body == summary + "\n\n" + umbrella_body(members)


def test_summarize_needs_consolidate(store: NoteStore, client: ChatClient) -> None:
    with pytest.raises(UsageError, match="--summarize needs --consolidate; usage: curator run"):
        Console(store, client).run(curator_run, "--summarize")


# -- a cut at any moment leaves the store as it was -------------------------------------

Cut = tuple[str, float]
#: The simulator events of an uncut run: received, slot, first token, the
#: tokens, finished, slot freed. A cut at event n <= this always happens.
RUN_EVENTS = 4 + 12 + 1
CUTS: st.SearchStrategy[Cut] = st.one_of(
    st.tuples(st.just("event"), st.integers(1, RUN_EVENTS).map(float)),  # at the n-th event
    st.tuples(st.just("timer"), st.floats(0.0, 0.12)),  # n seconds after the start
    st.just(("confirm", 0.0)),  # while asking for confirmation
    st.just(("none", 0.0)),
)


@pytest.fixture(scope="module")
def applied(provider: Provider) -> str:
    """The dump of the seeded store after an uncut run at ``NOW``."""
    with tempfile.TemporaryDirectory() as folder, ChatClient(provider.server.base_url) as client:
        store = NoteStore.in_data_dir(folder)
        ids = seed(store, NOW)
        provider.reply = lambda body: lyon_plan(ids)
        run = in_host(curate, store, client=client, consolidate=True, now=NOW)
        assert run.outcome is CuratorOutcome.APPLIED
        return store.dump()


def test_a_cut_at_any_moment_leaves_the_store_exactly_as_it_was(
    provider: Provider, applied: str
) -> None:
    outcomes: list[tuple[str, bool]] = []
    pool = ThreadPoolExecutor(2)

    # No shrinking: each example is a real run with bounded waits, and a
    # failing one must fail the test, not be replayed for minutes.
    @settings(
        max_examples=60, deadline=None, database=None, phases=[Phase.explicit, Phase.generate]
    )
    @given(cut=CUTS)
    @example(cut=("event", 1.0))
    @example(cut=("event", 8.0))
    @example(cut=("confirm", 0.0))
    @example(cut=("none", 0.0))
    def one_run(cut: Cut) -> None:
        kind, at = cut
        provider.wait_all_ended()
        since = provider.server.events()[-1].seq + 1 if provider.server.events() else 0
        with (
            tempfile.TemporaryDirectory() as folder,
            ChatClient(provider.server.base_url) as client,
        ):
            store = NoteStore.in_data_dir(folder)
            ids = seed(store, NOW)
            provider.reply = lambda body: lyon_plan(ids)
            before = store.dump()
            scope = InterruptScope("command", timeout=at if kind == "timer" else None)

            def confirm(question: str) -> bool:
                if kind == "confirm":
                    scope.cancel("user")
                ws.check()  # the console's confirm ends with Interrupted on a cancel
                return True

            cutter: Future[None] | None = None
            if kind == "event":
                nth = int(at)

                def cut_at_event() -> None:
                    seen = 0

                    def count(event: Any) -> bool:
                        nonlocal seen
                        seen += 1
                        return seen >= nth

                    provider.server.wait_for(count, timeout=BOUND, since=since)
                    scope.cancel("user")

                cutter = pool.submit(cut_at_event)
            work = pool.submit(
                scope.run, curate, store, client=client, consolidate=True, confirm=confirm, now=NOW
            )
            try:
                run = work.result(BOUND)
            except Interrupted:
                assert store.dump() == before
                outcomes.append((kind, True))
            else:
                assert run.outcome is CuratorOutcome.APPLIED
                assert store.dump() == applied
                outcomes.append((kind, False))
            assert scope.wait_quiescent(BOUND), scope.live()
            if cutter is not None:
                cutter.result(BOUND)

    try:
        one_run()
    finally:
        pool.shutdown(wait=True)
    # Not vacuous: some runs were cut, some were not, and cuts came at each kind of moment.
    assert {was_cut for _, was_cut in outcomes} == {True, False}
    assert {kind for kind, was_cut in outcomes if was_cut} >= {"event", "confirm"}


# -- the console commands ---------------------------------------------------------------


class Console:
    """Runs ``curator ...`` the way the runner does, with a hand-built ``CommandContext``."""

    def __init__(
        self,
        store: NoteStore,
        client: ChatClient,
        *,
        answer: bool | None = True,
        max_tokens: int | None = None,
    ):
        self.store = store
        self.client = client
        self.max_tokens = max_tokens  # the provider's reply bound (Services.max_tokens)
        self.answer = answer  # None: the confirmation waits until cancelled
        self.scope = InterruptScope("command")
        self.frames: list[tuple[str, str]] = []
        self.changed = threading.Condition()  # notified on each output frame
        self.questions: list[str] = []
        self.usage: list[Usage] = []
        self.asked = threading.Event()

    def confirm(self, message: str) -> bool:
        self.questions.append(message)
        self.asked.set()
        if self.answer is None:
            self.scope.wait(threading.Event())  # the client never answers
        return bool(self.answer)

    def output(self, stream: str, data: str) -> None:
        with self.changed:
            self.frames.append((stream, data))
            self.changed.notify_all()

    def wait_tokens(self, n: int) -> bool:
        """Wait until ``n`` token frames reached the output."""
        with self.changed:
            return self.changed.wait_for(
                lambda: sum(s == "token" for s, _ in self.frames) >= n, BOUND
            )

    def start(self, fn: Callable[[CommandContext, list[str]], None], *args: str) -> Future[None]:
        ctx = CommandContext(
            id="c1",
            line=" ".join(args),
            scope=self.scope,
            session=Session(),
            services=Services(
                store=self.store,
                chat_client=lambda: self.client,
                model="sim",
                **({"max_tokens": self.max_tokens} if self.max_tokens else {}),
            ),
            output=self.output,
            confirm=self.confirm,
            add_usage=self.usage.append,
        )
        self.pool = ThreadPoolExecutor(1)
        future = self.pool.submit(self.scope.run, fn, ctx, list(args))
        self.pool.shutdown(wait=False)
        return future

    def run(self, fn: Callable[[CommandContext, list[str]], None], *args: str) -> str:
        self.start(fn, *args).result(BOUND)
        return self.text()

    def text(self, stream: str = "stdout") -> str:
        return "".join(data for s, data in self.frames if s == stream)


def test_curator_status_counts_each_state(store: NoteStore, client: ChatClient) -> None:
    seed(store, NOW)
    assert Console(store, client).run(curator_status) == "active: 4\nstale: 1\narchived: 0\n"


def test_curator_run_asks_first_and_a_no_changes_nothing(
    sim: Provider, store: NoteStore, client: ChatClient
) -> None:
    ids = seed(store, time.time())
    before = store.dump()
    console = Console(store, client, answer=False)
    out = console.run(curator_run)
    (question,) = console.questions
    assert f"#{ids.old} 'Old recipe'" in question
    assert f"#{ids.ancient} 'Ancient'" in question
    assert out == "not confirmed; nothing was changed\n"
    assert store.dump() == before


def test_curator_run_with_yes_writes_without_asking(
    sim: Provider, store: NoteStore, client: ChatClient
) -> None:
    ids = seed(store, time.time())
    sim.reply = lambda body: lyon_plan(ids)
    console = Console(store, client, answer=False)
    out = console.run(curator_run, "--consolidate", "--yes")
    assert console.questions == []
    assert out.splitlines()[0] == "asking the model for a plan over 3 active notes"
    assert "done:" in out
    assert "new umbrella notes: #6" in out
    assert console.text("token") == lyon_plan(ids)["content"] + "\n"
    assert store.counts() == {NoteState.ACTIVE: 2, NoteState.STALE: 1, NoteState.ARCHIVED: 3}
    (usage,) = console.usage
    assert (usage.requests, usage.completion_tokens) == (1, token_count(lyon_plan(ids)))
    (body,) = sim.bodies
    assert body["model"] == "sim"
    assert body["max_tokens"] == max(PLAN_MAX_TOKENS, Services(store, lambda: client).max_tokens)


def test_curator_run_dry_run_prints_the_plan_and_writes_nothing(
    sim: Provider, store: NoteStore, client: ChatClient
) -> None:
    ids = seed(store, time.time())
    sim.reply = lambda body: lyon_plan(ids)
    before = store.dump()
    console = Console(store, client)
    out = console.run(curator_run, "--consolidate", "--dry-run")
    assert console.questions == []
    assert out.splitlines()[1:] == [
        "dry run, nothing was changed; a run would:",
        f"  mark stale (unused for long): #{ids.old} 'Old recipe'",
        f"  archive (stale for long): #{ids.ancient} 'Ancient'",
        f"  merge #{ids.lyon} 'Lyon trip', #{ids.train} 'Train to Lyon' into a new note 'Lyon'",
        "    new note  archives",
        f"    Lyon      #{ids.lyon} Lyon trip",
        f"              #{ids.train} Train to Lyon",
    ]
    assert store.dump() == before


def test_curator_run_with_an_invalid_plan_fails_says_why_and_writes_nothing(
    sim: Provider, store: NoteStore, client: ChatClient
) -> None:
    ids = seed(store, time.time())
    sim.reply = lambda body: plan_reply(("Stale one", "Lyon and a recipe", [ids.lyon, ids.old]))
    before = store.dump()
    console = Console(store, client)
    with pytest.raises(CommandError) as caught:
        console.run(curator_run, "--consolidate", "--yes")
    assert str(caught.value) == (
        "the plan is invalid, nothing was changed: umbrella 1: its notes share no word; "
        f"umbrella 1: note #{ids.old} is stale, not active"
    )
    # Said once: in the error, not in the output as well.
    assert console.text() == "asking the model for a plan over 3 active notes\n"
    assert len(console.usage) == 1  # the model's work is counted all the same
    assert store.dump() == before


def test_curator_run_consolidate_with_one_active_note_says_so(
    sim: Provider, store: NoteStore, client: ChatClient
) -> None:
    store.add("Alone", "one note")
    out = Console(store, client).run(curator_run, "--consolidate", "--yes")
    assert out == (
        "consolidation needs at least two active notes; there are 1\nnothing to change\n"
    )
    assert sim.bodies == []


def test_a_cancel_while_the_model_writes_cuts_it_counts_its_usage_and_writes_nothing(
    sim: Provider, store: NoteStore, client: ChatClient
) -> None:
    seed(store, time.time())
    sim.reply = lambda body: {"content": "word " * 5000}  # cut at max_tokens, 1.3 s at 400/s
    before = store.dump()
    console = Console(store, client)
    future = console.start(curator_run, "--consolidate", "--yes")
    assert console.wait_tokens(3)  # three tokens reached the user: the model is mid-reply
    console.scope.cancel("user")
    with pytest.raises(Interrupted):
        future.result(BOUND)
    (summary,) = sim.server.requests()
    sim.server.wait_for_event("peer_closed", summary.id, timeout=BOUND)
    (usage,) = console.usage
    assert usage.requests == 1
    assert usage.completion_tokens >= 3
    assert console.scope.wait_quiescent(BOUND), console.scope.live()
    assert store.dump() == before


def test_a_cancel_while_waiting_for_confirmation_writes_nothing(
    sim: Provider, store: NoteStore, client: ChatClient
) -> None:
    seed(store, time.time())
    before = store.dump()
    console = Console(store, client, answer=None)
    future = console.start(curator_run)
    assert console.asked.wait(BOUND)
    console.scope.cancel("user")
    with pytest.raises(Interrupted):
        future.result(BOUND)
    assert store.dump() == before


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--force"], "unknown option '--force'"),
        (["--stale-days"], "--stale-days needs a number of days"),
        (["--stale-days", "0"], "--stale-days must be a number of days in (0, 36500]"),
        (["--archive-days", "nan"], "--archive-days must be a number of days"),
        (["--archive-days", "1e400"], "--archive-days must be a number of days"),
    ],
)
def test_curator_run_refuses_bad_options_with_its_usage(
    store: NoteStore, client: ChatClient, args: list[str], words: str
) -> None:
    with pytest.raises(UsageError) as caught:
        Console(store, client).run(curator_run, *args)
    assert words in str(caught.value)
    assert "; usage: curator run [--consolidate] [--dry-run] [--yes]" in str(caught.value)


def test_curator_run_thresholds_are_options(
    sim: Provider, store: NoteStore, client: ChatClient
) -> None:
    ids = seed(store, time.time())
    Console(store, client).run(curator_run, "--yes", "--stale-days", "0.5")
    assert {n.id for n in store.notes(NoteState.STALE)} == {ids.lyon, ids.train, ids.paris, ids.old}


# -- the real tiny model ------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_model() -> Iterator[LocalServer]:
    """The embedded llama.cpp with the default model (in the user's cache: scripts/test)."""
    if not is_available():
        pytest.skip("the extra `local` is not installed")
    with LocalServer(n_parallel=1, ctx_size=2048) as local:
        yield local


@pytest.mark.local
def test_the_real_local_model_answers_with_json_of_the_plan_shape(
    local_model: LocalServer, tmp_path: Path
) -> None:
    # llama.cpp turns the schema into a grammar: the default model's reply is
    # JSON of the plan's shape, over the group it was offered, and closes
    # before max_tokens. One pair and a loner: one request (the loner is left
    # alone), a short prompt and a short reply, cheap on a loaded machine.
    store = NoteStore.in_data_dir(tmp_path)
    for title, body in [
        ("Lyon trip", "Train to Lyon at 9:12 on Friday"),
        ("Train to Lyon", "Seat 42, coach 7"),
        ("Guitar chords", "G, C, D"),
    ]:
        store.add(title, body)
    max_tokens = 96  # an umbrella at its longest bounds (40 + 120 characters) is ~60
    scope = InterruptScope("command")
    with ChatClient(local_model.base_url) as client, ThreadPoolExecutor(1) as pool:
        work = pool.submit(scope.run, make_plan, client, store.notes(), max_tokens=max_tokens)
        plan = work.result(LOCAL_BOUND)
    assert plan.usage.requests == 1
    assert plan.defect is None, plan.text
    assert plan.usage.completion_tokens < max_tokens
    assert validate_plan(plan, store.notes()) == [], plan.text
    pair = {n.id for n in store.notes() if "Lyon" in n.title}
    assert [set(u.note_ids) for u in plan.umbrellas] in ([], [pair])
    by_id = {n.id: n for n in store.notes()}
    for umbrella in plan.umbrellas:  # whatever it titled it, the body is the notes' own text
        assert umbrella.body == umbrella_body([by_id[i] for i in umbrella.note_ids])


@pytest.mark.local
def test_the_real_local_model_cannot_leave_the_schema(local_model: LocalServer) -> None:
    # Told to write a plan the schema forbids (a group not offered, a long
    # title, a short summary, two umbrellas), the model still answers
    # within it: llama.cpp compiled every keyword of the schema into its
    # grammar. A keyword it cannot compile (some ``pattern`` did that) would
    # leave the reply unconstrained, and this test fails.
    schema = plan_schema([(1, 2), (3, 4), (1, 2, 5)], max_umbrellas=1, summarize=True)
    bad = {
        "notes": [1, 3],
        "title": "Lyon trip: Train to Lyon at 9:12 on Friday again",
        "summary": "ok",
    }
    prompt = "Repeat exactly: " + json.dumps({"umbrellas": [bad, bad]})
    with ChatClient(local_model.base_url) as client:
        reply = client.chat(
            [{"role": "user", "content": prompt}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "plan", "strict": True, "schema": schema},
            },
            temperature=0,
            max_tokens=400,  # one umbrella at its longest bounds, a token a character: ~260
        )
    assert reply.finish_reason == "stop", reply.text
    jsonschema.validate(json.loads(reply.text), schema)


# -- degenerate plans: each refused end to end, nothing written ----------------------------


def _degenerate(ids: Seeded, extra: int) -> dict[str, tuple[dict[str, Any], bool]]:
    """What a confused model answers, and whether the run asked for summaries."""
    pair = [ids.lyon, ids.train]
    summed = {"notes": pair, "title": "Lyon"}
    return {
        "every note": (
            plan_reply(("Everything", "", [ids.lyon, ids.train, ids.paris, extra])),
            False,
        ),
        "one id twice": (
            plan_reply(("Lyon", "", pair), ("Trains", "", [ids.train, ids.paris])),
            False,
        ),
        # Paris and the bread recipe: "museum" and "Sunday" in their bodies only.
        "two topics": (plan_reply(("Sunday museum", "", [ids.paris, extra])), False),
        "nested": ({"content": '{"umbrellas": [' + "[" * 30_000 + "]" * 30_000 + "]}"}, False),
        "summary is the title": (
            {"content": json.dumps({"umbrellas": [{**summed, "summary": "Lyon!"}]})},
            True,
        ),
        "summary cut mid-sentence": (
            {"content": json.dumps({"umbrellas": [{**summed, "summary": "The trip. It is "}]})},
            True,
        ),
        "summary invents": (
            {"content": json.dumps({"umbrellas": [{**summed, "summary": "Seat 24 at 9:12."}]})},
            True,
        ),
        "summary placeholder": (
            {"content": json.dumps({"umbrellas": [{**summed, "summary": "summary"}]})},
            True,
        ),
    }


DEGENERATE_WHY = {
    "every note": "umbrella 1 merges every active note (4): that groups nothing",
    "one id twice": "is in umbrellas 1 and 2",
    "two topics": "umbrella 1 joins two topics: no word is in all its notes' titles",
    "nested": "the reply is not a plan: its JSON is nested too deeply",
    "summary is the title": "umbrella 1: the summary only repeats the title",
    "summary cut mid-sentence": "umbrella 1: the summary ends mid-sentence ('…The trip. It is')",
    "summary invents": "umbrella 1: the summary says '24', which none of its notes says",
    "summary placeholder": "umbrella 1: the summary is a placeholder ('summary')",
}


@pytest.mark.parametrize("kind", sorted(DEGENERATE_WHY))
def test_a_degenerate_plan_writes_nothing_and_the_command_says_why(
    sim: Provider, store: NoteStore, client: ChatClient, kind: str
) -> None:
    ids = seed(store, time.time())
    # Four active notes after the sweep.
    extra = store.add("Bread recipe", "Flour, water, salt; the museum shop on Sunday").id
    reply, summarize = _degenerate(ids, extra)[kind]
    sim.reply = lambda body: reply
    before = store.dump()
    console = Console(store, client)
    args = ["--consolidate", "--yes", *(["--summarize"] if summarize else [])]
    with pytest.raises(CommandError) as caught:
        console.run(curator_run, *args)  # --yes: nothing stands in the way
    message = str(caught.value)
    assert message.startswith("the plan is invalid, nothing was changed: ")
    assert DEGENERATE_WHY[kind] in message
    assert store.dump() == before  # not the plan, not even the sweep
    assert console.questions == []


@pytest.mark.parametrize(
    ("title", "why"),
    [
        ("...", "the title has no words ('...')"),
        ("TODO", "the title is a placeholder ('TODO')"),
        ("Lyon Lyon Lyon", "the title repeats 'Lyon'"),
        ("Lyon trip", "the title is the title of note #2 alone, not of all 2"),
        ("Holiday plans", "the title names no word that all its notes hold"),
        (
            "Paris",
            "the title names no word that all its notes hold; "
            "the title is the title of note #4, which it does not merge",
        ),
    ],
)
def test_an_unfit_title_is_replaced_by_what_the_titles_share_and_the_run_says_so(
    sim: Provider, store: NoteStore, client: ChatClient, title: str, why: str
) -> None:
    ids = seed(store, time.time())
    assert ids.lyon == 2
    reply = {"content": json.dumps({"umbrellas": [{"notes": [2, 3], "title": title}]})}
    sim.reply = lambda body: reply
    console = Console(store, client)
    out = console.run(curator_run, "--consolidate", "--yes")
    assert out.splitlines()[1] == (
        f"the model's title {title!r} for #2 #3 is refused ({why}); "
        "titled 'Lyon', what all their titles share"
    )
    (umbrella,) = [n for n in store.notes() if n.id not in vars(ids).values()]
    assert (umbrella.title, umbrella.body) == ("Lyon", LYON_BODY)
    assert [n.id for n in store.merged_into(umbrella.id)] == [2, 3]
    assert console.text("token") == reply["content"] + "\n"  # the reply as the model gave it


def test_a_reply_that_pads_whitespace_is_cut_early_and_is_no_plan(
    sim: Provider, store: NoteStore, client: ChatClient
) -> None:
    seed(store, time.time())
    # Blank lines, then words until max_tokens: without the cut, 500 tokens.
    padding = "\n" * (WHITESPACE_RUN_CUT + 1)
    sim.reply = lambda body: {"content": '{"umbrellas": [' + padding + "x " * 2000}
    before = store.dump()
    console = Console(store, client)
    with pytest.raises(CommandError) as caught:
        console.run(curator_run, "--consolidate", "--yes")
    assert "the model padded its reply with whitespace; it was cut after" in str(caught.value)
    (summary,) = sim.server.requests()
    sim.server.wait_for_event("peer_closed", summary.id, timeout=BOUND)  # the provider saw it
    (usage,) = console.usage
    assert usage.completion_tokens < 10
    assert store.dump() == before
    # The user saw the reply compactly: no screen of blank lines.
    assert "\n\n" not in console.text("token")
    assert "   " not in console.text("token")


def test_a_reply_that_goes_on_after_its_json_closed_is_cut_there_and_used(
    sim: Provider, store: NoteStore, client: ChatClient
) -> None:
    ids = seed(store, time.time())
    plan_text = lyon_plan(ids)["content"]
    # A tail of 100,000 tokens and room for all of them: only a cut ends this
    # reply before it all arrives (minutes at the simulator's rate).
    tail = " And some more words" * 25_000
    sim.reply = lambda body: {"content": plan_text + tail}
    console = Console(store, client, max_tokens=200_000)
    out = console.run(curator_run, "--consolidate", "--yes")
    assert "new umbrella notes: #6" in out
    (summary,) = sim.server.requests()
    sim.server.wait_for_event("peer_closed", summary.id, timeout=BOUND)
    (ended,) = sim.server.requests()
    assert ended.state == "peer_closed"  # cut there: the provider never finished the reply
    # The plan was read whole, and what was counted is what the provider sent
    # before the cut, however many tokens that was on a busy machine.
    (usage,) = console.usage
    assert usage.completion_tokens is not None
    assert token_count(lyon_plan(ids)) <= usage.completion_tokens <= ended.n_decoded
    (umbrella,) = [n for n in store.notes() if n.id not in vars(ids).values()]
    assert (umbrella.title, umbrella.body) == ("Lyon", LYON_BODY)  # nothing of the tail


def test_the_streamed_plan_is_shown_with_whitespace_collapsed(
    sim: Provider, store: NoteStore, client: ChatClient
) -> None:
    ids = seed(store, time.time())
    pretty = json.dumps(json.loads(lyon_plan(ids)["content"]), indent=8)
    sim.reply = lambda body: {"content": pretty}
    console = Console(store, client)
    console.run(curator_run, "--consolidate", "--yes")
    assert console.text("token") == " ".join(pretty.split()) + "\n"
    assert store.counts()[NoteState.ARCHIVED] == 3  # the pretty plan was applied
