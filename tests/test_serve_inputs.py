"""Bad input to ``wirecut serve`` and to its commands: one clear line, and nothing lost.

Each case is tried as a user meets it: a real ``wirecut serve`` process (its
exit code, its stderr), or a real console over a WebSocket (the ``complete``
frame, the server's log). A bad flag or variable is a usage error (exit 2);
a store that cannot serve is one line naming the file (exit 1); a bad
command line completes ``error`` with its usage, and logs no traceback.
"""

from __future__ import annotations

import http.server
import logging
import os
import socket
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from _console import Console, running_console, serve_argv, serving
from _support import PROCESS_BOUND as BOUND
from _support import assert_one_line_failure, assert_usage_error
from wirecut.memory import NoteStore
from wirecut.provider import ProviderKind, base_url_problem, identify_provider
from wirecut.simulator import SimConfig, SimulatorServer

#: The variables that name a provider; cleared so that the machine's own do not leak in.
PROVIDER_ENV = ("WIRECUT_PROVIDER_URL", "OPENAI_BASE_URL", "OPENAI_API_KEY")


def serve_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PROVIDER_ENV}
    return {**env, **extra}


def serve(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``wirecut serve ARGS`` that is expected to exit by itself."""
    return subprocess.run(
        serve_argv(tmp_path, *args),
        env=serve_env(**env),
        capture_output=True,
        text=True,
        timeout=BOUND,
        stdin=subprocess.DEVNULL,
    )


def serve_banner(tmp_path: Path, *args: str, **env: str) -> list[str]:
    """Start ``wirecut serve``, wait until it serves, stop it; its stderr lines.

    Serving at all (the ``wirecut console:`` line) is part of what is checked:
    a provider that does not answer never stops the console.
    """
    with serving(tmp_path, *args, env=serve_env(**env), stdin=subprocess.DEVNULL) as running:
        pass
    return running.err.splitlines()


# -- the provider URL --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("not a url", ["'not a url'", "http:// or https://"]),
        ("ftp://x/v1", ["'ftp://x/v1'", "http:// or https://"]),
        ("http://127.0.0.1:99999/v1", ["port 99999"]),
        ("http:///v1", ["no valid host"]),
    ],
)
def test_a_malformed_provider_url_flag_is_a_usage_error(
    tmp_path: Path, url: str, words: list[str]
) -> None:
    assert_usage_error(serve(tmp_path, "--provider-url", url), "--provider-url", *words)


@pytest.mark.parametrize("variable", ["WIRECUT_PROVIDER_URL", "OPENAI_BASE_URL"])
def test_a_malformed_provider_url_variable_is_a_usage_error_naming_it(
    tmp_path: Path, variable: str
) -> None:
    result = serve(tmp_path, **{variable: "not a url"})
    assert_usage_error(result, f"${variable}", "'not a url'")


def test_base_url_problem_accepts_what_the_client_takes() -> None:
    for url in ("http://127.0.0.1:8080/v1", "https://api.openai.com/v1", "http://[::1]:80/v1"):
        assert base_url_problem(url) is None, url


# -- the note store ----------------------------------------------------------------------


def test_serve_on_a_file_that_is_not_a_database_is_one_line_naming_it(tmp_path: Path) -> None:
    store = tmp_path / "notes.db"
    store.write_bytes(b"these are not the bytes of an SQLite database, " * 20)
    before = store.read_bytes()
    result = serve(tmp_path, "--provider-url", "http://127.0.0.1:9/v1")
    assert_one_line_failure(result, str(store), "not a database")
    assert store.read_bytes() == before  # nothing lost


def test_serve_on_a_store_with_a_newer_schema_is_one_line_naming_it(tmp_path: Path) -> None:
    store = tmp_path / "notes.db"
    NoteStore(store).add("Kept", "as it was")
    with sqlite3.connect(store) as conn:
        conn.execute("PRAGMA user_version = 99")
    conn.close()
    with sqlite3.connect(store) as conn:
        dump = "\n".join(conn.iterdump())
    conn.close()
    result = serve(tmp_path, "--provider-url", "http://127.0.0.1:9/v1")
    assert_one_line_failure(result, str(store), "schema version 99", "upgrade wirecut")
    with sqlite3.connect(store) as conn:
        assert "\n".join(conn.iterdump()) == dump
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 99
    conn.close()


# -- what answers at start ------------------------------------------------------------------


@pytest.fixture
def sim() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimConfig(slots=1)) as server:
        yield server


@pytest.mark.parametrize(
    ("how", "source"),
    [
        ("flag", "--provider-url"),
        ("WIRECUT_PROVIDER_URL", "WIRECUT_PROVIDER_URL"),
        ("OPENAI_BASE_URL", "OPENAI_BASE_URL"),
    ],
)
def test_the_banner_says_where_the_provider_url_came_from_and_what_answered(
    tmp_path: Path, sim: SimulatorServer, how: str, source: str
) -> None:
    if how == "flag":
        lines = serve_banner(tmp_path, "--provider-url", sim.base_url)
    else:
        lines = serve_banner(tmp_path, **{how: sim.base_url})
    assert f"wirecut serve: provider: {sim.base_url} (from {source})" in lines
    (check,) = [line for line in lines if line.startswith("wirecut serve: provider check: ")]
    assert check.endswith(
        f"an OpenAI-compatible API answered at {sim.base_url} (the wirecut simulator)"
    )


def test_the_banner_says_how_many_requests_the_provider_is_handed_at_once(
    tmp_path: Path, sim: SimulatorServer
) -> None:
    lines = serve_banner(tmp_path, "--provider-url", sim.base_url)  # a simulator of 1 slot
    assert (
        "wirecut serve: provider requests: at most 1 in flight, the others wait in line "
        "(slots from /slots)"
    ) in lines


def test_a_provider_url_without_v1_is_told_to_try_v1_at_start(
    tmp_path: Path, sim: SimulatorServer
) -> None:
    root = sim.base_url.removesuffix("/v1")
    lines = serve_banner(tmp_path, "--provider-url", root)
    (check,) = [line for line in lines if line.startswith("wirecut serve: provider check: ")]
    assert "GET /models gave HTTP 404" in check
    assert check.endswith(f"usually ends in /v1: try {root}/v1)")


def test_the_flag_wins_over_the_variables(tmp_path: Path, sim: SimulatorServer) -> None:
    lines = serve_banner(
        tmp_path,
        "--provider-url",
        sim.base_url,
        WIRECUT_PROVIDER_URL="http://127.0.0.1:9/v1",
        OPENAI_BASE_URL="http://127.0.0.1:9/v1",
    )
    assert f"wirecut serve: provider: {sim.base_url} (from --provider-url)" in lines


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_provider_that_is_down_is_named_at_start_and_the_console_serves(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    lines = serve_banner(tmp_path, "--provider-url", url)
    assert any(
        line.startswith(f"wirecut serve: provider check: nothing answered at {url}: cannot connect")
        for line in lines
    ), lines


class _Html(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html><body>It works!</body></html>"
        self.send_response(404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def html_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Html)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_web_server_that_is_not_an_llm_api_is_named_at_start(
    tmp_path: Path, html_server: str
) -> None:
    lines = serve_banner(tmp_path, "--provider-url", html_server)
    (check,) = [line for line in lines if line.startswith("wirecut serve: provider check: ")]
    assert f"{html_server} answered, but not as an OpenAI API" in check
    assert "HTTP 404 text/html" in check


def test_a_silent_provider_is_named_within_the_probe_bound() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (backlog), never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        identity = identify_provider(url, timeout=0.5)
    assert identity.kind is ProviderKind.UNREACHABLE
    assert "sent nothing within" in identity.detail


def test_a_provider_that_is_not_http_is_named() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"

        def answer_garbage() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"\x00\x01garbage that is not HTTP\r\n\r\n")

        thread = threading.Thread(target=answer_garbage, daemon=True)
        thread.start()
        identity = identify_provider(url)
        thread.join(5)
    assert identity.kind is ProviderKind.NOT_OPENAI, identity
    assert "not HTTP" in identity.detail


# -- bad command lines through a real console ------------------------------------------------


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    with running_console(tmp_path) as running:
        yield running


@pytest.mark.parametrize(
    ("line", "words"),
    [
        pytest.param(
            "memory show ²",
            "the note id must be a number, not '²'; usage: memory show ID",
            id="superscript-digit",
        ),
        pytest.param(
            "memory show " + "7" * 5000,
            "the note id has more than 19 digits; usage: memory show ID",
            id="5000-digits",
        ),
        pytest.param(
            "memory show #" + "0" * 5000 + "1", "there is no note #1", id="5000-leading-zeros"
        ),
        pytest.param(
            "curator run --stale-days 1e-300",
            "--stale-days must be at least one second (1.16e-05 days), not '1e-300'",
            id="stale-days-1e-300",
        ),
        pytest.param(
            "curator run --archive-days 0.000001",
            "--archive-days must be at least one second",
            id="archive-days-below-a-second",
        ),
    ],
)
def test_a_bad_command_line_completes_as_an_error_in_one_line_and_logs_no_traceback(
    console: Console, line: str, words: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = NoteStore.in_data_dir(console.data_dir)
    before = store.dump()
    caplog.set_level(logging.ERROR, logger="wirecut")
    with console.client() as client:
        complete = client.complete(client.run(line))
        # The connection and the server go on: the next command runs.
        assert client.complete(client.run("memory list"))["status"] == "ok"
    assert complete["status"] == "error"
    assert words in complete["error"]
    assert "\n" not in complete["error"]
    assert "ValueError" not in complete["error"]
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert store.dump() == before


def test_a_long_valid_note_id_names_no_note(console: Console) -> None:
    with console.client() as client:
        complete = client.complete(client.run("memory show 9999999999999999999"))
    assert complete["status"] == "error"
    assert complete["error"] == "there is no note #9999999999999999999"


# -- the embedded llama.cpp's threads -----------------------------------------------------


def test_local_options_with_a_provider_url_are_ignored_with_one_line_each(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    lines = serve_banner(tmp_path, "--provider-url", url, "--local-threads", "2")
    assert f"wirecut serve: --local-threads is ignored: the provider is {url}" in lines
    assert not any("--local-model" in line for line in lines)


@pytest.mark.local
def test_serve_starts_the_embedded_llama_cpp_on_the_threads_it_was_given(tmp_path: Path) -> None:
    from wirecut.local import default_threads, is_available

    if not is_available():
        pytest.skip("the extra `local` is not installed")
    threads = default_threads() + 1  # not what it would run on anyway
    lines = serve_banner(tmp_path, "--local-threads", str(threads))
    providers = [line for line in lines if line.startswith("wirecut serve: provider: ")]
    assert len(providers) == 1, lines
    assert providers[0].startswith("wirecut serve: provider: embedded llama.cpp at "), providers
    assert providers[0].endswith(f", {threads} threads)"), providers
