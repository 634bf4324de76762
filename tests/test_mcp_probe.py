"""``wirecut mcp-probe``: the last line says whether the server stopped a cancelled call.

The probe runs as a program (``python -m wirecut mcp-probe``), against the
example server over stdio and over Streamable HTTP (in this process), on
wirecut's ``MCPServer`` (stopped: true, with the server's facts) and on the
SDK's own (null: it says nothing), and against a fake that answers a
cancelled call anyway (false). Bad input exits 2 with one usage line; a
server that cannot be used exits 1 with one error line; never a traceback.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from _mcp import EXAMPLE, SRC, example, serve_http

FAKE = Path(__file__).resolve().parent / "_fake_mcp.py"
BOUND = 60.0  # seconds for a whole probe: a start, a call, its cancel, the wait for the facts
# The server's command: its environment is the SDK's safe default, so `env` brings the path.
SERVER = shlex.join(["env", f"PYTHONPATH={SRC}", sys.executable, str(EXAMPLE)])


def probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wirecut", "mcp-probe", *args],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=BOUND,
        stdin=subprocess.DEVNULL,
    )


def last_json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert isinstance(report, dict)
    assert set(report) == {"server", "tool", "cancel_after_s", "stopped", "facts"}
    return report


def one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_against_wirecuts_server_the_stop_is_confirmed() -> None:
    result = probe(SERVER, "wait", "--args", '{"seconds": 300}', "--cancel-after", "0.5")
    report = last_json(result)
    assert report["server"] == SERVER
    assert report["tool"] == "wait"
    assert report["cancel_after_s"] == 0.5
    assert report["stopped"] is True
    assert report["facts"]["tool"] == "wait"
    assert report["facts"]["reason"] == "cancelled"
    assert report["facts"]["worker_exited"] is True
    assert "stopped: yes" in result.stdout


def test_against_wirecuts_server_over_http_the_stop_is_confirmed() -> None:
    with serve_http(example.build()) as url:
        report = last_json(
            probe(url, "wait", "--args", '{"seconds": 300}', "--cancel-after", "0.5")
        )
    assert report["stopped"] is True
    assert report["facts"]["tool"] == "wait"


def test_against_the_plain_sdk_nothing_can_be_known() -> None:
    result = probe(
        f"{SERVER} --plain",
        *("wait", "--args", '{"seconds": 2}', "--cancel-after", "0.3"),
        *("--confirm-timeout", "0.5"),
    )
    report = last_json(result)
    assert report["stopped"] is None
    assert report["facts"] is None
    assert "stopped: unknown" in result.stdout


def test_a_server_that_answers_anyway_did_not_stop() -> None:
    fake = shlex.join([sys.executable, str(FAKE), "answers-anyway"])
    report = last_json(probe(fake, "echo", "--cancel-after", "0.3"))
    assert report["stopped"] is False
    assert report["facts"] is None


def test_a_call_that_answers_before_the_cancel_probes_nothing() -> None:
    result = probe(SERVER, "wait", "--args", '{"seconds": 0}', "--cancel-after", "5")
    report = last_json(result)
    assert report["stopped"] is None
    assert "answered before the cancel" in result.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--args", "[1"], ["--args", "not JSON"]),
        (["--args", "[1, 2]"], ["--args", "JSON object"]),
        (["--cancel-after", "-1"], ["--cancel-after", ">= 0"]),
        (["--cancel-after", "nan"], ["--cancel-after"]),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], words: list[str]) -> None:
    line = one_error_line(probe(SERVER, "wait", *args), 2)
    assert all(word in line for word in words), line


def test_an_unknown_tool_is_one_error_line_naming_the_tools() -> None:
    line = one_error_line(probe(SERVER, "nope"), 1)
    assert "no tool 'nope'" in line
    assert "fetch, run, wait" in line


def test_a_server_that_does_not_start_is_one_error_line() -> None:
    line = one_error_line(probe("/no/such/server", "wait"), 1)
    assert "did not start" in line


def test_a_server_that_speaks_garbage_is_one_error_line() -> None:
    fake = shlex.join([sys.executable, str(FAKE), "garbage"])
    line = one_error_line(probe(fake, "echo"), 1)
    assert "not MCP" in line
