"""Several upstreams: the config file, routing by model, admission per upstream, SIGHUP reload.

``--config FILE`` names the upstreams (TOML ``[[upstream]]`` tables); a
request goes to the upstream that serves its ``model``, each upstream with
its own queue; ``/v1/models`` is the union; an unknown model is a ``404``
that lists the known ones; SIGHUP rereads the file without touching a live
stream, and a file with an error changes nothing and says so in one line.
Two simulators as the upstreams, the CLI as a process for the signal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from _support import BOUND, PROCESS_BOUND, assert_usage_error, file_refused, run_wirecut
from test_proxy import MESSAGES, Setup, post, read_response
from wirecut.proxy import ConfigFileError, ProxyConfig, ProxyServer, UpstreamSpec, load_config_file
from wirecut.simulator import EventKind, SimConfig, SimulatorServer

CHAT = SimConfig(slots=1, tokens_per_second=100, prompt_ms=5, endless=True, model="chat-small")
CODER = SimConfig(slots=1, tokens_per_second=100, prompt_ms=5, endless=True, model="coder")


@contextlib.contextmanager
def two_upstreams(tmp_path: Path) -> Iterator[tuple[SimulatorServer, SimulatorServer, Setup]]:
    """A proxy before a chat simulator (``chat-*``) and a coder (``coder``, ``coder-big``)."""
    with SimulatorServer(CHAT) as chat_sim, SimulatorServer(CODER) as coder_sim:
        config = ProxyConfig(
            upstreams=(
                UpstreamSpec(chat_sim.base_url, ("chat-*",)),
                UpstreamSpec(coder_sim.base_url, ("coder", "coder-big")),
            ),
            port=0,
            data_dir=tmp_path,
        )
        with ProxyServer(config) as proxy:
            yield chat_sim, coder_sim, Setup(chat_sim, proxy, tmp_path)


def ask(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES, **extra}


# -- routing --------------------------------------------------------------------------------


def test_requests_route_by_model_and_each_upstream_admits_its_own(tmp_path: Path) -> None:
    with two_upstreams(tmp_path) as (chat_sim, coder_sim, setup):
        # One slot each: with one queue for both, the second would wait.
        talk = post(setup.proxy.port, ask("chat-x", stream=True), headers={"X-Request-Id": "t"})
        chat_sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)
        code = post(setup.proxy.port, ask("coder", stream=True), headers={"X-Request-Id": "c"})
        coder_sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)
        health = setup.health()
        talk.close()
        code.close()
        records = {r: setup.record(r) for r in ("t", "c")}
    assert [r.route for r in chat_sim.requests()] == ["/v1/chat/completions"]
    assert [r.route for r in coder_sim.requests()] == ["/v1/chat/completions"]
    assert health["requests"] == {"in_flight": 2, "queued": 0}
    assert [(u["url"], u["models"], u["requests"]) for u in health["upstreams"]] == [
        (chat_sim.base_url, ["chat-*"], {"in_flight": 1, "queued": 0}),
        (coder_sim.base_url, ["coder", "coder-big"], {"in_flight": 1, "queued": 0}),
    ]
    assert records["t"]["upstream"] == chat_sim.base_url
    assert records["c"]["upstream"] == coder_sim.base_url


def test_an_exact_name_wins_over_a_prefix_and_a_longer_prefix_over_a_shorter() -> None:
    from wirecut.proxy._routing import Router

    specs = [
        UpstreamSpec("http://127.0.0.1:1/v1", ("*",)),
        UpstreamSpec("http://127.0.0.1:2/v1", ("qwen*",)),
        UpstreamSpec("http://127.0.0.1:3/v1", ("qwen-coder*", "qwen")),
    ]
    router = Router(tuple(_Named(spec) for spec in specs))  # type: ignore[arg-type]
    assert [router.route(m).spec.url[-4] for m in ("qwen", "qwen-7b", "qwen-coder-7b", "x")] == [  # type: ignore[union-attr]
        "3",
        "2",
        "3",
        "1",
    ]


class _Named:
    def __init__(self, spec: UpstreamSpec) -> None:
        self.spec = spec


def test_an_unknown_model_is_a_404_that_lists_the_known_ones_in_each_apis_shape(
    tmp_path: Path,
) -> None:
    with two_upstreams(tmp_path) as (chat_sim, coder_sim, setup):
        client = openai.OpenAI(base_url=setup.proxy.base_url, api_key="none", max_retries=0)
        with pytest.raises(openai.NotFoundError) as openai_error:
            client.chat.completions.create(model="llama", messages=MESSAGES)  # type: ignore[arg-type]
        claude = anthropic.Anthropic(base_url=setup.proxy.url, api_key="none", max_retries=0)
        with pytest.raises(anthropic.NotFoundError) as anthropic_error:
            claude.messages.create(model="llama", max_tokens=5, messages=MESSAGES)  # type: ignore[arg-type]
        reached = chat_sim.requests() + coder_sim.requests()
    body: Any = openai_error.value.body
    assert body["code"] == "model_not_found"
    assert body["param"] == "model"
    assert body["message"] == (
        "the model 'llama' is not served here (models: chat-*, coder, coder-big)"
    )
    shaped: Any = anthropic_error.value.body
    assert shaped["type"] == "error"
    assert "chat-*, coder, coder-big" in shaped["error"]["message"]
    assert reached == []


def test_models_is_the_union_of_what_each_upstream_serves(tmp_path: Path) -> None:
    with two_upstreams(tmp_path) as (_, _, setup):
        listed = httpx.get(setup.proxy.base_url + "/models", timeout=BOUND).json()
        one = httpx.get(setup.proxy.base_url + "/models/coder", timeout=BOUND)
        unknown = httpx.get(setup.proxy.base_url + "/models/llama", timeout=BOUND)
    ids = [entry["id"] for entry in listed["data"]]
    # chat-small: the chat upstream lists it and chat-* routes it there; coder
    # is listed by its upstream; coder-big is configured, not listed upstream.
    assert ids == ["chat-small", "coder", "coder-big"]
    assert listed["data"][2]["created"] is None  # Not known: not guessed.
    assert one.status_code == 200
    assert one.json()["id"] == "coder"
    assert unknown.status_code == 404


def test_a_reload_with_more_slots_admits_a_queued_request_at_once(tmp_path: Path) -> None:
    with SimulatorServer(dataclasses.replace(CHAT, slots=2)) as sim:
        path = tmp_path / "proxy.toml"
        write_config(path, [(sim.base_url, ["chat-*"], 1)])
        config = ProxyConfig(upstreams=load_config_file(path), config_file=path, port=0)
        with ProxyServer(config) as proxy:
            setup = Setup(sim, proxy, tmp_path)
            first = post(proxy.port, ask("chat-a", stream=True))
            sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)
            second = post(proxy.port, ask("chat-b", stream=True))
            setup.wait_health(lambda h: h["requests"]["queued"] == 1)
            write_config(path, [(sim.base_url, ["chat-*"], 2)])
            assert proxy.reload() is True
            second_id = sim.wait_for(
                lambda e: e.kind == EventKind.FIRST_TOKEN and e.request_id != "req-1", BOUND
            ).request_id
            health = setup.health()
            first.close()
            second.close()
    assert second_id == "req-2"
    assert health["requests"] == {"in_flight": 2, "queued": 0}


# -- the config file ------------------------------------------------------------------------


def write_config(path: Path, upstreams: list[tuple[str, list[str], int | str]]) -> None:
    tables = [
        f'[[upstream]]\nurl = "{url}"\nmodels = {json.dumps(models)}\nslots = {json.dumps(slots)}\n'
        for url, models, slots in upstreams
    ]
    path.write_text("\n".join(tables))


def test_a_config_file_names_each_upstream_with_its_key_slots_and_timeout(tmp_path: Path) -> None:
    (tmp_path / "coder.key").write_text("sk-coder\n")
    path = tmp_path / "proxy.toml"
    path.write_text(
        '[[upstream]]\nurl = "http://127.0.0.1:8080/v1"\nmodels = ["chat-*"]\n\n'
        '[[upstream]]\nurl = "http://127.0.0.1:8081/v1/"\nmodels = ["coder"]\nslots = 2\n'
        'api_key_file = "coder.key"\ntimeout = 30\n'
    )
    assert load_config_file(path) == (
        UpstreamSpec("http://127.0.0.1:8080/v1", ("chat-*",), "auto", None, None),
        UpstreamSpec("http://127.0.0.1:8081/v1", ("coder",), 2, "sk-coder", 30.0),
    )


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[[upstream]\nurl = 1", ["not valid TOML", "line 1"]),
        ("", ["no [[upstream]] table"]),
        ('port = 1\n[[upstream]]\nurl = "http://a/v1"', ["unknown setting 'port'"]),
        ('[[upstream]]\nurl = "http://a/v1"\nslot = 2', ["line 3", "upstream #1", "'slot'"]),
        ('[[upstream]]\nmodels = ["a"]', ["line 1", "'url' is required"]),
        (
            '[[upstream]]\nurl = "http://a/v1"\n\n[[upstream]]\nurl = "http://b/v1"\nslots = 0',
            ["line 6", "upstream #2", "'slots'", "not 0"],
        ),
        ('[[upstream]]\nurl = "ftp://a"', ["line 2", "upstream #1", "http://"]),
        ('[[upstream]]\nurl = "http://a/v1"\nmodels = ["a*b"]', ["line 3", "'a*b'"]),
        ('[[upstream]]\nurl = "http://a/v1"\ntimeout = -1', ["line 3", "'timeout'"]),
        (
            '[[upstream]]\nurl = "http://a/v1"\napi_key_file = "none.key"',
            ["line 3", "none.key", "cannot be read"],
        ),
        (
            '[[upstream]]\nurl = "http://a/v1"\nmodels = ["m"]\n'
            '[[upstream]]\nurl = "http://b/v1"\nmodels = ["m"]',
            ["'m' is claimed by two upstreams"],
        ),
    ],
)
def test_a_bad_config_file_is_one_line_naming_the_file_and_where(
    tmp_path: Path, text: str, words: list[str]
) -> None:
    file_refused(load_config_file, tmp_path / "proxy.toml", text, ConfigFileError, *words)


def test_a_bad_upstream_url_is_refused_without_showing_its_credentials() -> None:
    with pytest.raises(ValueError, match="upstream must be an http:// or https:// URL") as caught:
        UpstreamSpec("ftp://user:hunter2@host/v1")
    assert "hunter2" not in str(caught.value)
    assert "ftp://host/v1" in str(caught.value)


def test_the_command_refuses_a_bad_config_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text('[[upstream]]\nurl = "http://a/v1"\nslots = "many"\n')
    result = run_wirecut("proxy", "--config", str(path), "--data-dir", str(tmp_path))
    assert_usage_error(result, str(path), "line 3", "'slots'")


def test_the_command_refuses_config_with_upstream_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "proxy.toml"
    write_config(path, [("http://127.0.0.1:1/v1", ["*"], "auto")])
    result = run_wirecut(
        "proxy", "--config", str(path), "--upstream", "http://127.0.0.1:2/v1", "--data-dir", "."
    )
    assert_usage_error(result, "--config and --upstream exclude each other")


# -- SIGHUP -----------------------------------------------------------------------------------


class Proxied:
    """``wirecut proxy --config FILE`` as a process, its stderr read line by line as it comes."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "wirecut", "proxy", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={k: v for k, v in os.environ.items() if k != "WIRECUT_PROXY_TOKEN"},
        )
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True)
        self._reader.start()
        line = self.proc.stdout.readline()
        assert line.startswith("wirecut proxy: http://"), (line, self.said(0))
        self.base_url = line.split(": ", 1)[1].strip()
        self.port = int(self.base_url.rsplit(":", 1)[1].split("/")[0])

    def _read(self, pipe: Any) -> None:
        for line in pipe:
            self.lines.put(line.rstrip("\n"))

    def said(self, bound: float = BOUND, containing: str = "") -> str:
        """The next stderr line holding ``containing`` (within ``bound`` seconds)."""
        deadline = time.monotonic() + bound
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return ""
            if containing in line:
                return line

    def hangup(self) -> None:
        self.proc.send_signal(signal.SIGHUP)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(PROCESS_BOUND)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()


def test_sighup_reloads_the_config_while_a_stream_of_a_removed_upstream_runs_to_its_end(
    tmp_path: Path,
) -> None:
    path = tmp_path / "proxy.toml"
    with SimulatorServer(CHAT) as chat_sim, SimulatorServer(CODER) as coder_sim:
        write_config(path, [(chat_sim.base_url, ["chat-*"], "auto")])
        command = Proxied("--config", str(path), "--data-dir", str(tmp_path))
        url = command.base_url + "/chat/completions"
        try:
            live = post(command.port, ask("chat-x", stream=True, max_tokens=300))
            chat_sim.wait_for_event(EventKind.FIRST_TOKEN, timeout=BOUND)
            # The chat upstream leaves the config; a coder comes.
            write_config(path, [(coder_sim.base_url, ["coder"], "auto")])
            command.hangup()
            reloaded = command.said(containing="reloaded")
            during = httpx.get(command.base_url.removesuffix("/v1") + "/health").json()
            coder = httpx.post(
                command.base_url + "/chat/completions",
                json=ask("coder", max_tokens=3),
                timeout=BOUND,
            )
            gone = httpx.post(url, json=ask("chat-x"), timeout=BOUND)
            # A file with an error changes nothing, and says so.
            path.write_text('[[upstream]]\nurl = "http://127.0.0.1:1/v1"\nslots = 0\n')
            command.hangup()
            refused = command.said(containing="reload")
            still = httpx.post(
                command.base_url + "/chat/completions",
                json=ask("coder", max_tokens=3),
                timeout=BOUND,
            )
            status, _, body = read_response(live)
            live.close()
        finally:
            code = command.stop()
        (streamed,) = chat_sim.requests()
    chunks = [line for line in body.decode().split("\n\n") if '"content":"' in line]
    assert code == 0
    assert "reloaded: 1 upstream(s) serving coder" in reloaded
    assert status == 200
    # The stream was live at the reload (its upstream no longer listed) and ran whole.
    assert during["requests"]["in_flight"] == 1
    assert [u["url"] for u in during["upstreams"]] == [coder_sim.base_url]
    assert len(chunks) == 300
    assert body.endswith(b"data: [DONE]\n\n")
    assert streamed.closed_by_peer is False
    assert coder.status_code == 200
    assert gone.status_code == 404
    assert "reload refused" in refused
    assert f"{path}, line 3: upstream #1: 'slots'" in refused
    assert still.status_code == 200
    assert len(coder_sim.requests()) == 2
