"""Usage is never lost, and what cannot be known is null: the ``complete`` frame's ``usage``.

End to end: a real console (uvicorn, a WebSocket) whose ``chat`` talks to a
scripted loopback provider or the simulator, the simulator once as a
separate process killed mid-stream. ``usage.requests`` counts every request
sent (a retried 500, a refused prompt, a cut one); tokens that arrived are
counted whatever ended the request; a count nobody told us is ``null``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _console import ConsoleClient, running_console
from _loopback import Exchange, LoopbackServer
from _support import PROCESS_BOUND as BOUND
from wirecut.console.server import ConsoleConfig, ConsoleServer
from wirecut.launch import Provider
from wirecut.provider import ChatClient, ProviderStatusError, Usage
from wirecut.simulator import SimConfig

MESSAGES = [{"role": "user", "content": "hi"}]


def chunk(content: str) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": content}}],
    }


@contextlib.contextmanager
def console_over(url: str, tmp_path: Path) -> Iterator[ConsoleClient]:
    """A console whose provider is ``url``, and a client connected to it."""
    provider = Provider(url, None, "loopback (tests)")
    with ConsoleServer(ConsoleConfig(port=0, data_dir=tmp_path), provider) as console:
        with ConsoleClient(console.ws_url) as client:
            yield client


def chat(client: ConsoleClient, line: str = "chat hello") -> dict[str, Any]:
    complete: dict[str, Any] = client.complete(client.run(line), BOUND)
    return complete


# -- a request that failed -------------------------------------------------------------------


def test_a_stream_that_broke_after_40_tokens_keeps_them_and_its_request(tmp_path: Path) -> None:
    def breaks(ex: Exchange) -> None:
        ex.start_chunked()
        for i in range(40):
            ex.chunk(f"data: {json.dumps(chunk(f't{i} '))}\n\n".encode())
        ex.close()  # The connection drops: no terminating chunk, no [DONE].

    with LoopbackServer(breaks) as server, console_over(server.url, tmp_path) as client:
        complete = chat(client)
    assert complete["status"] == "error"
    assert complete["error"].startswith("chat failed: connection to ")
    assert complete["usage"] == {"prompt_tokens": None, "completion_tokens": 40, "requests": 1}


def test_three_retried_server_errors_count_three_requests(tmp_path: Path) -> None:
    def fails(ex: Exchange) -> None:
        ex.json({"error": "boom"}, 500, headers={"Retry-After": "0"})

    with LoopbackServer(fails) as server, console_over(server.url, tmp_path) as client:
        complete = chat(client)
        # The console's start asked for the slots (GET /slots, /props) first.
        assert len([r for r in server.requests if r.method == "POST"]) == 3
    assert complete["status"] == "error"
    assert "HTTP 500" in complete["error"]
    # Nothing arrived (0); what the provider did with the prompt, nobody said (null).
    assert complete["usage"] == {"prompt_tokens": None, "completion_tokens": 0, "requests": 3}


def test_a_prompt_that_overflows_the_context_counts_its_request(tmp_path: Path) -> None:
    refused = {
        "error": {
            "code": 400,
            "message": "the request exceeds the available context size",
            "type": "exceed_context_size_error",
        }
    }
    with LoopbackServer(lambda ex: ex.json(refused, 400)) as server:
        with console_over(server.url, tmp_path) as client:
            complete = chat(client)
    assert complete["status"] == "error"
    assert "exceeds the available context size" in complete["error"]
    assert complete["usage"] == {"prompt_tokens": None, "completion_tokens": 0, "requests": 1}


def test_a_provider_that_cannot_be_reached_sent_no_request(tmp_path: Path) -> None:
    with LoopbackServer(lambda ex: None) as server:
        url = server.url
    with console_over(url, tmp_path) as client:  # Nothing listens there any more.
        complete = chat(client)
    assert complete["status"] == "error"
    assert complete["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0}


# -- a request that was cut ------------------------------------------------------------------


def test_a_cancelled_chat_counts_what_arrived_and_its_prompt_is_unknown(tmp_path: Path) -> None:
    with running_console(tmp_path) as console, console.client() as client:
        id = client.run("chat tell me a story")
        client.wait_for(lambda f: f.get("id") == id and f["type"] == "output", BOUND)
        client.cancel(id)
        complete = client.complete(id, BOUND)
        streamed = client.output(id)
    assert complete["status"] == "cancelled"
    usage = complete["usage"]
    assert usage["prompt_tokens"] is None  # the provider's count comes last, and never came
    assert usage["requests"] == 1
    # Every token the user saw was counted (the simulator's tokens are words).
    assert usage["completion_tokens"] >= len(streamed.split()) >= 1


def test_a_finished_chat_carries_the_providers_own_counts(tmp_path: Path) -> None:
    sim = SimConfig(slots=2, tokens_per_second=500, prompt_ms=5, reply_tokens=12)
    with running_console(tmp_path, sim=sim) as console, console.client() as client:
        complete = chat(client, "chat four words of prompt")
    assert complete["status"] == "ok"
    usage = complete["usage"]
    assert usage["completion_tokens"] == 12
    assert isinstance(usage["prompt_tokens"], int)
    assert usage["prompt_tokens"] > 0
    assert usage["requests"] == 1


@pytest.fixture
def simulator_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wirecut",
            "provider",
            "--port",
            "0",
            "--endless",
            "--tokens-per-second",
            "50",
            "--prompt-ms",
            "5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("wirecut provider: http://"), line
        yield proc, line.split()[2]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(BOUND)
        assert proc.stdout is not None
        proc.stdout.close()


def test_a_simulator_killed_mid_stream_leaves_its_tokens_counted(
    tmp_path: Path, simulator_process: tuple[subprocess.Popen[str], str]
) -> None:
    proc, url = simulator_process
    with console_over(url, tmp_path) as client:
        id = client.run("chat tell me a story")
        client.wait_for(lambda f: f.get("id") == id and len(client.output(id).split()) >= 5, BOUND)
        os.kill(proc.pid, signal.SIGKILL)
        complete = client.complete(id, BOUND)
        streamed = client.output(id)
    assert complete["status"] == "error"
    usage = complete["usage"]
    assert usage["requests"] == 1
    assert usage["prompt_tokens"] is None
    assert usage["completion_tokens"] >= len(streamed.split()) >= 5


# -- the sum ----------------------------------------------------------------------------------


def test_a_sum_with_an_unknown_count_is_unknown_and_requests_always_add() -> None:
    total = Usage()
    total.add(Usage(10, 5, 15, requests=1))
    assert total == Usage(10, 5, 15, requests=1)
    total.add(Usage(None, 3, None, requests=1, estimated=True))
    assert total == Usage(None, 8, None, requests=2, estimated=True)
    total.add(Usage(7, None, None, requests=1))
    assert total == Usage(None, None, None, requests=3, estimated=True)


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        ({"prompt_tokens": 5, "completion_tokens": 2}, Usage(5, 2, 7, requests=1)),
        ({"completion_tokens": 2}, Usage(None, 2, None, requests=1)),
        ({"prompt_tokens": "5", "completion_tokens": 2.5}, Usage(None, None, None, requests=1)),
        ({"prompt_tokens": True, "completion_tokens": -1}, Usage(None, None, None, requests=1)),
        ({"prompt_tokens": 10**400, "completion_tokens": 1}, Usage(None, 1, None, requests=1)),
    ],
)
def test_the_providers_counts_are_taken_as_given_and_anything_else_is_unknown(
    sent: dict[str, Any], expected: Usage
) -> None:
    def answer(ex: Exchange) -> None:
        ex.sse(
            [
                {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"}]},
                {"choices": [], "usage": sent},
            ]
        )

    with LoopbackServer(answer) as server, ChatClient(server.url) as client:
        assert client.chat(MESSAGES).usage == expected


def test_the_error_of_a_failed_call_carries_its_usage() -> None:
    with LoopbackServer(
        lambda ex: ex.json({"error": "busy"}, 503, headers={"Retry-After": "0"})
    ) as server:
        with (
            ChatClient(server.url, max_retries=1) as client,
            pytest.raises(ProviderStatusError) as caught,
        ):
            client.chat(MESSAGES)
    assert caught.value.usage == Usage(None, 0, None, requests=2)
