"""The terminal record: ``CompleteFacts`` and the one rule that decides a status."""

from __future__ import annotations

import json
from typing import Any

import pytest

from wirecut.record import (
    CompleteFacts,
    Ending,
    LifecycleFacts,
    Reason,
    Status,
    TimelineStep,
    UsageFacts,
    decide,
)

# -- the status rule -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ending", "reason", "committed", "expected"),
    [
        # Nobody cancelled: the work's own ending says it all.
        (Ending.RETURNED, None, False, (Status.OK, None, None)),
        (Ending.FAILED, None, False, (Status.ERROR, None, None)),
        (Ending.CUT, None, False, (Status.ERROR, None, None)),  # a scope of its own cut it
        # Cancelled, and the cut took effect: cancelled or timeout, with the reason.
        (Ending.CUT, Reason.USER, False, (Status.CANCELLED, Reason.USER, None)),
        (Ending.CUT, Reason.TIMEOUT, False, (Status.TIMEOUT, Reason.TIMEOUT, None)),
        (Ending.CUT, Reason.DISCONNECT, False, (Status.CANCELLED, Reason.DISCONNECT, None)),
        (Ending.FAILED, Reason.SHUTDOWN, False, (Status.CANCELLED, Reason.SHUTDOWN, None)),
        # Cancelled too late: the work returned (its commit section ended, or not).
        (Ending.RETURNED, Reason.USER, False, (Status.OK, None, Reason.USER)),
        (Ending.RETURNED, Reason.TIMEOUT, True, (Status.OK, None, Reason.TIMEOUT)),
        # Cut after a commit section ended: a partial effect, named in lifecycle.commits.
        (Ending.CUT, Reason.USER, True, (Status.CANCELLED, Reason.USER, None)),
        (Ending.FAILED, Reason.USER, True, (Status.ERROR, None, Reason.USER)),
        # A lost host: nobody saw it end, whatever it did.
        (Ending.RETURNED, Reason.LOST, True, (Status.ERROR, Reason.LOST, None)),
    ],
)
def test_the_status_follows_how_the_work_ended(
    ending: Ending,
    reason: Reason | None,
    committed: bool,
    expected: tuple[Status, Reason | None, Reason | None],
) -> None:
    assert decide(ending, reason, committed=committed) == expected


def test_cancelled_and_timeout_never_carry_a_late_cancel() -> None:
    for ending in Ending:
        for reason in [None, *Reason]:
            for committed in (False, True):
                status, _, late = decide(ending, reason, committed=committed)
                if status in (Status.CANCELLED, Status.TIMEOUT):
                    assert late is None
                    assert ending is not Ending.RETURNED


def test_a_commit_still_open_is_never_cancelled_or_ok() -> None:
    # Its effect may still happen: neither "it did not" nor "it did".
    for ending in Ending:
        for reason in Reason:
            status, _, _ = decide(ending, reason, committed=False, commit_open=True)
            assert status is Status.ERROR


# -- the wire --------------------------------------------------------------------------------


def _facts() -> CompleteFacts:
    return CompleteFacts.ended(
        Ending.RETURNED,
        Reason.USER,
        error="ignored for an ok status",
        elapsed_ms=12.3456,
        usage=UsageFacts(prompt_tokens=None, completion_tokens=40, requests=2),
        lifecycle=LifecycleFacts(
            worker_exited=True,
            open_requests=0,
            open_processes=0,
            started=True,
            timeline=(
                TimelineStep("cancel_requested", 0.0),
                TimelineStep("sockets_shut", 0.2),
            ),
        ),
    )


def test_a_record_goes_over_the_wire_and_back_unchanged() -> None:
    facts = _facts()
    wire = json.loads(json.dumps(facts.to_wire()))
    assert wire["status"] == "ok"
    assert wire["reason"] is None
    assert wire["late_cancel"] == "user"
    assert wire["error"] is None
    assert wire["usage"] == {"prompt_tokens": None, "completion_tokens": 40, "requests": 2}
    assert wire["lifecycle"]["timeline"] == [
        {"event": "cancel_requested", "ms": 0.0},
        {"event": "sockets_shut", "ms": 0.2},
    ]
    assert "node" not in wire["lifecycle"]
    assert "open_threads" not in wire["lifecycle"]
    back = CompleteFacts.from_wire({"type": "complete", "id": "c1", **wire})
    assert back.to_wire() == wire
    assert back.status is Status.OK
    assert back.late_cancel is Reason.USER


def test_a_record_without_a_timeline_has_none_on_the_wire() -> None:
    facts = CompleteFacts.failed("unknown command 'x'", elapsed_ms=0.5)
    wire = facts.to_wire()
    assert "timeline" not in wire["lifecycle"]
    assert CompleteFacts.from_wire(wire).lifecycle.timeline is None


@pytest.mark.parametrize(
    "broken",
    [
        {"status": "finished"},  # not a status
        {"reason": "bored"},  # not a reason
        {"lifecycle": {}},  # no worker_exited
    ],
)
def test_from_wire_refuses_what_is_not_a_complete(broken: dict[str, Any]) -> None:
    wire = {**_facts().to_wire(), **broken}
    with pytest.raises((KeyError, ValueError)):
        CompleteFacts.from_wire(wire)


def test_usage_sums_keep_an_unknown_count_unknown() -> None:
    total = UsageFacts(10, 5, 1) + UsageFacts(None, 7, 1)
    assert total == UsageFacts(None, 12, 2)


def test_a_cancel_while_queued_never_started_and_reached_nobody() -> None:
    facts = CompleteFacts.unstarted(Reason.TIMEOUT, elapsed_ms=3.0)
    assert facts.status is Status.TIMEOUT
    assert facts.lifecycle.started is False
    assert facts.lifecycle.worker_exited is True
    assert facts.usage == UsageFacts(0, 0, 0)
    assert [step.event for step in facts.lifecycle.timeline or ()] == ["cancel_requested"]
