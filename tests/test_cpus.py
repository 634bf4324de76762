"""``wirecut serve --cpus``: the console's threads on the CPUs given, its commands' programs not.

And ``wirecut bench --console-cpus``: the bench's console on the CPUs given,
the bench and what it starts on the others.

End to end: a real ``wirecut serve --cpus N`` process, every one of its
threads read from ``/proc``, and the program a ``probe subprocess`` command
runs read the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _console import serve_argv, serving
from wirecut._cpus import CpuError, confined, parse_cpus
from wirecut.proof._console_client import ConsoleClient
from wirecut.proof._console_process import ConsoleProcess
from wirecut.scope import InterruptScope, set_child_cpus

BOUND = 30.0


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("1", {1}), ("0,2", {0, 2}), ("2-3", {2, 3}), ("0, 3-5", {0, 3, 4, 5}), ("4-4", {4})],
)
def test_a_cpu_list_parses_as_taskset_reads_it(text: str, cpus: set[int]) -> None:
    assert parse_cpus(text) == cpus


@pytest.mark.parametrize("text", ["", "x", "1-", "-1", "3-1", "1,,2", "1.5"])
def test_a_malformed_cpu_list_is_refused_naming_it(text: str) -> None:
    with pytest.raises(CpuError, match="CPU"):
        parse_cpus(text)


@pytest.mark.parametrize(("program", "flag"), [("serve", "--cpus"), ("bench", "--console-cpus")])
@pytest.mark.parametrize(("given", "word"), [("x", "'x'"), ("4096", "4096")])
def test_a_bad_cpu_list_flag_is_a_usage_error_naming_it(
    tmp_path: Path, program: str, flag: str, given: str, word: str
) -> None:
    if program == "serve":
        argv = serve_argv(tmp_path, flag, given)
    else:
        argv = [sys.executable, "-m", "wirecut", program, flag, given]
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=BOUND, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert flag in error
    assert word in error


def cpus_allowed(pid: int, tid: int | None = None) -> str:
    """``Cpus_allowed_list`` of a process (its main thread), or of one of its threads."""
    where = f"/proc/{pid}" if tid is None else f"/proc/{pid}/task/{tid}"
    for line in Path(where, "status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list in {where}/status")


def test_serve_runs_its_threads_on_the_cpus_given_and_a_commands_program_on_all(
    tmp_path: Path,
) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs to tell the pinned set from the whole")
    mine = cpus_allowed(os.getpid())
    chosen = allowed[-1]
    with serving(
        tmp_path,
        *("--cpus", str(chosen), "--workers", "4"),
        *("--provider-url", "http://127.0.0.1:9/v1"),
        stdin=subprocess.DEVNULL,
    ) as running:
        with ConsoleClient(running.ws_url) as client:
            id = client.run("probe subprocess")
            said = client.wait_for(lambda f: "(pid " in f.get("data", ""), BOUND, id=id)
            child = int(said.frame["data"].split("(pid ", 1)[1].split(")")[0].split(",")[0])
            pid = running.proc.pid
            threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
            # Every thread of the console is on it: the loop, pinned at start, and
            # the worker running the probe, started later (workers start on demand).
            assert len(threads) >= 2
            assert {cpus_allowed(pid, tid) for tid in threads} == {str(chosen)}
            # The program its command runs is not the console's to confine.
            assert cpus_allowed(child) == mine
            client.cancel(id)
            assert client.complete(id, BOUND).frame["status"] == "cancelled"
    assert f"wirecut serve: on CPUs {chosen}" in running.err.splitlines()


def test_scope_popen_starts_its_programs_on_the_cpus_set_for_children() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs to tell one from the whole")
    one = allowed[0]
    scope = InterruptScope("cpus")
    set_child_cpus(frozenset({one}))
    try:
        with scope.popen(["sleep", "60"], stdin=subprocess.DEVNULL) as proc:
            assert cpus_allowed(proc.pid) == str(one)
            scope.cancel("done")
    finally:
        set_child_cpus(None)
    after = InterruptScope("after")
    with after.popen(["sleep", "60"], stdin=subprocess.DEVNULL) as proc:
        assert cpus_allowed(proc.pid) == cpus_allowed(os.getpid())  # its starter's again
        after.cancel("done")


def test_the_benchs_console_leaves_the_confined_cpus_it_inherits_for_its_own(
    tmp_path: Path,
) -> None:
    """``wirecut bench --console-cpus``: what the bench confines, and what its console pins."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs to tell the console's from the rest")
    mine = cpus_allowed(os.getpid())
    chosen = allowed[-1]
    rest = ",".join(map(str, allowed[:-1])) if len(allowed) == 2 else None
    with confined(frozenset(allowed[:-1])):
        # Started here, as the bench starts it: it must leave the set it inherits.
        console = ConsoleProcess("http://127.0.0.1:9/v1", tmp_path, 4, frozenset({chosen}))
        with console, subprocess.Popen(["sleep", "60"]) as helper:
            try:
                with ConsoleClient(console.ws_url) as client:
                    ids = {client.run("sleep 0") for _ in range(8)}  # workers start on demand
                    client.completes(ids, BOUND)
                pid = console.pid
                assert pid is not None
                threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
                assert len(threads) >= 3
                assert {cpus_allowed(pid, tid) for tid in threads} == {str(chosen)}
                # What the bench starts meanwhile (its simulators) stays off them.
                if rest is not None:
                    assert cpus_allowed(helper.pid) == rest
                assert str(chosen) not in cpus_allowed(helper.pid).split(",")
            finally:
                helper.kill()
    assert cpus_allowed(os.getpid()) == mine  # the bench has every CPU back
