"""``serve.json`` has one owner: a second ``wirecut serve`` neither takes it nor deletes it.

Real ``wirecut serve`` processes on one data directory: the first writes
the file; a second one serves at its own URL, says in one warning line that
the first owns the file, leaves it as it was, and leaves it in place when it
stops; ``wirecut console`` without a URL still reaches the first. A file
left by a server that died is taken over.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _console import serving
from _support import PROCESS_BOUND
from wirecut.simulator import SimConfig, SimulatorServer


@pytest.fixture
def provider() -> Iterator[tuple[str, ...]]:
    with SimulatorServer(SimConfig(slots=1)) as sim:
        yield ("--provider-url", sim.base_url)


def _read(data_dir: Path) -> dict[str, Any]:
    info: dict[str, Any] = json.loads((data_dir / "serve.json").read_text())
    return info


def _console_c(data_dir: Path, line: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wirecut", "console", "--data-dir", str(data_dir), "-c", line],
        capture_output=True,
        text=True,
        timeout=PROCESS_BOUND,
        stdin=subprocess.DEVNULL,
    )


def test_a_second_serve_leaves_the_first_ones_serve_json_as_it_is_and_in_place(
    tmp_path: Path, provider: tuple[str, ...]
) -> None:
    with serving(tmp_path, *provider) as first:
        owned = _read(tmp_path)
        assert first.url == f"{owned['url']}?token={owned['token']}"
        with serving(tmp_path, *provider) as second:
            assert second.url != first.url
            assert _read(tmp_path) == owned  # not taken over
        assert _read(tmp_path) == owned  # not deleted by the second's stop
        reached = _console_c(tmp_path, "sleep 0")
        assert reached.returncode == 0, reached.stderr
    assert not (tmp_path / "serve.json").exists()  # the owner's stop removes it
    warnings = [line for line in second.err.splitlines() if "another console" in line]
    assert len(warnings) == 1, second.err
    assert f"pid {owned['pid']}" in warnings[0]
    assert owned["url"] in warnings[0]
    assert "another console" not in first.err


def test_a_serve_json_left_by_a_server_that_died_is_taken_over(
    tmp_path: Path, provider: tuple[str, ...]
) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    stale = {"url": "http://127.0.0.1:9/", "token": "old", "pid": int(dead.stdout), "instance": "x"}
    (tmp_path / "serve.json").write_text(json.dumps(stale))
    with serving(tmp_path, *provider) as running:
        taken = _read(tmp_path)
        assert taken["pid"] != stale["pid"]
        assert running.url == f"{taken['url']}?token={taken['token']}"
        assert (tmp_path / "serve.json").stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "serve.json").exists()
    assert "another console" not in running.err
    assert os.path.exists(tmp_path / "serve.lock")  # kept: see ServeFile
