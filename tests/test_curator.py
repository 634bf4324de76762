"""The curator: the sweep, the plan (make, validate, apply), whole runs, and ``curator ...``.

Consolidation runs against the simulator, scripted to answer with a JSON
plan, on a pool thread under a real ``InterruptScope`` (``scope.run``), the
way the console runner runs a command. "The store is unchanged" is always
``dump()`` (``iterdump``) before and after.
"""

from __future__ import annotations

import json
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
    """The assistant message of a model answering with a plan (spaces make many tokens)."""
    plan = {"umbrellas": [{"title": t, "summary": s, "note_ids": ids} for t, s, ids in umbrellas]}
    return {"content": json.dumps(plan)}


def lyon_plan(ids: Seeded) -> dict[str, Any]:
    return plan_reply(("Lyon", "The train trip to Lyon.", [ids.lyon, ids.train]))


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
    return Plan(umbrellas=tuple(Umbrella(t, f"What {t} notes say.", ids) for t, ids in specs))


def test_a_plan_over_distinct_active_notes_is_valid() -> None:
    assert validate_plan(umbrellas(("A", (1, 2))), NOTES) == []
    assert validate_plan(Plan(), NOTES) == []  # nothing to merge is a valid plan


@pytest.mark.parametrize(
    ("plan", "problems"),
    [
        (umbrellas(("A", (1, 99))), ["umbrella 1: note #99 does not exist"]),
        (umbrellas(("A", (1, 4))), ["umbrella 1: note #4 is stale, not active"]),
        (umbrellas(("A", (1, 5))), ["umbrella 1: note #5 is archived, not active"]),
        (umbrellas(("A", (1, 2)), ("B", (2, 3))), ["note #2 is in umbrellas 1 and 2"]),
        (umbrellas(("A", (1,))), ["umbrella 1 merges fewer than two notes"]),
        (
            umbrellas(("A", (1, 1))),
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
        ('{"umbrellas": [{"title": "t", "summary": 3, "note_ids": []}]}', '"summary" must be'),
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
    # As the grammar asks: notes by their numbers in the list (Lyon trip and
    # Train to Lyon share words, so they are listed first).
    umbrella = {"notes": [1, 2], "title": "Lyon", "summary": "The train trip to Lyon."}
    reply = {"content": json.dumps({"umbrellas": [umbrella]})}
    sim.reply = lambda body: reply
    tokens: list[str] = []
    plan = in_host(make_plan, client, candidates, on_token=tokens.append)

    assert plan.defect is None
    assert plan.umbrellas == (Umbrella("Lyon", "The train trip to Lyon.", (ids.lyon, ids.train)),)
    assert "".join(tokens) == reply["content"] == plan.text
    assert (plan.usage.requests, plan.usage.completion_tokens) == (1, token_count(reply))

    (body,) = sim.bodies
    assert body["max_tokens"] == PLAN_MAX_TOKENS
    assert body["temperature"] == 0
    assert body["frequency_penalty"] == 0
    # Only the group asked about: Paris shares no word with them, and is not sent.
    assert body["messages"][-1]["content"] == (
        "Notes:\n1. Lyon trip\n   Train at 9:12\n2. Train to Lyon\n   Seat 42, coach 7\nAnswer:"
    )
    assert body["response_format"]["type"] == "json_schema"
    schema = body["response_format"]["json_schema"]["schema"]
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(json.loads(reply["content"]), schema)
    assert schema["properties"]["umbrellas"]["items"]["properties"]["notes"]["enum"] == [[1, 2]]
    with pytest.raises(jsonschema.ValidationError):  # the grammar offers Paris to no umbrella
        jsonschema.validate({"umbrellas": [{**umbrella, "notes": [1, 3]}]}, schema)


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
        assert plan.umbrellas == (
            Umbrella("Lyon", "The train trip to Lyon.", (ids.lyon, ids.train)),
        )
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
    plan = parse_plan(lyon_plan(ids)["content"])
    (umbrella,) = apply_plan(store, plan, snapshot, sweep=swept, now=NOW)

    assert (umbrella.title, umbrella.body, umbrella.state) == (
        "Lyon",
        "The train trip to Lyon.",
        NoteState.ACTIVE,
    )
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
    plan = parse_plan(lyon_plan(ids)["content"])
    if changed == "merged note used":
        store.touch(ids.train, now=NOW + 1)
        culprit = ids.train
    elif changed == "merged note gone":
        # Another writer merged it meanwhile: it is archived now.
        other = parse_plan(plan_reply(("Other", "Lyon, again", [ids.lyon, ids.train]))["content"])
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
    bad = umbrellas(("Old ones", (ids.lyon, ids.old)))
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
    assert question.splitlines()[3:] == [
        "  create 1 umbrella note, archiving the notes merged into them:",
        "    new note  summary                  archives",
        f"    Lyon      The train trip to Lyon.  #{ids.lyon} Lyon trip",
        f"                                       #{ids.train} Train to Lyon",
    ]
    (umbrella,) = run.umbrellas
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
    seed(store, NOW)  # active after the sweep: lyon (1 day), train (2 days), paris (1 day)
    store.add("Museum tickets", "For the museum on Sunday", now=NOW - 0.5 * DAY)
    sim.reply = lambda body: plan_reply()
    run = in_host(
        curate, store, client=client, consolidate=True, dry_run=True, now=NOW, max_notes=3
    )
    assert run.outcome is CuratorOutcome.DRY_RUN  # the sweep; an empty plan
    # Museum tickets and Paris share words: asked about. Train to Lyon is the
    # oldest and left out, so Lyon trip has no partner and no request follows.
    (body,) = sim.bodies
    assert body["messages"][-1]["content"] == (
        "Notes:\n1. Paris\n   Museum on Sunday\n2. Museum tickets\n   For the museum on Sunday\n"
        "Answer:"
    )


def test_each_umbrella_is_asked_about_one_group_and_a_declined_group_is_not_asked_again(
    sim: Provider, client: ChatClient, store: NoteStore
) -> None:
    lyon = [store.add("Lyon trip", "Train at 9:12").id, store.add("Train to Lyon", "Seat 42").id]
    bread = [store.add("Bread recipe", "Flour, water").id, store.add("Bread starter", "Feed").id]
    store.add("Guitar chords", "G, C, D")  # shares no word: never sent
    umbrella = {"notes": [1, 2], "title": "Bread", "summary": "The bread recipe and its starter."}
    # The model declines the Lyon notes (no umbrella) and groups the bread notes.
    sim.reply = lambda body: (
        plan_reply()
        if "Lyon" in body["messages"][-1]["content"]
        else {"content": json.dumps({"umbrellas": [umbrella]})}
    )
    plan = in_host(make_plan, client, store.notes())
    assert plan.defect is None
    assert plan.umbrellas == (Umbrella("Bread", umbrella["summary"], tuple(bread)),)
    assert [body["messages"][-1]["content"] for body in sim.bodies] == [
        "Notes:\n1. Lyon trip\n   Train at 9:12\n2. Train to Lyon\n   Seat 42\nAnswer:",
        "Notes:\n1. Bread recipe\n   Flour, water\n2. Bread starter\n   Feed\nAnswer:",
    ]
    assert plan.usage.requests == 2
    assert validate_plan(plan, store.notes()) == []
    assert not set(lyon) & {i for u in plan.umbrellas for i in u.note_ids}  # declined


def test_notes_that_share_no_word_are_not_sent_to_the_model(
    sim: Provider, client: ChatClient, store: NoteStore
) -> None:
    store.add("Passport", "Expires in 2031", now=NOW)
    store.add("Guitar chords", "G, C, D", now=NOW)
    run = in_host(curate, store, client=client, consolidate=True, now=NOW)
    assert run.outcome is CuratorOutcome.NOTHING_TO_DO
    assert run.skipped == "no two active notes share a word: nothing to consolidate"
    assert sim.bodies == []


def test_fewer_than_two_active_notes_are_not_sent_to_the_model(
    sim: Provider, client: ChatClient, store: NoteStore
) -> None:
    store.add("Alone", "one note", now=NOW)
    run = in_host(curate, store, client=client, consolidate=True, now=NOW)
    assert run.outcome is CuratorOutcome.NOTHING_TO_DO
    assert run.skipped == "consolidation needs at least two active notes; there are 1"
    assert sim.bodies == []


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

    def __init__(self, store: NoteStore, client: ChatClient, *, answer: bool | None = True):
        self.store = store
        self.client = client
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
            services=Services(store=self.store, chat_client=lambda: self.client, model="sim"),
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
    assert "dry run, nothing was changed" in out
    assert "umbrella 1 'Lyon': The train trip to Lyon." in out
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


@pytest.mark.local
def test_the_real_local_model_cannot_leave_the_schema(local_model: LocalServer) -> None:
    # Told to write a plan the schema forbids (a group not offered, a long
    # title, a short summary, two umbrellas), the model still answers
    # within it: llama.cpp compiled every keyword of the schema into its
    # grammar. A keyword it cannot compile (some ``pattern`` did that) would
    # leave the reply unconstrained, and this test fails.
    schema = plan_schema([(1, 2), (3, 4), (1, 2, 5)], max_umbrellas=1)
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
            max_tokens=200,  # one umbrella at its longest bounds: ~60
        )
    assert reply.finish_reason == "stop", reply.text
    jsonschema.validate(json.loads(reply.text), schema)


# -- degenerate plans: each refused end to end, nothing written ----------------------------


def _degenerate(ids: Seeded, extra: int) -> dict[str, dict[str, Any]]:
    """What a confused small model answers, and (``why``) the reason each is refused for."""
    pair = [ids.lyon, ids.train]
    return {
        "dots": plan_reply(("...", "...", pair)),
        "placeholders": plan_reply(("title", "summary", pair)),
        "todo": plan_reply(("TODO", "The train trip to Lyon.", pair)),
        "summary is the title": plan_reply(("Lyon trip", "Lyon trip.", pair)),
        "every note": plan_reply(
            ("Everything", "All the notes.", [ids.lyon, ids.train, ids.paris, extra])
        ),
        "one id twice": plan_reply(
            ("Lyon", "The trip.", pair), ("Trains", "Trains.", [ids.train, ids.paris])
        ),
        "nested": {"content": '{"umbrellas": [' + "[" * 30_000 + "]" * 30_000 + "]}"},
        "same title twice": plan_reply(
            ("Lyon trip", "The train trip to Lyon.", pair),
            ("Lyon trip", "The train trip to Lyon.", [ids.paris, extra]),
        ),
    }


DEGENERATE_WHY = {
    "dots": "umbrella 1: the title has no words ('...'); umbrella 1: the summary has no words",
    "placeholders": "umbrella 1: the title is a placeholder ('title'); umbrella 1: the summary is"
    " a placeholder ('summary')",
    "todo": "umbrella 1: the title is a placeholder ('TODO')",
    "summary is the title": "umbrella 1: the summary only repeats the title",
    "every note": "umbrella 1 merges every active note (4): that groups nothing",
    "one id twice": "is in umbrellas 1 and 2",
    "nested": "the reply is not a plan: its JSON is nested too deeply",
    "same title twice": "umbrella 2 has the title of umbrella 1",
}


@pytest.mark.parametrize("kind", sorted(DEGENERATE_WHY))
def test_a_degenerate_plan_writes_nothing_and_the_command_says_why(
    sim: Provider, store: NoteStore, client: ChatClient, kind: str
) -> None:
    ids = seed(store, time.time())
    extra = store.add("Bread recipe", "Flour, water, salt").id  # four active notes after the sweep
    reply = _degenerate(ids, extra)[kind]
    sim.reply = lambda body: reply
    before = store.dump()
    console = Console(store, client)
    with pytest.raises(CommandError) as caught:
        console.run(curator_run, "--consolidate", "--yes")  # --yes: nothing stands in the way
    message = str(caught.value)
    assert message.startswith("the plan is invalid, nothing was changed: ")
    assert DEGENERATE_WHY[kind] in message
    assert store.dump() == before  # not the plan, not even the sweep
    assert console.questions == []


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
    sim.reply = lambda body: {"content": plan_text + " And some more words" * 500}
    console = Console(store, client)
    out = console.run(curator_run, "--consolidate", "--yes")
    assert "new umbrella notes: #6" in out
    (summary,) = sim.server.requests()
    sim.server.wait_for_event("peer_closed", summary.id, timeout=BOUND)
    (usage,) = console.usage
    assert usage.completion_tokens <= token_count(lyon_plan(ids)) + 2
    assert [n.title for n in store.notes() if n.umbrella_id is None][-1] == "Lyon"


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
