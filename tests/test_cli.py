"""The ``wirecut`` command line as a user runs it: a real process, its exit code, its stderr.

Bad input is one clear line on stderr, never a traceback: exit 2 for a bad
flag (a usage error, click's and the protocol's convention), exit 1 for
anything else, a bad ``WIRECUT_DATA_DIR`` included.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from _loopback import LoopbackServer
from _support import assert_one_line_failure, assert_usage_error, run_wirecut
from wirecut._paths import DATA_DIR_ENV
from wirecut.cli import _SUBCOMMANDS, _LazyGroup


def wirecut(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m wirecut ARGS`` with ``env`` added to a clean environment."""
    base = {k: v for k, v in os.environ.items() if k != DATA_DIR_ENV}
    return run_wirecut(*args, env={**base, **(env or {})}, stdin=subprocess.DEVNULL)


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "not-a-folder"
    path.write_text("")
    return path


# -- wirecut local: the data directory ---------------------------------------------


def test_local_with_a_data_dir_flag_that_cannot_be_created_is_a_usage_error() -> None:
    result = wirecut("local", "--data-dir", "/proc/nonexistent")
    assert_usage_error(result, "--data-dir", "/proc/nonexistent", "cannot be used")


def test_local_with_a_data_dir_flag_naming_a_file_is_a_usage_error(a_file: Path) -> None:
    assert_usage_error(wirecut("local", "--data-dir", str(a_file)), "--data-dir", str(a_file))


def test_local_with_a_data_dir_env_that_cannot_be_created_is_one_line_and_exit_1() -> None:
    result = wirecut("local", env={DATA_DIR_ENV: "/proc/nonexistent"})
    assert_one_line_failure(result, "/proc/nonexistent", DATA_DIR_ENV)


def test_local_with_a_data_dir_env_naming_a_file_is_one_line_and_exit_1(a_file: Path) -> None:
    result = wirecut("local", env={DATA_DIR_ENV: str(a_file)})
    assert_one_line_failure(result, str(a_file), DATA_DIR_ENV)


# -- wirecut provider -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--port", "70000"], "--port"),
        (["--port", "http"], "--port"),
        (["--tokens-per-second", "nan"], "--tokens-per-second"),
        (["--tokens-per-second", "0"], "--tokens-per-second"),
        (["--prompt-ms", "-1"], "--prompt-ms"),
        (["--slots", "0"], "--slots"),
        (["--reply-tokens", "-1"], "--reply-tokens"),
        (["--no-such-flag"], "--no-such-flag"),
    ],
)
def test_provider_with_a_bad_flag_is_a_usage_error(args: list[str], flag: str) -> None:
    assert_usage_error(wirecut("provider", *args), flag)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_provider_on_a_busy_port_says_why_in_one_line(busy_port: int) -> None:
    result = wirecut("provider", "--port", str(busy_port))
    assert_one_line_failure(result, f"127.0.0.1:{busy_port}", "in use")


def test_provider_on_an_address_not_of_this_machine_says_why_in_one_line() -> None:
    # TEST-NET-1 (RFC 5737): an address literal, so no lookup leaves the machine.
    result = wirecut("provider", "--host", "192.0.2.1", "--port", "0")
    assert_one_line_failure(result, "192.0.2.1", "address")


# -- doctor and repro: the provider's API key ------------------------------------------


@pytest.fixture
def not_an_api() -> Iterator[LoopbackServer]:
    """A web server that is no OpenAI API: doctor and repro stop at once, one line."""
    with LoopbackServer(lambda ex: ex.respond(404, b"<html/>", content_type="text/html")) as s:
        yield s


def _keys(server: LoopbackServer) -> set[str | None]:
    return {request.headers.get("authorization") for request in server.requests}


@pytest.mark.parametrize("program", ["doctor", "repro"])
def test_doctor_and_repro_take_the_api_key_from_a_file_without_a_warning(
    program: str, not_an_api: LoopbackServer, tmp_path: Path
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-a-file\n")
    url = not_an_api.url + "/v1"
    result = wirecut(program, "--provider-url", url, "--api-key-file", str(key_file))
    assert result.returncode == 1, result.stderr
    assert "warning" not in result.stderr
    assert "Bearer sk-from-a-file" in _keys(not_an_api)
    assert "sk-from-a-file" not in result.stdout + result.stderr


@pytest.mark.parametrize("program", ["doctor", "repro"])
def test_doctor_and_repro_take_the_api_key_from_the_environment(
    program: str, not_an_api: LoopbackServer
) -> None:
    url = not_an_api.url + "/v1"
    result = wirecut(program, "--provider-url", url, env={"OPENAI_API_KEY": "sk-from-env"})
    assert "warning" not in result.stderr
    assert "Bearer sk-from-env" in _keys(not_an_api)


@pytest.mark.parametrize("program", ["doctor", "repro"])
def test_an_api_key_flag_of_doctor_or_repro_works_and_warns_in_one_line(
    program: str, not_an_api: LoopbackServer
) -> None:
    url = not_an_api.url + "/v1"
    result = wirecut(program, "--provider-url", url, "--api-key", "sk-flag")
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warnings == [
        f"wirecut {program}: warning: --api-key on the command line is readable by every "
        "local user (/proc/PID/cmdline); use --api-key-file FILE or $OPENAI_API_KEY"
    ]
    assert "Bearer sk-flag" in _keys(not_an_api)


@pytest.mark.parametrize("program", ["doctor", "repro"])
@pytest.mark.parametrize(
    ("content", "words"),
    [(None, ["--api-key-file", "cannot read"]), ("\n", ["--api-key-file", "is empty"])],
)
def test_a_bad_api_key_file_of_doctor_or_repro_is_a_usage_error(
    program: str, content: str | None, words: list[str], tmp_path: Path
) -> None:
    key_file = tmp_path / "key"
    if content is not None:
        key_file.write_text(content)
    url = "http://127.0.0.1:9/v1"
    assert_usage_error(
        wirecut(program, "--provider-url", url, "--api-key-file", str(key_file)), *words
    )


@pytest.mark.parametrize("name", sorted(_SUBCOMMANDS))
def test_every_option_a_help_lists_says_what_it_does(name: str) -> None:
    command = _LazyGroup._load(name)
    assert command is not None
    undescribed = [
        param.opts[0]
        for param in command.params
        if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip()
    ]
    assert undescribed == []
