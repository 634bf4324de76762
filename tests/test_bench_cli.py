"""``wirecut bench``: writes ``bench.json`` in docs/protocol.md's format, and ``bench.png``.

One real run in a subprocess (``--quick`` with the hidden ``--concurrency``
and ``--window`` to keep it short): real simulators, a real console, real
baseline hosts. The checks are on shape and counts, never on timings:
wirecut's cut requests are all seen closed and leave no worker, the naive
host's are never closed and all leave their worker running.
"""

from __future__ import annotations

import datetime
import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import wirecut
from wirecut.proof._bench import bound

SYSTEMS = ["wirecut", "naive", "anyio-abandon", "openai-close"]
SCENARIOS = ["stream", "non-stream", "curator"]
LEVELS = [1, 2]


@pytest.fixture(scope="module")
def bench_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("bench")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "wirecut",
            "bench",
            "--quick",
            "--concurrency",
            ",".join(map(str, LEVELS)),
            "--window",
            "0.5",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return run, out


@pytest.fixture(scope="module")
def report(bench_run: tuple[subprocess.CompletedProcess[str], Path]) -> dict[str, Any]:
    run, out = bench_run
    assert run.returncode == 0, run.stdout + run.stderr
    loaded: dict[str, Any] = json.loads((out / "bench.json").read_text())
    return loaded


def _checkout_commit() -> str | None:
    """The short commit of the checkout the tested ``wirecut`` comes from, if it is one."""
    package = Path(wirecut.__file__).resolve().parent
    top = subprocess.run(
        ["git", "-C", str(package), "rev-parse", "--show-toplevel"],
        capture_output=True,
        text=True,
        check=False,
    )
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() / "src" / "wirecut" != package:
        return None
    return subprocess.run(
        ["git", "-C", str(package), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _is_ms(value: Any) -> bool:
    return value is None or (isinstance(value, float | int) and value >= 0)


def test_bench_json_matches_the_protocol_format(report: dict[str, Any]) -> None:
    assert isinstance(report["version"], str)
    assert isinstance(report["machine"]["cpus"], int)
    assert isinstance(report["machine"]["python"], str)
    rows = report["rows"]
    cells = {(r["system"], r["scenario"], r["concurrency"]) for r in rows}
    assert cells == {(s, sc, n) for s in SYSTEMS for sc in SCENARIOS for n in LEVELS}
    assert len(rows) == len(cells)
    for row in rows:
        assert set(row) == {
            "system",
            "scenario",
            "concurrency",
            "trials",
            "cancel_to_complete_ms",
            "cancel_to_provider_close_ms",
            "slot_seconds_after_cancel",
            "leaked",
        }
        assert row["trials"] >= row["concurrency"]
        assert row["trials"] % row["concurrency"] == 0
        assert set(row["cancel_to_complete_ms"]) == {"p50", "p99"}
        assert set(row["cancel_to_provider_close_ms"]) == {"p50", "p99", "never"}
        for figure in (*row["cancel_to_complete_ms"].values(), row["slot_seconds_after_cancel"]):
            assert _is_ms(figure)
        close = row["cancel_to_provider_close_ms"]
        assert _is_ms(close["p50"])
        assert _is_ms(close["p99"])
        assert 0 <= close["never"] <= row["trials"]
        # A figure never reached is null, with its count in "never".
        assert (close["p99"] is None) == (close["never"] == row["trials"])
        assert isinstance(row["leaked"], int)


def test_bench_json_says_which_commit_ran_when_and_how(
    bench_run: tuple[subprocess.CompletedProcess[str], Path], report: dict[str, Any]
) -> None:
    machine = report["machine"]
    assert machine["commit"] == _checkout_commit()
    ran_on = datetime.date.fromisoformat(machine["date"])
    today = datetime.datetime.now(datetime.UTC).date()
    assert today - datetime.timedelta(days=1) <= ran_on <= today
    out = bench_run[1]
    assert report["command"] == f"wirecut bench --quick --concurrency 1,2 --window 0.5 --out {out}"


def test_bench_measures_wirecut_closing_and_the_naive_host_leaking(
    report: dict[str, Any],
) -> None:
    for row in report["rows"]:
        close = row["cancel_to_provider_close_ms"]
        if row["system"] == "wirecut":
            assert close["never"] == 0, row
            assert row["leaked"] == 0, row
        if row["system"] == "naive":
            assert close["never"] == row["trials"], row
            assert row["leaked"] == row["trials"], row


def test_bench_reports_the_consoles_own_figures(report: dict[str, Any]) -> None:
    console = report["console"]
    assert console["sleep0_commands_per_second"] > 0
    assert _is_ms(console["memory_per_command_kib"])
    assert console["workers"] == max(LEVELS)


def test_bench_writes_a_png_and_prints_the_table(
    bench_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    run, out = bench_run
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "cancel->provider close" in run.stdout
    assert all(system in run.stdout for system in SYSTEMS)


def test_bench_refuses_a_bad_concurrency() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "wirecut", "bench", "--concurrency", "0,x"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert run.returncode == 2
    assert "Traceback" not in run.stderr


def test_a_bench_that_runs_out_of_descriptors_ends_with_one_line(tmp_path: Path) -> None:
    # 24 open files: the console child (which inherits the limit) fails its
    # first WebSocket handshake, or a child cannot even be started.
    def few_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (24, 24))

    run = subprocess.run(
        [
            *(sys.executable, "-m", "wirecut", "bench", "--quick", "--concurrency", "1"),
            *("--window", "0.1", "--out", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=few_files,
    )
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, run.stderr


def test_bench_bounds_grow_with_the_batch_and_with_a_busy_machine() -> None:
    assert bound(30.0, 1, load=0.5) == bound(30.0, 1, load=1.0)
    assert bound(30.0, 64, load=1.0) > bound(30.0, 1, load=1.0)
    assert bound(30.0, 64, load=3.0) == 3 * bound(30.0, 64, load=1.0)
