"""The README's Python examples run as written, against the server the README says to start.

Every ```python block of README.md runs in a fresh interpreter, as a user
pasting it would, against the simulator configured as ``wirecut provider
--endless`` (the README's instruction). The one liberty: the simulator
listens on a free port, and the example's ``http://127.0.0.1:8080`` (the
provider's default port, checked below) is replaced by its URL, so that the
test never depends on port 8080 being free.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from _support import PROCESS_BOUND as BOUND
from wirecut.cli._provider import provider
from wirecut.simulator import EventKind, SimConfig, SimulatorServer

README = Path(__file__).resolve().parent.parent / "README.md"
SERVER_COMMAND = "wirecut provider --endless"
URL = re.compile(r"http://127\.0\.0\.1:(\d+)")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """Each ```python block as (line number of its first code line, code)."""
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL):
        line = text.count("\n", 0, match.start(1)) + 1
        blocks.append((line, match.group(1)))
    return blocks


BLOCKS = python_blocks(README.read_text())


def _option(name: str) -> click.Parameter:
    return next(param for param in provider.params if param.name == name)


def test_the_readme_has_python_examples_and_names_their_server() -> None:
    assert BLOCKS, "README.md has no ```python block"
    assert f"`{SERVER_COMMAND}`" in README.read_text()
    # What the README's command serves is what the test serves: the simulator
    # with its defaults (the provider's defaults are SimConfig's), endless,
    # on the provider's default port, the one the examples name.
    defaults = SimConfig()
    for name in ("slots", "tokens_per_second", "prompt_ms", "reply_tokens"):
        assert _option(name).default == getattr(defaults, name), name
    ports = {int(port) for _, code in BLOCKS for port in URL.findall(code)}
    assert ports <= {_option("port").default}, ports


@pytest.fixture
def simulator() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimConfig(endless=True)) as server:
        yield server


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"README.md:{n}" for n, _ in BLOCKS])
def test_readme_example_runs_as_written(simulator: SimulatorServer, line: int, code: str) -> None:
    runnable = URL.sub(simulator.url, code)
    result = subprocess.run(
        [sys.executable, "-c", runnable],
        capture_output=True,
        text=True,
        timeout=BOUND,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"README.md:{line} failed:\n{result.stderr}"
    # Every request the example made has ended on the provider's side too.
    for request in simulator.requests():
        simulator.wait_for_event(EventKind.REQUEST_FINISHED, request.id, timeout=BOUND)
    assert all(slot["is_processing"] is False for slot in simulator.slots())
