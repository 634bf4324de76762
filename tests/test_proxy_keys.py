"""Client keys: named tokens; each record and ``/metrics`` carry the name, never the token.

``--keys-file`` holds ``name token`` lines; a client presents its token as
``Authorization: Bearer`` (the openai SDK) or ``x-api-key`` (Anthropic's
clients); the proxy rereads the file on reload. Through a real proxy in
front of the simulator.
"""

from __future__ import annotations

from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from _support import assert_usage_error, file_refused, run_wirecut
from test_proxy import BOUND, MESSAGES, chat, proxied
from wirecut.proxy import (
    ClientKey,
    KeysFileError,
    load_keys_file,
)

KEYS = "# the team\nalice sk-alice-1\n\nbob   sk-bob-2\n"


def test_a_keys_file_is_read_line_by_line_skipping_blanks_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(KEYS)
    assert load_keys_file(path) == (ClientKey("alice", "sk-alice-1"), ClientKey("bob", "sk-bob-2"))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("alice\n", ["line 1", "expected 'name token'"]),
        ("alice sk-1 extra\n", ["line 1", "found 3"]),
        ("al/ice sk-1\n", ["line 1", "key name"]),
        ("alice sk-1\nalice sk-2\n", ["two keys have one name"]),
        ("alice sk-1\nbob sk-1\n", ["two keys have one token"]),
        ("# nobody\n", ["holds no key"]),
    ],
)
def test_a_bad_keys_file_is_one_line_naming_the_file_and_never_a_token(
    tmp_path: Path, text: str, words: list[str]
) -> None:
    message = file_refused(load_keys_file, tmp_path / "keys", text, KeysFileError, *words)
    assert "sk-" not in message


def test_each_key_is_known_by_its_name_in_records_and_metrics(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(KEYS)
    with proxied(tmp_path, keys=load_keys_file(path), keys_file=path) as setup:
        sim, proxy = setup.sim, setup.proxy
        alice = openai.OpenAI(base_url=proxy.base_url, api_key="sk-alice-1", max_retries=0)
        alice.with_options(default_headers={"X-Request-Id": "a"}).chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
        )
        bob = anthropic.Anthropic(
            base_url=proxy.url,
            api_key=None,
            auth_token=None,
            default_headers={"x-api-key": "sk-bob-2", "X-Request-Id": "b"},
            max_retries=0,
        )
        bob.messages.create(model="m", max_tokens=5, messages=MESSAGES)  # type: ignore[arg-type]
        stranger = httpx.post(
            proxy.base_url + "/chat/completions",
            json=chat(),
            headers={"Authorization": "Bearer sk-nobody"},
            timeout=BOUND,
        )
        records = {r: setup.record(r) for r in ("a", "b")}
        metrics = httpx.get(
            proxy.url + "/metrics", headers={"x-api-key": "sk-alice-1"}, timeout=BOUND
        ).text
        reached = len(sim.requests())
    assert records["a"]["key"] == "alice"
    assert records["b"]["key"] == "bob"
    assert stranger.status_code == 401
    assert reached == 2
    for name, route in (("alice", "chat"), ("bob", "messages")):
        assert (
            f'wirecut_proxy_outcomes_total{{key="{name}",reason="",status="ok",'
            f'upstream="{sim.base_url}"}} 1.0'
        ) in metrics, route
        assert f'wirecut_proxy_started_after_client_left_total{{key="{name}"' in metrics
    assert "sk-alice" not in metrics
    assert "sk-bob" not in metrics


def test_a_reload_takes_new_keys_and_drops_old_ones(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(KEYS)
    with proxied(tmp_path, keys=load_keys_file(path), keys_file=path) as setup:
        proxy = setup.proxy

        def status(token: str) -> int:
            headers = {"Authorization": f"Bearer {token}"}
            return httpx.get(proxy.url + "/health", headers=headers, timeout=BOUND).status_code

        before = (status("sk-bob-2"), status("sk-carol-3"))
        path.write_text("alice sk-alice-1\ncarol sk-carol-3\n")
        assert proxy.reload() is True
        after = (status("sk-bob-2"), status("sk-carol-3"))
        path.write_text("carol\n")  # A broken file: the keys in force stay.
        assert proxy.reload() is False
        kept = status("sk-carol-3")
    assert before == (200, 401)
    assert after == (401, 200)
    assert kept == 200


def test_the_command_refuses_keys_and_a_token_file_together(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(KEYS)
    token = tmp_path / "token"
    token.write_text("t0k\n")
    result = run_wirecut(
        "proxy", "--keys-file", str(path), "--token-file", str(token), "--data-dir", "."
    )
    assert_usage_error(result, "--keys-file and --token-file exclude each other")


def test_the_command_refuses_a_bad_keys_file_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("alice sk-1\nbob\n")
    result = run_wirecut("proxy", "--keys-file", str(path), "--data-dir", str(tmp_path))
    assert_usage_error(result, str(path), "line 2")
