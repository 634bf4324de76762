"""The embedded real llama.cpp (``wirecut.local``, ``wirecut local``).

Needs the extra ``local``; the tests that run llama.cpp skip cleanly without
it. One ``LocalServer`` serves the whole file (module fixture). The CLI tests
come first on purpose: a module fixture starts at its first use, so the
``wirecut local`` subprocess never runs beside the fixture's server (the test
machines have two cores).

The chat requests go through ``open_chat()``: ``wirecut.provider.ChatClient``
on a thread owned by an ``InterruptScope``, cut by ``scope.cancel()``, stream
and non-stream on the wire.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import wirecut.local
from _console import ConsoleClient, wait_health
from wirecut.cli import main
from wirecut.console.server import ConsoleConfig, ConsoleServer
from wirecut.launch import Provider
from wirecut.local import (
    GEMMA_MODEL_NAME,
    MODEL_NAME,
    LocalServer,
    LocalServerError,
    ServerState,
    default_threads,
    ensure_gemma,
    is_available,
    usable_cpus,
)
from wirecut.provider import ChatClient, ChatResult
from wirecut.scope import InterruptScope
from wirecut.scope._process import proc_stat, proc_stats

pytestmark = pytest.mark.local

needs_extra = pytest.mark.skipif(not is_available(), reason="the extra `local` is not installed")

MAX_TOKENS = 2000
# llama.cpp restarts its 1 s wait for a closed non-streaming request on every
# result, /slots and /metrics answers included: keep our polls further apart.
MONITOR_SPACING_S = 1.5
RELEASE_BOUND_S = 10.0


# -- helpers ------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie counts as dead (docs/architecture.md, fact 8)."""
    stat = proc_stat(pid)
    return stat is not None and stat.alive


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _children_of(pid: int) -> list[int]:
    return [stat.pid for stat in proc_stats() if stat.ppid == pid]


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read()


class Monitor:
    """Reads ``/slots`` and ``/metrics``, never more often than every 1.5 s."""

    def __init__(self, root_url: str) -> None:
        self.root_url = root_url
        self._last = -MONITOR_SPACING_S

    def _pace(self) -> None:
        # Pacing, not waiting for an outcome: see MONITOR_SPACING_S.
        delay = self._last + MONITOR_SPACING_S - time.monotonic()
        if delay > 0:
            threading.Event().wait(delay)
        self._last = time.monotonic()

    def slots(self) -> list[dict[str, Any]]:
        self._pace()
        slots: list[dict[str, Any]] = json.loads(_get(self.root_url + "/slots")[1])
        return slots

    def tokens_predicted(self) -> int:
        self._pace()
        text = _get(self.root_url + "/metrics")[1].decode()
        match = re.search(r"^llamacpp:tokens_predicted_total (\S+)$", text, re.MULTILINE)
        assert match is not None, text
        return int(float(match.group(1)))

    def prompt_tokens(self) -> int:
        """Prompt tokens llama.cpp took up so far, from its cache or not: one more task's worth
        for each task it started."""
        self._pace()
        text = _get(self.root_url + "/metrics")[1].decode()
        total = 0.0
        for name in ("prompt_tokens_total", "prompt_tokens_cached_total"):
            match = re.search(rf"^llamacpp:{name} (\S+)$", text, re.MULTILINE)
            assert match is not None, text
            total += float(match.group(1))
        return int(total)

    def wait_all_released(self, bound: float = RELEASE_BOUND_S) -> float:
        """Poll /slots until no slot processes; the seconds it took."""
        start = time.monotonic()
        while True:
            busy = [slot["id"] for slot in self.slots() if slot["is_processing"]]
            if not busy:
                return time.monotonic() - start
            assert time.monotonic() - start < bound, f"slots {busy} still busy after {bound} s"


def n_decoded(slot: dict[str, Any]) -> int:
    next_token = slot.get("next_token") or [{}]
    if isinstance(next_token, dict):
        next_token = [next_token]
    return int(next_token[0].get("n_decoded", 0))


class ChatCall:
    """One chat completion in flight through ``wirecut.provider`` under its own scope.

    The request runs on a thread owned by the scope; ``cut()`` is
    ``scope.cancel()``, which shuts the request's socket down
    (docs/architecture.md, fact 1) while the worker keeps and closes it.
    """

    def __init__(self, base_url: str, *, stream: bool) -> None:
        self.scope = InterruptScope("local-test")
        self._client = ChatClient(base_url, model=MODEL_NAME, wire_stream=stream)
        self._cond = threading.Condition()
        self.content_chunks = 0
        self.result: Future[ChatResult] = self.scope.spawn(
            self._client.chat,
            [{"role": "user", "content": "Count from one to ten thousand."}],
            stream=stream,
            on_token=self._on_token,
            max_tokens=MAX_TOKENS,
            temperature=0,
            ignore_eos=True,  # a base model may stop early otherwise
        )

    def _on_token(self, text: str) -> None:
        with self._cond:
            self.content_chunks += 1
            self._cond.notify_all()

    @property
    def done(self) -> bool:
        return self.result.done()

    def wait_for_chunks(self, count: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.content_chunks >= count or self.done, timeout)

    def cut(self) -> None:
        self.scope.cancel("test")

    def join(self, timeout: float = 5.0) -> None:
        result = self.result.result(timeout)
        assert result.interrupted, "the request ended before the cut"
        assert self.scope.wait_quiescent(timeout), self.scope.live()
        self._client.close()


def open_chat(base_url: str, *, stream: bool) -> ChatCall:
    """Start a long chat completion; the client part of these tests."""
    return ChatCall(base_url, stream=stream)


# -- without a server ---------------------------------------------------------


def test_local_help_names_the_options() -> None:
    result = CliRunner().invoke(main, ["local", "--help"])
    assert result.exit_code == 0
    for option in ("--host", "--port", "--data-dir", "--model", "--threads", "--fetch-model"):
        assert option in result.output


def test_local_without_the_extra_exits_2_saying_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wirecut.local, "is_available", lambda: False)
    result = CliRunner().invoke(main, ["local"])
    assert result.exit_code == 2
    assert "pip install 'wirecut[local]'" in result.stderr
    assert result.stdout == ""


def test_server_refuses_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="port"):
        LocalServer(tmp_path, port=70000)
    with pytest.raises(ValueError, match="startup_timeout"):
        LocalServer(startup_timeout=float("nan"))
    with pytest.raises(ValueError, match=r"the path of a \.gguf file, not"):
        LocalServer(tmp_path)  # a folder is no model


def test_default_threads_leave_half_the_cpus_to_other_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # llama.cpp's threads wait for each other at every step: one whose core
    # another process takes stalls them all (docs/local-model.md, "Threads").
    monkeypatch.setattr(wirecut.local._server, "_cpu_quota", lambda *paths: None)
    for cpus, threads in ((1, 1), (2, 1), (3, 1), (4, 2), (6, 3), (8, 4), (64, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)))
        assert default_threads() == threads, cpus
        assert LocalServer().threads == threads
    assert LocalServer(threads=3).threads == 3
    with pytest.raises(ValueError, match="threads"):
        LocalServer(threads=0)


@pytest.mark.parametrize(
    ("cgroup", "files", "cpus"),
    [
        ("0::/box\n", {"box/cpu.max": "200000 100000\n"}, 2),  # v2, 2 CPUs
        ("0::/box\n", {"box/cpu.max": "150000 100000\n"}, 2),  # 1.5 CPUs: 2 threads' worth
        ("0::/box\n", {"box/cpu.max": "max 100000\n"}, 8),  # no quota
        ("0::/\n", {"cpu.max": "100000 100000\n"}, 1),  # a container's own root
        (
            "4:cpu,cpuacct:/box\n1:memory:/box\n",
            {
                "cpu,cpuacct/box/cpu.cfs_quota_us": "300000",
                "cpu,cpuacct/box/cpu.cfs_period_us": "100000",
            },
            3,
        ),  # v1
        (
            "1:cpu:/\n",
            {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
            8,
        ),  # v1, no quota
        ("0::/gone\n", {}, 8),  # unreadable: the affinity alone
        ("garbage\n", {}, 8),
    ],
)
def test_usable_cpus_are_the_affinity_capped_by_the_cgroup_quota(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cgroup: str, files: dict[str, str], cpus: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    (tmp_path / "self-cgroup").write_text(cgroup)
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text)
    assert usable_cpus(tmp_path / "fs", tmp_path / "self-cgroup") == cpus


def test_data_dir_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from wirecut._paths import default_data_dir

    monkeypatch.setenv("WIRECUT_DATA_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path
    monkeypatch.delenv("WIRECUT_DATA_DIR")
    assert default_data_dir().name == "wirecut"


@needs_extra
def test_ensure_gemma_reuses_a_checked_file_and_replaces_a_bad_one(tmp_path: Path) -> None:
    path = ensure_gemma(tmp_path)
    assert path == tmp_path / "models" / f"{GEMMA_MODEL_NAME}.gguf"
    first = path.stat()
    sidecar = json.loads(path.with_name(path.name + ".json").read_text())
    assert sidecar["size"] == first.st_size

    assert ensure_gemma(tmp_path).stat().st_ino == first.st_ino  # cached

    with path.open("r+b") as fh:  # an interrupted copy, say
        fh.truncate(first.st_size // 2)
    assert ensure_gemma(tmp_path).stat().st_size == first.st_size
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".part")] == []


# -- the CLI (before the module server starts: see the module docstring) ------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir for ``--data-dir``; the model is in the per-user cache (scripts/test warms it)."""
    return tmp_path_factory.mktemp("wirecut-local-data")


def _read_line(stream: Any, timeout: float) -> str:
    fd = stream.fileno()
    deadline = time.monotonic() + timeout
    buffer = b""
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no line within {timeout} s (got {buffer!r})"
        readable, _, _ = select.select([fd], [], [], remaining)
        if readable:
            chunk = os.read(fd, 4096)
            assert chunk, f"EOF before a full line (got {buffer!r})"
            buffer += chunk
    return buffer.decode()


@needs_extra
@pytest.mark.timeout(90)
def test_cli_serves_until_sigterm_then_exits_0_and_reaps_llama_cpp(data_dir: Path) -> None:
    argv = [sys.executable, "-m", "wirecut", "local", "--data-dir", str(data_dir)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            line = _read_line(proc.stdout, timeout=60)
            match = re.fullmatch(r"wirecut local: (http://127\.0\.0\.1:(\d+)/v1) \((.+)\)\n", line)
            assert match is not None, line
            assert match.group(3) == MODEL_NAME
            root = match.group(1).removesuffix("/v1")
            assert _get(root + "/health") == (200, b'{"status":"ok"}')
            # The llama.cpp child, and the group reaper (scope._reaper) that
            # would kill its group if `local` died without stopping it.
            children = _children_of(proc.pid)
            servers = [pid for pid in children if b"wirecut.local._child" in _cmdline(pid)]
            assert len(servers) == 1, children
            assert len(children) == 2, children

            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.stderr is not None
        stderr = proc.stderr.read().decode()
        assert "SmolLM2-135M-Instruct is a tiny instruction-tuned model" in stderr
        assert "base" not in stderr
        threads = default_threads()
        assert f"wirecut local: {threads} llama.cpp thread{'s' if threads > 1 else ''}\n" in stderr
    assert not _alive(servers[0])  # Reaped by `local` itself before it exited.
    # The reaper ends once `local` has exited (its pipe closes): poll for it.
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(_alive(pid) for pid in children)


@needs_extra
@pytest.mark.timeout(90)
def test_llama_cpp_runs_on_the_threads_it_was_given() -> None:
    with LocalServer(threads=1) as local:
        log = local.stderr_tail()
    assert re.search(r"n_threads = 1$", log, re.MULTILINE), log


@needs_extra
def test_start_timeout_raises_and_reaps_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    local = LocalServer(startup_timeout=0.5)
    spawn = local._spawn

    def spawn_stopped(model: Any) -> subprocess.Popen[bytes]:
        # Stopped, the child never listens: the bound passes on any machine
        # (a fast one started SmolLM2 within 0.5 s).
        proc = spawn(model)
        os.kill(proc.pid, signal.SIGSTOP)
        return proc

    monkeypatch.setattr(local, "_spawn", spawn_stopped)
    with pytest.raises(LocalServerError, match=r"within 0\.5 s"):
        local.start()
    assert local.state is ServerState.STOPPED
    assert local.pid is not None
    assert not _alive(local.pid)
    with pytest.raises(RuntimeError, match="state 'stopped'"):
        local.start()


# -- the embedded server ------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    if not is_available():
        pytest.skip("the extra `local` is not installed")
    local = LocalServer()
    with local:
        pid = local.pid
        yield local
    assert pid is not None
    assert local.state is ServerState.STOPPED
    assert not _alive(pid), "the llama.cpp child survived stop()"
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # nothing is left in its process group either


@pytest.fixture(scope="module")
def monitor(server: LocalServer) -> Monitor:
    return Monitor(server.root_url)


def test_server_answers_health_and_lists_its_model(server: LocalServer) -> None:
    assert server.state is ServerState.RUNNING
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", server.base_url)
    assert _get(server.root_url + "/health")[0] == 200
    models = json.loads(_get(server.base_url + "/models")[1])
    assert [m["id"] for m in models["data"]] == [MODEL_NAME]


def test_server_applies_the_models_own_chatml_template(server: LocalServer) -> None:
    request = urllib.request.Request(
        server.root_url + "/apply-template",
        data=json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        prompt = json.loads(response.read())["prompt"]
    # SmolLM2's template, from its GGUF; it adds its default system message.
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.timeout(60)
def test_uncut_requests_keep_both_slots_decoding(server: LocalServer, monitor: Monitor) -> None:
    """The control: without a cut llama.cpp holds the slots, so the next test can fail."""
    plain = open_chat(server.base_url, stream=False)
    streamed = open_chat(server.base_url, stream=True)
    try:
        # The stream's tokens are the clock (~1 s of decoding at ~30 tok/s a
        # slot on an idle machine; the bound leaves room for a loaded one).
        assert streamed.wait_for_chunks(30, timeout=40), "the stream never got going"
        slots = monitor.slots()
        assert [slot["is_processing"] for slot in slots] == [True, True]
        # Counts, not rates: both slots are decoding, neither is done.
        assert all(n_decoded(slot) >= 10 for slot in slots), slots
        assert not plain.done
    finally:
        plain.cut()
        streamed.cut()
        plain.join()
        streamed.join()
        monitor.wait_all_released()


@pytest.mark.timeout(60)
def test_cut_requests_free_both_slots_and_stop_decoding(
    server: LocalServer, monitor: Monitor
) -> None:
    before = monitor.tokens_predicted()
    plain = open_chat(server.base_url, stream=False)
    streamed = open_chat(server.base_url, stream=True)
    try:
        assert streamed.wait_for_chunks(20, timeout=30), "the stream never got going"
        assert not plain.done
        assert not streamed.done
    finally:
        plain.cut()
        streamed.cut()
    plain.join()
    streamed.join()

    monitor.wait_all_released()
    predicted = monitor.tokens_predicted() - before
    assert 20 <= predicted < MAX_TOKENS // 4, predicted


def test_a_console_cancel_of_a_streaming_chat_frees_the_slot(
    server: LocalServer, monitor: Monitor, tmp_path: Path
) -> None:
    """The whole product on the real llama.cpp: a console cancel ends the decoding."""
    provider = Provider(server.base_url, MODEL_NAME, "embedded llama.cpp (test)")
    config = ConsoleConfig(port=0, data_dir=tmp_path, max_tokens=MAX_TOKENS)
    with ConsoleServer(config, provider) as console, ConsoleClient(console.ws_url) as client:
        id = client.run("chat Write a very long story about a lighthouse keeper.")
        client.wait_for(lambda f: f["type"] == "output" and f["id"] == id, timeout=60)
        assert any(slot["is_processing"] for slot in monitor.slots())
        client.cancel(id)
        complete = client.complete(id, timeout=30)
    assert complete["status"] == "cancelled"
    assert complete["lifecycle"]["worker_exited"] is True
    assert complete["lifecycle"]["open_requests"] == 0
    assert complete["usage"]["completion_tokens"] >= 1
    monitor.wait_all_released()
    predicted = monitor.tokens_predicted()
    assert monitor.tokens_predicted() == predicted  # 1.5 s later: nothing decodes


@pytest.mark.timeout(120)
def test_console_chats_cancelled_while_they_wait_for_a_slot_never_reach_llama_cpp(
    server: LocalServer, monitor: Monitor, tmp_path: Path
) -> None:
    """Four workers, two slots: the two chats beyond the slots wait in the console's line.

    llama.cpp would start them after their client left (fact 11), a prompt
    pass each for nobody; cancelled in the console's line, they never reach it.
    """
    provider = Provider(server.base_url, MODEL_NAME, "embedded llama.cpp (test)")
    config = ConsoleConfig(port=0, data_dir=tmp_path, workers=4, max_tokens=MAX_TOKENS)
    with ConsoleServer(config, provider) as console, ConsoleClient(console.ws_url) as client:
        running = [client.run(f"chat Tell me a long story about lighthouse {i}.") for i in (1, 2)]
        for id in running:
            client.wait_for(lambda f: f["type"] == "output", timeout=60, id=id)
        waiting = [client.run(f"chat Tell me a long story about lighthouse {i}.") for i in (3, 4)]
        for id in waiting:
            client.wait_for(lambda f: f["type"] == "started", timeout=30, id=id)
        line = wait_health(console, lambda h: h["admission"]["queued"] == 2)
        at_cancel = monitor.prompt_tokens()
        for id in waiting:
            client.cancel(id)
        cut = client.completes(waiting, timeout=30)
        for id in running:
            client.cancel(id)
        client.completes(running, timeout=30)
        monitor.wait_all_released()
        prompt_tokens = monitor.prompt_tokens()
    assert prompt_tokens == at_cancel  # no task started after the cancel
    assert all(complete["status"] == "cancelled" for complete in cut.values())
    assert line["admission"] == {"slots": 2, "source": "/slots", "in_flight": 2, "queued": 2}
