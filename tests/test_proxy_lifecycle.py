"""The proxied request's lifecycle table: who may follow whom, and the first reason wins."""

from __future__ import annotations

import pytest

from wirecut.proxy._lifecycle import (
    TRANSITIONS,
    ExchangeEvent,
    ExchangeLifecycle,
    ExchangeState,
    LifecycleError,
)

S, E = ExchangeState, ExchangeEvent


def walk(*events: ExchangeEvent) -> ExchangeLifecycle:
    lifecycle = ExchangeLifecycle("r1")
    for event in events:
        lifecycle.fire(event)
    return lifecycle


def test_a_request_that_runs_to_its_end_goes_queued_upstream_done() -> None:
    lifecycle = ExchangeLifecycle("r1")
    assert lifecycle.fire(E.ADMIT) == (S.QUEUED, S.UPSTREAM)
    assert lifecycle.fire(E.FINISH) == (S.UPSTREAM, S.DONE)


@pytest.mark.parametrize("before", [(), (E.ADMIT,)], ids=["queued", "upstream"])
def test_a_cut_in_either_phase_unwinds_and_then_is_done(before: tuple[ExchangeEvent, ...]) -> None:
    lifecycle = walk(*before)
    old, new = lifecycle.fire(E.CANCEL)
    assert new is S.UNWINDING
    assert old is not new
    assert lifecycle.fire(E.FINISH) == (S.UNWINDING, S.DONE)


def test_a_second_cancel_while_unwinding_changes_nothing() -> None:
    # Exchange.cancel keeps its reason only on a transition that changes the
    # state: a later cancel finds old == new and leaves the first reason.
    lifecycle = walk(E.ADMIT, E.CANCEL)
    assert lifecycle.fire(E.CANCEL) == (S.UNWINDING, S.UNWINDING)


def test_late_news_after_done_changes_nothing() -> None:
    lifecycle = walk(E.ADMIT, E.FINISH)
    assert lifecycle.fire(E.CANCEL) == (S.DONE, S.DONE)
    assert lifecycle.fire(E.FINISH) == (S.DONE, S.DONE)


@pytest.mark.parametrize(
    ("before", "event"),
    [
        ((), E.FINISH),
        ((E.ADMIT,), E.ADMIT),
        ((E.ADMIT, E.CANCEL), E.ADMIT),
        ((E.ADMIT, E.FINISH), E.ADMIT),
    ],
)
def test_an_event_the_table_does_not_allow_names_request_state_and_event(
    before: tuple[ExchangeEvent, ...], event: ExchangeEvent
) -> None:
    lifecycle = walk(*before)
    state = lifecycle.state
    with pytest.raises(LifecycleError, match=f"'r1'.*'{event.value}'.*'{state.value}'"):
        lifecycle.fire(event)
    assert lifecycle.state is state


def test_every_state_but_done_can_be_cut() -> None:
    cuttable = {state for (state, event) in TRANSITIONS if event is E.CANCEL}
    assert cuttable == set(ExchangeState)
