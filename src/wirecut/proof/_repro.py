"""``wirecut repro``: the seed incident in one run, and the facts of its cancel.

The incident: a console ran ``curator run --consolidate --yes``, whose model
request streamed from llama.cpp (``-np 1``); the user cancelled; the console
said "cancelled" while its worker thread and the HTTP request ran on, and
llama.cpp held its only slot for half an hour.

``run_repro`` replays it: a simulator (``--endless``, one slot, in a process
of its own as a provider is) or the provider given, a console server
in-process over a temporary data directory
seeded with notes, the command over the WebSocket, and a ``cancel`` once the
provider is decoding. At the ``complete`` frame it reads the facts
(docs/protocol.md, "Proof tools"): did the request and the worker exit, did the
provider see the close and free the slot, and how fast. With ``baseline``
the same command then runs through the naive host (``_naive.ExecutorHost``)
on the same provider, and its facts are read the same way.

With the simulator, the provider's side is read from its event log, stamped
on this machine's one clock (``SimProcess``). With ``--provider-url`` it is
read from what the provider exposes (``_watchers``): an upper bound, and
"unknown" where it says nothing.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from wirecut.client import ConsoleClient
from wirecut.proof._naive import ExecutorHost, plain_job
from wirecut.proof._seed import seed_notes
from wirecut.proof._sim_process import SimProcess
from wirecut.proof._sim_watch import provider_side, wait_decoding
from wirecut.proof._watchers import Poller, Sample, Watcher, identify
from wirecut.simulator import SimConfig

__all__ = ["COMMAND", "ReproError", "ReproFacts", "ReproReport", "run_repro"]

COMMAND = "curator run --consolidate --yes"
FACTS = ("request_exited", "worker_exited", "provider_saw_close", "slot_free")
#: How long wirecut's complete may take (the console's unwind bound, and a margin).
COMPLETE_BOUND = 15.0
#: How long the provider's side is watched after a cancel, with the simulator.
SIM_WINDOW = 1.0
#: The same with a real provider, read at its own pace (llama.cpp: every 1.5 s).
REAL_WINDOW = 5.0
#: How long the command may take to reach the provider's first token.
START_BOUND = 60.0


#: (event, ms after the cancel) steps of a timeline.
Steps = list[tuple[str, float]]


class ReproError(Exception):
    """The repro could not cut its command; the message says why, in one line."""


def _word(value: bool | None) -> str:
    return "unknown" if value is None else "true" if value else "false"


@dataclass
class ReproFacts:
    """The facts of one cancel, read at its ``complete`` (or the naive host's "done")."""

    request_exited: bool | None
    worker_exited: bool | None
    provider_saw_close: bool | None
    slot_free: bool | None
    cancel_to_complete_ms: float | None
    cancel_to_provider_close_ms: float | None
    #: (event, ms after the cancel), in order.
    timeline: Steps = field(default_factory=list)

    @property
    def holds(self) -> bool:
        """True when every fact is true."""
        return all(getattr(self, name) is True for name in FACTS)

    def lines(self) -> list[str]:
        """docs/protocol.md's form: one fact a line, the figures, then the timeline."""
        out = [f"{name}: {_word(getattr(self, name))}" for name in FACTS]
        for name in ("cancel_to_complete_ms", "cancel_to_provider_close_ms"):
            value = getattr(self, name)
            out.append(f"{name}: {'never' if value is None else f'{value:.1f}'}")
        out.append("timeline:")
        out += [f"  {ms:9.1f} ms  {event}" for event, ms in sorted(self.timeline, key=_ms)]
        return out


def _ms(step: tuple[str, float]) -> float:
    return step[1]


@dataclass
class ReproReport:
    """wirecut's facts, and the naive host's when asked for."""

    wirecut: ReproFacts
    baseline: ReproFacts | None = None

    @property
    def exit_code(self) -> int:
        """0 only when every fact holds for wirecut."""
        return 0 if self.wirecut.holds else 1

    def lines(self) -> list[str]:
        out = self.wirecut.lines()
        if self.baseline is not None:
            out += ["baseline:", *self.baseline.lines()]
        return out


# -- the provider's side ---------------------------------------------------------------


class _SimSide:
    """The simulator's event log: exact, on this machine's one clock."""

    def __init__(self, sim: SimProcess) -> None:
        self.sim = sim
        self.since = 0

    def mark(self) -> None:
        self.since = self.sim.next_seq()

    def wait_decoding(self, fallback: Callable[[float], None]) -> None:
        wait_decoding(self.sim, 1, self.since, START_BOUND)

    def after_cancel(self, cancelled_at: float) -> tuple[bool, bool, float | None, Steps]:
        ids = [
            ev.request_id
            for ev in self.sim.events(self.since)
            if ev.kind == "request_received" and ev.request_id
        ]
        sides = provider_side(self.sim, ids, self.since, cancelled_at, SIM_WINDOW)
        if not sides:
            return False, False, None, []
        side = sides[-1]
        busy = [s for s in self.sim.slots() if s.get("request_id") == side.request_id]
        slot_free = side.freed_at is not None and not any(s.get("is_processing") for s in busy)
        timeline: Steps = []
        if side.closed_at is not None:
            timeline.append(("provider_saw_close", side.close_ms or 0.0))
        if side.freed_at is not None:
            timeline.append(("slot_freed", (side.freed_at - cancelled_at) * 1000))
        else:
            decoded = max((int(str(s.get("n_decoded", 0))) for s in busy), default=0)
            timeline.append(
                (f"provider still decoding ({decoded} tokens so far)", SIM_WINDOW * 1000)
            )
        return side.closed_at is not None, slot_free, side.close_ms, timeline


class _RealSide:
    """A real provider, read through what it exposes (llama.cpp /slots, vLLM /metrics ...)."""

    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher
        self.poller = Poller(watcher)
        self.idle: Sample | None = None
        self.busy: Sample | None = None

    def mark(self) -> None:
        self.idle = self.poller.sample()

    def wait_decoding(self, fallback: Callable[[float], None]) -> None:
        fallback(START_BOUND)
        self.busy = self.poller.sample()

    def after_cancel(
        self, cancelled_at: float
    ) -> tuple[bool | None, bool | None, float | None, Steps]:
        assert self.idle is not None
        assert self.busy is not None
        if not self.watcher.sees:
            return None, None, None, [("the provider exposes nothing to read", 0.0)]
        previous = self.busy
        released: bool | None = None
        while True:
            reading = self.poller.sample(not_before=cancelled_at + 0.1)
            released = self.watcher.released(reading, self.busy, self.idle, previous)
            elapsed = reading.at - cancelled_at
            if released:
                ms = elapsed * 1000
                return True, True, ms, [(f"provider seen released ({self.watcher.how})", ms)]
            if elapsed >= REAL_WINDOW:
                how = self.watcher.how
                step = f"provider still running ({how})" if released is False else "unknown"
                return released, released, None, [(step, elapsed * 1000)]
            previous = reading


# -- the two hosts ---------------------------------------------------------------------


def _wirecut_run(console_url: str, side: _SimSide | _RealSide) -> ReproFacts:
    with ConsoleClient(console_url) as client:
        side.mark()
        id = client.run(COMMAND)

        def first_token(bound: float) -> None:
            frame = client.wait_for(
                lambda f: (
                    f["type"] == "complete"
                    or (f["type"] == "output" and f.get("stream") == "token")
                ),
                bound,
                id=id,
            ).frame
            if frame["type"] == "complete":
                # It ended before the provider sent a token: there is nothing to cut.
                why = frame.get("error") or frame.get("status")
                raise ReproError(f"`{COMMAND}` ended before its first token: {why}")

        side.wait_decoding(first_token)
        cancelled_at = client.cancel(id)
        done = client.complete(id, COMPLETE_BOUND)
        saw_close, slot_free, close_ms, provider_steps = side.after_cancel(cancelled_at)
    facts = done.facts
    lifecycle = facts.lifecycle
    complete_ms = (done.at - cancelled_at) * 1000
    timeline = [(step.event, step.ms) for step in lifecycle.timeline or ()]
    timeline += [*provider_steps, (f"complete ({facts.status})", complete_ms)]
    return ReproFacts(
        request_exited=lifecycle.open_requests == 0,
        worker_exited=lifecycle.worker_exited is True,
        provider_saw_close=saw_close,
        slot_free=slot_free,
        cancel_to_complete_ms=complete_ms,
        cancel_to_provider_close_ms=close_ms,
        timeline=timeline,
    )


def _naive_run(
    base_url: str,
    model: str | None,
    api_key: str | None,
    data_dir: Path,
    side: _SimSide | _RealSide,
    stop_provider: Callable[[], None],
) -> ReproFacts:
    host = ExecutorHost(workers=4)
    job = plain_job(
        base_url, "curator", model=model, api_key=api_key, max_tokens=512, data_dir=data_dir
    )
    try:
        side.mark()
        host.start([job])

        def first_token(bound: float) -> None:
            if not job.work.first_token.wait(bound):
                raise TimeoutError(f"the naive command got no token within {bound} s")

        side.wait_decoding(first_token)
        cancelled_at = host.cancel_all()
        job.completed.wait(COMPLETE_BOUND)
        # What was true when the host said "cancelled".
        request_exited = not job.work.request_open
        worker_exited = job.work.exited.is_set()
        saw_close, slot_free, close_ms, provider_steps = side.after_cancel(cancelled_at)
        complete_ms = None if job.completed_at is None else (job.completed_at - cancelled_at) * 1000
        timeline: Steps = [("cancel_requested", 0.0)]
        if complete_ms is not None:
            timeline.append(("complete (the waiter was cancelled)", complete_ms))
        timeline += provider_steps
        if not job.work.exited.is_set():
            timeline.append(("worker still running", (time.monotonic() - cancelled_at) * 1000))
        return ReproFacts(
            request_exited=request_exited,
            worker_exited=worker_exited,
            provider_saw_close=saw_close,
            slot_free=slot_free,
            cancel_to_complete_ms=complete_ms,
            cancel_to_provider_close_ms=close_ms,
            timeline=timeline,
        )
    finally:
        # The cleanup the naive host cannot do: end the leftover request by hand.
        job.work.cut_for_cleanup()
        if not job.work.exited.wait(5):
            stop_provider()
            job.work.exited.wait(5)
        host.close()


@contextlib.contextmanager
def _console(
    base_url: str, model: str | None, api_key: str | None, data_dir: Path
) -> Iterator[str]:
    from wirecut.console import ConsoleConfig, ConsoleServer
    from wirecut.launch import Provider

    config = ConsoleConfig(port=0, data_dir=data_dir, model=model, api_key=api_key)
    provider = Provider(base_url, model, f"{base_url} (repro)")
    with ConsoleServer(config, provider) as console:
        yield console.ws_url


def run_repro(
    *,
    provider_url: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    baseline: bool = False,
    log: Callable[[str], None] = lambda line: None,
) -> ReproReport:
    """Replay the incident through wirecut's console (and the naive host with ``baseline``).

    Runs in the calling thread; starts and stops everything it uses (the
    simulator, the console, a temporary data directory). Raises
    ``httpx.HTTPError`` when a given provider cannot be reached,
    ``TimeoutError`` when a step does not happen within its bound, and
    ``ReproError`` when the command ended before it could be cut (a
    provider that refused it, say).

    Cancellation: on the way out, also on an exception or a Ctrl+C, the naive
    host's leftover request is shut down by hand (it cannot do it itself),
    the console stops (cancelling what it runs) and the simulator stops,
    which ends every stream it still serves; no thread of it is left running.
    """
    with tempfile.TemporaryDirectory(prefix="wirecut-repro-") as tmp:
        data_dir = Path(tmp)
        seed_notes(data_dir)
        sim: SimProcess | None = None
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        http = httpx.Client(headers=auth)
        try:
            if provider_url is None:
                sim = SimProcess(SimConfig(slots=1, endless=True, prompt_ms=100))
                sim.start()
                base_url = sim.base_url
                log(f"simulator (endless, one slot) at {base_url}")
                side: _SimSide | _RealSide = _SimSide(sim)
            else:
                base_url = provider_url.rstrip("/")
                watcher = identify(base_url, http)
                log(f"provider {watcher.kind} at {base_url}, read through {watcher.how}")
                side = _RealSide(watcher)
            with _console(base_url, model, api_key, data_dir) as ws_url:
                log(f"console: `{COMMAND}`, cancel once the provider decodes")
                report = ReproReport(_wirecut_run(ws_url, side))
            if baseline:
                log("naive host: the same command, run_in_executor, cancel the waiter")
                stopper = sim.stop if sim is not None else (lambda: None)
                report.baseline = _naive_run(base_url, model, api_key, data_dir, side, stopper)
            return report
        finally:
            http.close()
            if sim is not None:
                sim.stop()  # Ends any stream still served, so no thread is left behind.
