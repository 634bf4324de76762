"""``wirecut repro``: the seed incident replayed, and the facts of its cancel.

Each test runs the real command in a subprocess (``python -m wirecut repro``):
a console in that process, the simulator in one of its own, a real
WebSocket, a real cancel.
The assertions read docs/protocol.md's output form: one ``name: value`` line per
fact, then the figures, then the timeline; ``baseline:`` before the naive
host's facts.
"""

from __future__ import annotations

import subprocess

import pytest

from _support import run_wirecut

FACTS = ("request_exited", "worker_exited", "provider_saw_close", "slot_free")
FIGURES = ("cancel_to_complete_ms", "cancel_to_provider_close_ms")


def _repro(*args: str) -> subprocess.CompletedProcess[str]:
    return run_wirecut("repro", *args, timeout=50)


def _section(lines: list[str]) -> dict[str, str]:
    """The ``name: value`` lines up to the timeline."""
    values: dict[str, str] = {}
    for line in lines:
        if line == "timeline:":
            break
        name, _, value = line.partition(": ")
        values[name] = value
    return values


def _parse(stdout: str) -> tuple[dict[str, str], list[str], dict[str, str] | None]:
    lines = stdout.splitlines()
    split = lines.index("baseline:") if "baseline:" in lines else len(lines)
    ours = lines[:split]
    timeline = ours[ours.index("timeline:") + 1 :]
    baseline = _section(lines[split + 1 :]) if split < len(lines) else None
    return _section(ours), timeline, baseline


@pytest.fixture(scope="module")
def with_baseline() -> subprocess.CompletedProcess[str]:
    return _repro("--baseline")


def test_repro_prints_every_fact_true_and_exits_0() -> None:
    run = _repro()
    assert run.returncode == 0, run.stdout + run.stderr
    facts, timeline, baseline = _parse(run.stdout)
    assert list(facts) == [*FACTS, *FIGURES]
    assert {facts[name] for name in FACTS} == {"true"}
    for name in FIGURES:
        assert float(facts[name]) >= 0
    assert baseline is None
    events = [line.split("ms", 1)[1].strip() for line in timeline]
    assert events[0] == "cancel_requested"
    assert "worker_exited" in events
    assert "provider_saw_close" in events
    # The console said "cancelled" only after its worker had exited.
    assert events.index("worker_exited") < events.index("complete (cancelled)")


def test_baseline_prints_the_naive_hosts_facts_false_after_wirecuts(
    with_baseline: subprocess.CompletedProcess[str],
) -> None:
    run = with_baseline
    facts, _, baseline = _parse(run.stdout)
    assert {facts[name] for name in FACTS} == {"true"}
    assert baseline is not None
    assert list(baseline) == [*FACTS, *FIGURES]
    # The naive host said "cancelled" at once, with its worker and request still running
    # and the provider still decoding into the only slot.
    assert {baseline[name] for name in FACTS} == {"false"}
    assert baseline["cancel_to_provider_close_ms"] == "never"
    assert float(baseline["cancel_to_complete_ms"]) >= 0


def test_repro_exit_code_follows_wirecuts_facts_only(
    with_baseline: subprocess.CompletedProcess[str],
) -> None:
    assert with_baseline.returncode == 0, with_baseline.stderr


def test_bad_provider_url_is_a_usage_error() -> None:
    run = _repro("--provider-url", "ftp://example")
    assert run.returncode == 2
    assert "http://" in run.stderr
    assert "Traceback" not in run.stderr
