"""The terminal client's address: tokens kept out of error lines, and a stale ``serve.json``.

A ``serve.json`` outlives a server killed with SIGKILL; whatever takes its port
next must never see the token. These tests write a real stale file that
points at a different program listening on loopback (a plain HTTP server that
records every byte it is sent), run the real ``wirecut console``, and check
that program's record.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from _console import Console, running_console
from _loopback import Exchange, LoopbackServer
from _support import run_wirecut
from wirecut.client import from_serve_json
from wirecut.client._address import redact

SECRET = "S3cr3t-t0ken-never-shown"


def wirecut_console(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "WIRECUT_TOKEN"}
    return run_wirecut("console", *args, timeout=60, env=env, stdin=subprocess.DEVNULL)


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# -- tokens out of error lines ----------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        f"http://127.0.0.1:99999/?token={SECRET}",  # port out of range
        f"http://127.0.0.1:80x/?token={SECRET}",  # port not a number
        f"ftp://127.0.0.1:8765/?token={SECRET}",  # scheme
        f"http://[::1/?token={SECRET}",  # IPv6 literal not closed
        f"http:///?token={SECRET}",  # no host
        f"http://127.0.0.1:99999/?a=1&token={SECRET}&b=2",
        f"http://127.0.0.1:99999/?TOKEN={SECRET}",
        f"http://user:{SECRET}@127.0.0.1:99999/",  # a password
    ],
)
def test_a_bad_console_url_is_one_line_without_its_token(url: str) -> None:
    result = wirecut_console(url, "-c", "memory list")
    assert result.returncode == 2
    assert SECRET not in result.stderr + result.stdout
    assert "[redacted]" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_console_that_is_not_there_is_named_without_its_token() -> None:
    import socket

    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        result = wirecut_console(f"http://127.0.0.1:{port}/?token={SECRET}", "-c", "sleep 0")
    assert result.returncode == 1
    assert "no console at" in result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_redact_hides_token_values_and_passwords_even_in_broken_urls() -> None:
    assert redact("http://h/?token=abc") == "http://h/?token=[redacted]"
    assert redact("http://h/?x=1&Token=abc#f") == "http://h/?x=1&Token=[redacted]#f"
    assert redact("ws://[::1/api?token=abc def") == "ws://[::1/api?token=[redacted] def"
    assert redact("http://u:pw@h:1/") == "http://u:[redacted]@h:1/"
    assert redact("next=%3Ftoken=abc") == "next=%3Ftoken=[redacted]"
    assert redact("http://h/?tokens=abc") == "http://h/?tokens=abc"  # another name


# -- a stale serve.json -----------------------------------------------------------------


class Impostor:
    """A plain HTTP server on loopback that answers everything; its record is what it saw."""

    def __init__(self, proof: str | None = None) -> None:
        self.proof = proof
        self.server = LoopbackServer(self._handle)

    def _handle(self, exchange: Exchange) -> None:
        if self.proof is not None and exchange.request.path.startswith("/api/proof"):
            exchange.json({"proof": self.proof})
        else:
            exchange.json({"error": "not found"}, status=404)

    def saw_the_token(self) -> bool:
        for request in self.server.requests:
            seen = request.path + json.dumps(request.headers) + request.body.decode("latin-1")
            if SECRET in seen:
                return True
        return False


@pytest.fixture
def impostor() -> Iterator[Impostor]:
    fake = Impostor()
    with fake.server:
        yield fake


def write_serve_json(data: Path, url: str, *, pid: int, instance: str | None = "i-1") -> None:
    data.mkdir(parents=True, exist_ok=True)
    info: dict[str, object] = {"url": url, "token": SECRET, "pid": pid}
    if instance is not None:
        info["instance"] = instance
    (data / "serve.json").write_text(json.dumps(info))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_stale_serve_json_never_sends_the_token_to_the_program_on_its_port(
    tmp_path: Path, impostor: Impostor
) -> None:
    # The pid is alive (ours: a reused pid looks just like this), so only the
    # proof can tell: the program there cannot make one.
    write_serve_json(tmp_path, impostor.server.url + "/", pid=os.getpid())
    result = wirecut_console("--data-dir", str(tmp_path), "-c", "memory list")
    assert not impostor.saw_the_token()
    assert impostor.server.requests, "the client never asked for a proof"
    assert [r.path.split("?")[0] for r in impostor.server.requests] == ["/api/proof"]
    assert result.returncode == 1
    assert len(lines(result.stderr)) == 1
    assert "did not prove it is the console that wrote" in result.stderr
    assert "the token was not sent" in result.stderr
    assert SECRET not in result.stderr


def test_a_forged_proof_is_refused_and_the_token_is_not_sent(tmp_path: Path) -> None:
    # An impostor that answers with an HMAC it could make: keyed by something
    # other than the token.
    forged = hmac.new(b"guess", b"challenge", hashlib.sha256).hexdigest()
    fake = Impostor(proof=forged)
    with fake.server:
        write_serve_json(tmp_path, fake.server.url + "/", pid=os.getpid())
        result = wirecut_console("--data-dir", str(tmp_path), "-c", "memory list")
    assert not fake.saw_the_token()
    assert result.returncode == 1
    assert "its proof was wrong" in result.stderr


def test_a_serve_json_whose_pid_is_gone_is_stale_without_a_request(
    tmp_path: Path, impostor: Impostor
) -> None:
    pid = dead_pid()
    write_serve_json(tmp_path, impostor.server.url + "/", pid=pid)
    result = wirecut_console("--data-dir", str(tmp_path), "-c", "memory list")
    assert result.returncode == 1
    assert f"is stale: its server (pid {pid}) is not running" in result.stderr
    assert impostor.server.requests == []


def test_a_serve_json_without_an_instance_is_refused_without_a_request(
    tmp_path: Path, impostor: Impostor
) -> None:
    write_serve_json(tmp_path, impostor.server.url + "/", pid=os.getpid(), instance=None)
    result = wirecut_console("--data-dir", str(tmp_path), "-c", "memory list")
    assert result.returncode == 1
    assert "names no server instance" in result.stderr
    assert impostor.server.requests == []


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    (tmp_path / "server").mkdir()
    with running_console(tmp_path / "server") as running:
        yield running


def test_the_console_that_wrote_serve_json_proves_it_and_gets_the_token(
    console: Console, tmp_path: Path
) -> None:
    data = tmp_path / "client"
    data.mkdir()
    info = {
        "url": console.server.url,
        "token": console.server.token,
        "pid": os.getpid(),
        "instance": console.server.instance,
    }
    (data / "serve.json").write_text(json.dumps(info))
    result = wirecut_console("--data-dir", str(data), "-c", "memory add proved -- it")
    assert (result.returncode, result.stdout, result.stderr) == (0, "added note #1\n", "")
    # Another instance's serve.json, same token: a live console that is not
    # the one that wrote it does not pass either.
    info["instance"] = "another-instance"
    (data / "serve.json").write_text(json.dumps(info))
    result = wirecut_console("--data-dir", str(data), "-c", "memory list")
    assert result.returncode == 1
    assert "its proof was wrong" in result.stderr


def test_api_proof_is_an_hmac_of_the_challenge_keyed_by_the_token(console: Console) -> None:
    token, instance = console.server.token, console.server.instance
    assert token is not None
    challenge = "c" * 43
    answer = httpx.get(console.server.url + "api/proof", params={"challenge": challenge})
    assert answer.status_code == 200
    assert answer.headers["cache-control"] == "no-store"
    message = b"wirecut-console-proof/1\0" + instance.encode() + b"\0" + challenge.encode()
    expected = hmac.new(token.encode(), message, hashlib.sha256).hexdigest()
    assert answer.json() == {"proof": expected}
    assert token not in answer.text
    for bad in ("", "short", "x" * 129, "c" * 42 + "!"):
        refused = httpx.get(console.server.url + "api/proof", params={"challenge": bad})
        assert refused.status_code == 400, bad


def test_api_proof_without_a_token_says_so(tmp_path: Path) -> None:
    with running_console(tmp_path, token=None) as running:
        answer = httpx.get(running.server.url + "api/proof", params={"challenge": "c" * 43})
    assert answer.status_code == 404


def test_serve_json_of_a_real_serve_names_its_instance(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "wirecut", "serve", "--port", "0", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("wirecut console: ")
        address = from_serve_json(tmp_path)
        assert address.instance
        assert address.pid == proc.pid
        result = wirecut_console("--data-dir", str(tmp_path), "-c", "sleep 0")
        assert result.returncode == 0, result.stderr
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
