"""``LocalServer``: the embedded llama.cpp server as a child process.

The console uses it as its default provider; ``wirecut local`` runs it alone.
The server child (``wirecut.local._child``) loads xllamacpp's in-process
``Server`` in its own Python process, in its own process group, listening on
loopback with two slots, ``/slots`` and ``/metrics`` on, half the CPUs as
llama.cpp threads (``default_threads()``), and the model's chat template
(docs/local-model.md).

Who may call what: ``start()``, ``stop()`` and ``wait()`` from any thread;
``stop()`` is idempotent and also runs at interpreter exit. The child never
outlives us: ``stop()`` kills its process group and reaps it (docs/architecture.md, fact
8), and if this process dies without stopping it, the child notices the end
of its stdin pipe (and, when started from the main thread on Linux, gets
``PR_SET_PDEATHSIG``) and exits; and the scope's group reaper kills its
process group.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import enum
import http.client
import json
import math
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Self

import wirecut
from wirecut.local._errors import LocalServerError, LocalUnavailable
from wirecut.local._model import (
    DEFAULT_MODEL,
    GEMMA_MODEL_NAME,
    MODEL_NAME,
    LocalModel,
    is_available,
    parse_model_spec,
    resolve_model,
)
from wirecut.scope import kill_process_group, unwatch_group, watch_group
from wirecut.serving import BackgroundServer, http_address

__all__ = ["LocalServer", "ServerState", "default_threads", "usable_cpus"]

#: llama.cpp's n_batch and n_ubatch for the embedded server (llama.cpp's own
#: defaults: 2048 and 512). llama.cpp acts on a cancelled task only between
#: batches of n_batch prompt tokens, so n_batch bounds how long a cut during
#: prompt processing keeps the slot: 256 tokens take well under a second here,
#: at the default's prompt throughput. Table: docs/cancellation-limits.md
#: (bench/bench_prefill.py).
BATCH_SIZE = 256
UBATCH_SIZE = 256
#: The most llama.cpp threads the embedded server uses by default.
MAX_THREADS = 4


def default_threads() -> int:
    """llama.cpp threads for the embedded server: half of ``usable_cpus()``, 1 to 4.

    llama.cpp's threads meet at a barrier after every step of a batch, so one
    thread whose core another process takes stalls all of them: on 2 cores,
    beside one busy process (the console itself under load is one), 2 threads
    decoded 0.5 tokens/s against 47 with 1 thread (75 and 62 idle). Leaving
    half the CPUs free keeps the decode rate when the machine is busy; the
    small default model gains little past 4. Table: docs/cancellation-limits.md
    (bench/bench_prefill.py with ``--burners``).
    """
    return max(1, min(MAX_THREADS, usable_cpus() // 2))


def usable_cpus(
    cgroup_root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = Path("/proc/self/cgroup")
) -> int:
    """The CPUs this process may run on, and no more than its cgroup's CPU quota allows.

    A container limited to 2 CPUs (``docker --cpus 2``) sees every CPU of its
    host in its affinity; its quota (cgroup v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``) says how many it gets.
    """
    cpus = len(os.sched_getaffinity(0))
    quota = _cpu_quota(cgroup_root, self_cgroup)
    return cpus if quota is None else max(1, min(cpus, math.ceil(quota)))


def _cpu_quota(cgroup_root: Path, self_cgroup: Path) -> float | None:
    """CPUs' worth of time the cgroup quota allows (None: no quota, or none readable)."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        try:
            if controllers == "":  # cgroup v2: "0::/path"
                quota, period = (cgroup_root / path.lstrip("/") / "cpu.max").read_text().split()
            elif "cpu" in controllers.split(","):  # cgroup v1: "4:cpu,cpuacct:/path"
                folder = cgroup_root / controllers / path.lstrip("/")
                quota = (folder / "cpu.cfs_quota_us").read_text().strip()
                period = (folder / "cpu.cfs_period_us").read_text().strip()
            else:
                continue
        except (OSError, ValueError):
            continue
        if quota in ("max", "-1"):
            continue
        try:
            value = int(quota) / int(period)
        except (ValueError, ZeroDivisionError):
            continue
        if value > 0:
            return value
    return None


_STDERR_TAIL_LINES = 30
_HEALTH_POLL_S = 0.05


class ServerState(enum.Enum):
    """The lifecycle of a ``LocalServer``; it only moves down this list."""

    NEW = "new"  # constructed; start() not called yet
    STARTING = "starting"  # child spawned, waiting for its address and /health
    RUNNING = "running"  # /health answered; base_url is valid
    STOPPED = "stopped"  # stop() ran or start() failed; the child is reaped


class LocalServer(BackgroundServer):
    """The real llama.cpp server with a small model, run as a child process.

    ::

        with LocalServer() as server:
            client = OpenAI(base_url=server.base_url, api_key="none")

    ``model`` is a ``LocalModel``, or what ``--model`` takes ("smollm2", the
    default, "gemma", or a ``.gguf`` path): then ``start()`` resolves it
    first (``resolve_model``: a fetch into ``cache_dir`` on first use, or the
    fallback to Gemma; ``echo`` gets those lines). ``port=0`` picks a free
    port. ``ctx_size`` is the context shared by the ``n_parallel`` slots (each
    gets ``ctx_size // n_parallel`` tokens). ``threads`` is llama.cpp's
    (default ``default_threads()``: half the CPUs, 1 to 4). ``batch_size`` and
    ``ubatch_size`` are llama.cpp's ``n_batch`` and ``n_ubatch`` (default
    ``BATCH_SIZE``, ``UBATCH_SIZE``): the prompt tokens between two looks at a
    cancelled request. ``start()`` then blocks until ``/health`` answers or
    ``startup_timeout`` seconds pass (counted from when the model file is
    ready).

    Cancellation: ``stop()`` from another thread during ``start()`` kills the
    child, and ``start()`` then raises ``LocalServerError``. A server cannot be
    restarted once stopped; make a new one.
    """

    def __init__(
        self,
        model: LocalModel | str | Path = DEFAULT_MODEL,
        *,
        cache_dir: Path | None = None,
        echo: Callable[[str], None] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        threads: int | None = None,
        n_parallel: int = 2,
        ctx_size: int = 8192,
        batch_size: int | None = None,
        ubatch_size: int | None = None,
        startup_timeout: float = 60.0,
        stop_grace: float = 2.0,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, not {port}")
        threads = default_threads() if threads is None else threads
        for name, value in (("threads", threads), ("n_parallel", n_parallel)):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")
        if ctx_size < 256 * n_parallel:
            raise ValueError(f"ctx_size must be at least 256 per slot, not {ctx_size}")
        batch_size = BATCH_SIZE if batch_size is None else batch_size
        ubatch_size = min(UBATCH_SIZE, batch_size) if ubatch_size is None else ubatch_size
        if not 1 <= ubatch_size <= batch_size:
            raise ValueError(
                f"need 1 <= ubatch_size <= batch_size, not {ubatch_size} and {batch_size}"
            )
        for name, seconds in (("startup_timeout", startup_timeout), ("stop_grace", stop_grace)):
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"{name} must be a positive number of seconds, not {seconds}")
        if isinstance(model, Path):
            model = str(model)
        if isinstance(model, str):
            parse_model_spec(model)  # a ValueError now rather than at start()
        self.cache_dir = cache_dir
        self._echo = echo
        self._spec = model
        #: The model once resolved (at construction when given as a ``LocalModel``).
        self.local_model = model if isinstance(model, LocalModel) else None
        self.host = host
        self._port = port  # what it asks for; ``port`` is where it listens
        self.threads = threads
        self.n_parallel = n_parallel
        self.ctx_size = ctx_size
        self.batch_size = batch_size
        self.ubatch_size = ubatch_size
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        #: The name the server announces (the fallback's once ``start()`` fell back).
        self.model = _name_of(model)
        # Guards _state and _proc; never held while waiting on the child, so
        # stop() can interrupt a start() that is waiting for /health.
        self._lock = threading.Lock()
        # Serialises the kill-and-reap so two stop() calls never signal a
        # process group whose leader the other one already reaped.
        self._stop_lock = threading.Lock()
        self._state = ServerState.NEW
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaped = False
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL_LINES)
        self._drain: threading.Thread | None = None
        self._base_url: str | None = None

    # -- public API ---------------------------------------------------------

    @property
    def state(self) -> ServerState:
        """Where the server is in its lifecycle."""
        return self._state

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` it listens on; valid once running (``base_url`` is the API's)."""
        if self._base_url is None:
            raise LocalServerError(
                f"the local server has no address yet (state: {self._state.value})"
            )
        return http_address(self._base_url)

    @property
    def root_url(self) -> str:
        """``http://HOST:PORT``: where ``/health``, ``/slots`` and ``/metrics`` live."""
        return self.url

    @property
    def pid(self) -> int | None:
        """The child's process id (also its process group id), once spawned."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> Self:
        """Assemble the model if needed, spawn the child and wait for ``/health``.

        Raises ``LocalUnavailable`` without the extra, ``LocalServerError``
        when the child dies, times out or is stopped meanwhile (the child is
        reaped before the error is raised), and ``RuntimeError`` when called
        in any state but NEW.
        """
        with self._lock:
            if self._state is not ServerState.NEW:
                raise RuntimeError(
                    f"Cannot start a LocalServer in state {self._state.value!r}; "
                    "a server starts once, make a new one."
                )
            if not is_available():
                raise LocalUnavailable()
            self._state = ServerState.STARTING
        try:
            model = self._resolve()
            # A first fetch may take a while: the bound is for llama.cpp's start.
            deadline = time.monotonic() + self.startup_timeout
            with self._lock:
                if self._state is not ServerState.STARTING:
                    raise LocalServerError("the local server was stopped while starting")
                proc = self._spawn(model)
                atexit.register(self.stop)
            # This thread owns the child's stdout: it reads the one line there
            # is and closes it, also when stop() runs meanwhile (fact 3).
            assert proc.stdout is not None
            with proc.stdout:
                address = self._read_address(proc, proc.stdout.fileno(), deadline)
            self._wait_healthy(proc, address, deadline)
        except BaseException:
            self.stop()
            raise
        with self._lock:
            if self._state is not ServerState.STARTING:
                raise LocalServerError("the local server was stopped while starting")
            self._base_url = address + "/v1"
            self._state = ServerState.RUNNING
        return self

    def stop(self) -> None:
        """Kill the child's process group and reap it; idempotent, any thread.

        Closes the child's stdin (it exits by itself on EOF), sends SIGTERM to
        its group, SIGKILL after ``stop_grace`` seconds, and waits for it. If
        the server was already stopped this does nothing.
        """
        with self._lock:
            self._state = ServerState.STOPPED
        with self._stop_lock:
            proc = self._proc
            if proc is None or self._reaped:
                return
            self._reaped = True
            atexit.unregister(self.stop)
            _kill_and_reap(proc, self.stop_grace)
            unwatch_group(proc.pid)
            if self._drain is not None:
                # It closes stderr itself at EOF, which comes once every
                # holder of the pipe is gone.
                self._drain.join(timeout=self.stop_grace)

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the child exits by itself; its exit status, or None on timeout.

        For a host that wants to notice the server dying (``wirecut local``
        does). Interruptible by signal handlers that raise.
        """
        proc = self._proc
        if proc is None:
            raise RuntimeError(f"no server process to wait for (state: {self._state.value})")
        if self._reaped:
            return proc.returncode
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stderr_tail(self) -> str:
        """The last lines the child wrote to stderr (llama.cpp's log)."""
        return "".join(list(self._stderr_tail))

    def __repr__(self) -> str:
        where = self._base_url or f"{self.host}:{self._port}"
        return f"<LocalServer {self._state.value} {where} ({self.model})>"

    # -- start ---------------------------------------------------------------

    def _resolve(self) -> LocalModel:
        if self.local_model is None:
            spec = self._spec
            assert isinstance(spec, str)
            self.local_model = resolve_model(spec, cache_dir=self.cache_dir, echo=self._echo)
            self.model = self.local_model.name
        return self.local_model

    def _spawn(self, model: LocalModel) -> subprocess.Popen[bytes]:
        argv = [
            sys.executable,
            "-m",
            "wirecut.local._child",
            "--model",
            str(model.path),
            "--chat-template",
            model.chat_template,
            "--alias",
            self.model,
            "--host",
            self.host,
            "--port",
            str(self._port),
            "--threads",
            str(self.threads),
            "--n-parallel",
            str(self.n_parallel),
            "--ctx-size",
            str(self.ctx_size),
            "--batch-size",
            str(self.batch_size),
            "--ubatch-size",
            str(self.ubatch_size),
        ]
        # PR_SET_PDEATHSIG fires when the *thread* that forked the child ends:
        # ask for it only from the main thread, whose end is the process's.
        if threading.current_thread() is threading.main_thread():
            argv += ["--pdeathsig-parent", str(os.getpid())]
        env = dict(os.environ)
        # The child must import this very wirecut, installed or not.
        package_root = str(Path(wirecut.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                # Its own group: a terminal's Ctrl+C reaches only us, and
                # stop() can kill the child and anything it started at once.
                start_new_session=True,
            )
        except OSError as exc:
            raise LocalServerError(f"cannot start the llama.cpp server child: {exc}") from exc
        # Dies with us even if the stdin watch cannot run (a GIL-holding
        # model load) and we did not start it from the main thread.
        watch_group(proc.pid)
        self._proc = proc
        assert proc.stderr is not None
        self._drain = threading.Thread(
            target=_drain_lines,
            args=(proc.stderr, self._stderr_tail),
            name=f"wirecut-local-stderr-{proc.pid}",
            daemon=True,
        )
        self._drain.start()
        return proc

    def _read_address(self, proc: subprocess.Popen[bytes], fd: int, deadline: float) -> str:
        buffer = b""
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                limit = self.startup_timeout
                raise self._error(proc, f"llama.cpp did not listen within {limit:g} s")
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                message = "the llama.cpp server exited before it listened"
                raise self._error(proc, message, exited=True)
            buffer += chunk
        try:
            address = json.loads(buffer.split(b"\n", 1)[0])["address"]
            port = int(str(address).rsplit(":", 1)[1])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            message = f"unexpected first line from the server child: {buffer!r}"
            raise self._error(proc, message) from exc
        return f"http://{_connect_host(self.host)}:{port}"

    def _wait_healthy(self, proc: subprocess.Popen[bytes], address: str, deadline: float) -> None:
        host, port = address.removeprefix("http://").rsplit(":", 1)
        host = host.strip("[]")
        while True:
            if self._state is not ServerState.STARTING:
                raise LocalServerError("the local server was stopped while starting")
            if proc.poll() is not None:
                raise self._error(proc, "the llama.cpp server exited before /health answered")
            if _health_ok(host, int(port), timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                return
            if time.monotonic() >= deadline:
                raise self._error(
                    proc, f"llama.cpp /health did not answer within {self.startup_timeout:g} s"
                )
            # /health is an HTTP poll: no event to wait on.
            time.sleep(_HEALTH_POLL_S)

    def _error(
        self, proc: subprocess.Popen[bytes], message: str, *, exited: bool = False
    ) -> LocalServerError:
        """A start failure, with the child's status and stderr tail when it has exited.

        ``exited``: its stdout reached EOF, so it is exiting; wait (bounded) for
        its status rather than report a process that is merely still dying.
        """
        if self._state is ServerState.STOPPED:
            message = "the local server was stopped while starting"
        try:
            returncode = proc.wait(self.stop_grace) if exited else proc.poll()
        except subprocess.TimeoutExpired:
            returncode = None
        if returncode is not None and self._drain is not None:
            # Let the drain catch up with the child's last words.
            self._drain.join(timeout=1.0)
        return LocalServerError(message, stderr_tail=self.stderr_tail(), returncode=returncode)


def _name_of(spec: LocalModel | str) -> str:
    """The name a server of ``spec`` announces, as far as it is known before ``start()``."""
    if isinstance(spec, LocalModel):
        return spec.name
    if spec == DEFAULT_MODEL:
        return MODEL_NAME
    return GEMMA_MODEL_NAME if spec == "gemma" else Path(spec).stem


def _connect_host(host: str) -> str:
    """Where to connect for a server bound to ``host`` (a wildcard means loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _health_ok(host: str, port: int, *, timeout: float) -> bool:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        response = conn.getresponse()
        response.read()
        # 503 while the model loads; 200 once it serves.
        return response.status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _drain_lines(stream: IO[bytes], tail: collections.deque[str]) -> None:
    # Reading continuously keeps the child from blocking on a full pipe;
    # the bounded deque keeps only what an error message needs.
    with stream, contextlib.suppress(OSError, ValueError):
        for line in stream:
            tail.append(line.decode("utf-8", "replace"))


def _kill_and_reap(proc: subprocess.Popen[bytes], grace: float) -> None:
    """Stop the child's process group and reap the child (docs/architecture.md, fact 8)."""
    if proc.stdin is not None:
        # EOF on stdin: the child exits by itself (see _child.py).
        with contextlib.suppress(OSError):
            proc.stdin.close()
    if proc.returncode is None:
        # SIGTERM to the group, SIGKILL to what is left after the grace (a
        # child ignoring SIGTERM, anything it started), then reap: the one
        # group kill of wirecut, shared with the scope's cut of a process.
        kill_process_group(proc, grace=grace)
