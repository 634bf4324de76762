"""What hosts do today: the baselines that ``repro`` and ``bench`` measure wirecut against.

Each baseline is a *host* (how the work is run and "cancelled") and a
*command* (the work: a chat request with a plain client, or a naive curator
run). Nothing here uses ``wirecut.scope``, ``wirecut.http`` or
``wirecut.provider``: the commands use plain ``httpx`` or the official
``openai`` SDK exactly as an application would, so what the baselines leave
behind is what those applications leave behind.

Hosts (all run their event loop on a background thread and are driven from
the caller's thread):

- ``ExecutorHost``: ``await loop.run_in_executor(pool, command)``; cancel
  cancels the asyncio waiter (what the seed incident's console did). With
  ``close_clients`` it first calls ``client.close()`` on the command's
  ``openai`` client from the host thread (the "openai-close" baseline).
- ``AnyioHost``: ``anyio.to_thread.run_sync(command, abandon_on_cancel=True)``
  inside a cancel scope; cancel cancels the scope.

In each, the host reports the command cancelled as soon as its waiter is
cancelled; the worker thread runs on, blocked in its HTTP read, until the
provider ends the reply. ``Work`` records what the worker thread really did,
so the proof tools can say so.

Cleaning up after a baseline is the caller's job, and it is not part of what
is measured: stopping the simulator ends every stream it serves, and
``Work.cut_for_cleanup()`` shuts down a stream's socket by hand (a real
provider given with ``--provider-url`` cannot be stopped).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "AnyioHost",
    "BaselineJob",
    "ExecutorHost",
    "Work",
    "curator_messages",
    "naive_curator",
    "openai_job",
    "plain_job",
]

#: Read timeout of the baselines' plain clients: none to speak of, as in the incident.
PLAIN_TIMEOUT = httpx.Timeout(3600.0, connect=10.0)


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every baseline client.

    Building one loads the CA bundle (~70 ms here); the bench builds 64
    clients at once, and their loopback http:// never uses it.
    """
    return ssl.create_default_context()


class Work:
    """What one baseline command's worker thread did; written there, read anywhere.

    ``request_open`` is True from the moment the request was sent until the
    worker closed its response; ``exited`` is set when the command function
    returned or raised.
    """

    def __init__(self) -> None:
        # Guards request_open and the socket: the cleanup reads them from another thread.
        self._lock = threading.Lock()
        self.exited = threading.Event()
        #: Set at the first piece of the reply: the provider is decoding.
        self.first_token = threading.Event()
        self.started_at: float | None = None
        self.exited_at: float | None = None
        self.error: BaseException | None = None
        self._request_open = False
        self._socket: socket.socket | None = None

    @property
    def request_open(self) -> bool:
        with self._lock:
            return self._request_open

    def opened(self, response: Any | None = None) -> None:
        """The request was sent; ``response`` (an httpx response) gives the socket, if any."""
        sock = None
        if response is not None:
            stream = getattr(response, "extensions", {}).get("network_stream")
            if stream is not None:
                with contextlib.suppress(Exception):
                    sock = stream.get_extra_info("socket")
        with self._lock:
            self._request_open = True
            self._socket = sock if isinstance(sock, socket.socket) else None

    def closed(self) -> None:
        with self._lock:
            self._request_open = False
            self._socket = None

    def cut_for_cleanup(self) -> bool:
        """Shut the stream's socket down by hand (the cleanup, never the measured cancel).

        ``shutdown`` wakes the blocked reader and sends the provider the FIN;
        the worker thread, which owns the socket, closes it. False when no
        socket is known (a non-streaming request still waiting for headers).
        """
        with self._lock:
            sock = self._socket if self._request_open else None
        if sock is None:
            return False
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        return True

    def run(self, fn: Callable[[Work], None]) -> None:
        """Run ``fn(self)`` in the calling (worker) thread and record its end."""
        self.started_at = time.monotonic()
        try:
            fn(self)
        except BaseException as exc:  # The provider went away under a leftover: expected.
            self.error = exc
        finally:
            self.closed()
            self.exited_at = time.monotonic()
            self.exited.set()


@dataclass(eq=False)
class BaselineJob:
    """One command for a baseline host: the work, its record, and its client's ``close``."""

    fn: Callable[[Work], None]
    work: Work = field(default_factory=Work)
    #: Set by ``openai_job``: what the "openai-close" host calls on cancel.
    close_client: Callable[[], None] | None = None
    #: ``time.monotonic()`` when the host reported the command over (its "complete").
    completed_at: float | None = None
    #: Set with ``completed_at``.
    completed: threading.Event = field(default_factory=threading.Event)

    def __call__(self) -> None:
        self.work.run(self.fn)

    def complete(self) -> None:
        """The host reports the command over (called on the host's loop)."""
        self.completed_at = time.monotonic()
        self.completed.set()


# -- commands -----------------------------------------------------------------------

CURATOR_PROMPT = (
    "You organise a person's notes. Group notes about the same subject under umbrella "
    'notes. Answer with JSON only: {"umbrellas": [{"title": "...", "summary": "...", '
    '"note_ids": [1, 2]}]}.'
)


def curator_messages(data_dir: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The plan request a naive curator sends for the active notes in ``data_dir``."""
    from wirecut.memory import NoteState, NoteStore

    notes = NoteStore.in_data_dir(data_dir).notes(NoteState.ACTIVE)
    listing = "\n".join(
        json.dumps({"id": n.id, "title": n.title, "body": n.body[:300]}) for n in notes
    )
    messages = [
        {"role": "system", "content": CURATOR_PROMPT},
        {"role": "user", "content": f"The notes, one JSON object a line:\n{listing}"},
    ]
    return messages, [n.id for n in notes]


def _body(
    messages: list[dict[str, Any]], model: str | None, max_tokens: int, stream: bool
) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "stream": stream}
    if model:
        body["model"] = model
    return body


def _plain_stream(url: str, body: dict[str, Any], headers: dict[str, str], work: Work) -> str:
    text: list[str] = []
    with (
        httpx.Client(timeout=PLAIN_TIMEOUT, verify=_tls()) as client,
        client.stream("POST", url, json=body, headers=headers) as response,
    ):
        work.opened(response)
        for line in response.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            work.first_token.set()
            with contextlib.suppress(ValueError, LookupError, TypeError):
                delta = json.loads(line[5:])["choices"][0]["delta"]
                text.append(delta.get("content") or "")
    return "".join(text)


def plain_job(
    base_url: str,
    scenario: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    max_tokens: int = 4096,
    data_dir: Path | None = None,
) -> BaselineJob:
    """A command with a plain ``httpx`` client: "stream", "non-stream" or "curator"."""
    url = base_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    messages = [{"role": "user", "content": "Tell me a long story about a lighthouse."}]

    def stream(work: Work) -> None:
        _plain_stream(url, _body(messages, model, max_tokens, True), headers, work)

    def whole(work: Work) -> None:
        with httpx.Client(timeout=PLAIN_TIMEOUT, verify=_tls()) as client:
            work.opened()
            client.post(url, json=_body(messages, model, max_tokens, False), headers=headers)

    def curator(work: Work) -> None:
        assert data_dir is not None
        naive_curator(data_dir, url, headers, model, max_tokens, work)

    fns = {"stream": stream, "non-stream": whole, "curator": curator}
    return BaselineJob(fns[scenario])


def naive_curator(
    data_dir: Path,
    url: str,
    headers: dict[str, str],
    model: str | None,
    max_tokens: int,
    work: Work,
) -> None:
    """``curator run --consolidate --yes`` as a naive host's command would do it.

    Reads the active notes, streams the model's plan with a plain ``httpx``
    client, and applies it only if the reply ends. A cancel of its host
    never reaches it: it runs until the provider stops sending.
    """
    from wirecut.memory import NoteStore, Umbrella, apply_plan
    from wirecut.memory import Plan as MemoryPlan

    messages, ids = curator_messages(data_dir)
    text = _plain_stream(url, _body(messages, model, max_tokens, True), headers, work)
    try:
        raw = json.loads(text)
        umbrellas = tuple(
            Umbrella(title=u["title"], body=u["summary"], note_ids=tuple(u["note_ids"]))
            for u in raw["umbrellas"]
        )
    except (ValueError, LookupError, TypeError):
        return  # Not a plan: nothing to write.
    store = NoteStore.in_data_dir(data_dir)
    snapshot = [note for note in store.notes() if note.id in ids]
    apply_plan(store, MemoryPlan(umbrellas=umbrellas), snapshot)


def openai_job(
    base_url: str,
    scenario: str,
    *,
    model: str,
    api_key: str | None = None,
    max_tokens: int = 4096,
    data_dir: Path | None = None,
) -> BaselineJob:
    """A command with the official ``openai`` SDK (no wirecut adapter), one client per command.

    ``max_retries=0``: once the bench stops the simulator, a leftover worker
    must not send its request again.
    """
    import openai

    client = openai.OpenAI(
        base_url=base_url,
        api_key=api_key or "none",
        max_retries=0,
        # The SDK's own default client, with a shared TLS context (see _tls).
        http_client=openai.DefaultHttpxClient(verify=_tls()),
    )
    messages: list[Any] = [{"role": "user", "content": "Tell me a long story about a lighthouse."}]

    def stream_messages(work: Work, msgs: list[Any]) -> None:
        chunks = client.chat.completions.create(
            model=model, messages=msgs, stream=True, max_tokens=max_tokens
        )
        work.opened(chunks.response)
        for _ in chunks:
            work.first_token.set()

    def stream(work: Work) -> None:
        stream_messages(work, messages)

    def whole(work: Work) -> None:
        work.opened()
        client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens)

    def curator(work: Work) -> None:
        assert data_dir is not None
        stream_messages(work, curator_messages(data_dir)[0])

    fns = {"stream": stream, "non-stream": whole, "curator": curator}
    return BaselineJob(fns[scenario], close_client=client.close)


# -- hosts --------------------------------------------------------------------------


class _LoopThread:
    """An asyncio event loop running on its own thread until ``stop()``."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run ``fn()`` on the loop and return its result."""

        async def wrapper() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result(timeout)

    def stop(self) -> None:
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


class ExecutorHost:
    """The naive host: ``loop.run_in_executor`` and, on cancel, cancel the waiter.

    Driven from one caller thread. ``close_clients``: call each job's
    ``close_client`` from the host thread before cancelling its waiter.

    Cancellation: ``cancel_all()`` cancels the asyncio waiters, which
    report done at once; the worker threads run on (the asyncio wrapper's
    ``cancel()`` cannot stop a running thread). ``close()`` does not wait for
    them: see ``Work.exited``.
    """

    def __init__(self, workers: int, *, close_clients: bool = False) -> None:
        self.close_clients = close_clients
        self.jobs: list[BaselineJob] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="naive-host"
        )
        self._host = _LoopThread("naive-host-loop")
        self._waiters: list[asyncio.Future[None]] = []
        self._tasks: set[asyncio.Task[None]] = set()  # Kept: the loop holds tasks weakly.

    def start(self, jobs: Sequence[BaselineJob]) -> None:
        """Submit each job as a command."""
        self.jobs.extend(jobs)
        self._host.call(lambda: self._start(jobs))

    def _start(self, jobs: Sequence[BaselineJob]) -> None:
        loop = asyncio.get_running_loop()
        for job in jobs:
            waiter = loop.run_in_executor(self._pool, job)
            self._waiters.append(waiter)
            self._tasks.add(loop.create_task(self._await(waiter, job)))

    @staticmethod
    async def _await(waiter: asyncio.Future[None], job: BaselineJob) -> None:
        try:
            await waiter
        except asyncio.CancelledError:
            pass  # The host says "cancelled" here, and means it.
        except Exception:
            pass
        job.complete()

    def cancel_all(self) -> float:
        """Cancel every command the naive way; return ``time.monotonic()`` at the cancel."""
        at = time.monotonic()
        self._host.call(self._cancel_all)
        return at

    def _cancel_all(self) -> None:
        for waiter, job in zip(self._waiters, self.jobs, strict=True):
            if self.close_clients and job.close_client is not None:
                with contextlib.suppress(Exception):
                    job.close_client()
            waiter.cancel()

    def close(self) -> None:
        """Stop the host loop and let go of the pool; leftover workers end on their own."""
        self._host.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)


class AnyioHost:
    """``anyio.to_thread.run_sync(command, abandon_on_cancel=True)`` in a cancel scope each.

    Cancellation: ``cancel_all()`` cancels the scopes; ``run_sync`` returns
    at once and abandons the thread, which runs on.
    """

    def __init__(self, workers: int) -> None:
        import anyio

        self.jobs: list[BaselineJob] = []
        self._scopes: list[Any] = []
        self._portal_cm = anyio.from_thread.start_blocking_portal(backend="asyncio")
        self._portal = self._portal_cm.__enter__()
        self._limiter = self._portal.call(lambda: anyio.CapacityLimiter(workers))
        self._futures: list[concurrent.futures.Future[None]] = []

    def start(self, jobs: Sequence[BaselineJob]) -> None:
        self.jobs.extend(jobs)
        for job in jobs:
            ready = threading.Event()
            self._futures.append(self._portal.start_task_soon(self._host, job, ready))
            ready.wait(10)

    async def _host(self, job: BaselineJob, ready: threading.Event) -> None:
        import anyio

        with anyio.CancelScope() as scope:
            self._scopes.append(scope)
            ready.set()
            with contextlib.suppress(Exception):
                await anyio.to_thread.run_sync(job, abandon_on_cancel=True, limiter=self._limiter)
        job.complete()

    def cancel_all(self) -> float:
        at = time.monotonic()
        self._portal.call(self._cancel_all)
        return at

    def _cancel_all(self) -> None:
        for scope in self._scopes:
            scope.cancel()

    def close(self) -> None:
        """Stop the portal's loop; it does not wait for abandoned threads."""
        for future in self._futures:
            with contextlib.suppress(Exception):
                future.result(5)
        with contextlib.suppress(Exception):
            self._portal_cm.__exit__(None, None, None)
