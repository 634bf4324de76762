"""After a cut, how long did the provider keep its slot? A watcher of the provider's ``/slots``.

A cut request's socket is shut at once, but the provider frees the slot only
when it notices: llama.cpp looks at a cancelled task only between batches of
``n_batch`` prompt tokens, so a cut during a long prompt can hold the slot for
seconds (docs/cancellation-limits.md). ``SlotWatch`` makes that visible. The
console's metrics (``ConsoleMetrics.completed``, the runner's observer hook)
hand it every command that completed ``cancelled`` or ``timeout`` after it
made provider requests; it then reads the provider's ``GET /slots``
(llama.cpp's, which the simulator answers too) until the slots that were
running at the cut run those tasks no more, and records:

- ``wirecut_slot_held_after_cut_ms``: a histogram, one observation per cut:
  from the cancel to the first reading that showed none of those tasks
  running (an upper bound: readings are ``min_interval`` apart);
- ``wirecut_slots_busy_after_cut``: how many of them run right now, also in
  ``/api/health`` as ``"slots": {"busy_after_cut": N}`` (``null`` once a cut
  showed that the provider exposes no ``/slots``);
- ``wirecut_slot_watch_gave_up``: cuts whose tasks still ran ``watch_limit``
  seconds after the cut (they leave the count then).

Which slots a cut held. ``/slots`` does not say which request a task serves,
so a cut is charged with every task running at the first reading after it,
taken ``SETTLE`` seconds after the cut at the earliest (tasks that start
later are new ids and never counted). That is exact when
the console is the provider's only client and ran nothing else at the time;
otherwise a request that was running beside the cut counts until it ends.

Pace: llama.cpp answers ``/slots`` from its task loop, and each answer
restarts its wait for a closed non-streaming client, so readings are at
least ``min_interval`` (1.5 s) apart, and there are none while no cut is
watched.

Event loop only (the console's): ``start``, ``completed``, ``health`` and
``aclose`` are called there, and the readings run as one task on it.
``start`` (at startup) loads what the first reading would load in the middle
of a burst of cuts: httpx's async client imports anyio's event loop backend
and streams at its first request, 16 to 35 ms of the loop's CPU on the
development machine, and that was the slowest burst of every serve process.

Cancellation: ``aclose()`` cancels the task and waits for it; a task still
pending when the loop ends is cancelled by ``asyncio.run``. Either way its
HTTP client is closed by the task itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import anyio.streams.memory
import anyio.streams.stapled
import anyio.streams.tls
import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from wirecut.record import CompleteFacts, Status

__all__ = ["MIN_INTERVAL", "SETTLE", "WATCH_LIMIT", "SlotWatch"]

#: Seconds between two readings of ``/slots`` (llama.cpp's pace: see the module docstring).
MIN_INTERVAL = 1.5
#: Seconds after a cut past which its slots are no longer watched.
WATCH_LIMIT = 600.0
#: How long one reading may take.
READ_TIMEOUT = 5.0
#: Seconds from a cut to the first reading: the cuts of a burst complete in
#: that time, and a reading (a request and its JSON on the event loop) among
#: them held their completes back; a slot freed sooner is not "busy after a cut".
SETTLE = 0.25

# Milliseconds: a prompt batch of llama.cpp takes from a fraction of a second to tens.
_HELD_BUCKETS = (250, 500, 1000, 1500, 2000, 3000, 5000, 10000, 20000, 30000, 60000, 120000)


@dataclass
class _Cut:
    """One cut command: when it was cut, and the tasks charged to it (None: not read yet)."""

    at: float
    tasks: set[str] | None = None


@dataclass
class _Reading:
    at: float
    running: frozenset[str] = field(default_factory=frozenset)


class SlotWatch:
    """Watches the provider at ``root_url`` (``http://host:port``) after each cut.

    ``registry`` receives the metrics named in the module docstring.
    """

    def __init__(
        self,
        root_url: str,
        *,
        registry: CollectorRegistry,
        api_key: str | None = None,
        min_interval: float = MIN_INTERVAL,
        watch_limit: float = WATCH_LIMIT,
    ) -> None:
        if not min_interval >= 0 or not watch_limit > 0:
            raise ValueError(f"bad pace {min_interval!r} or limit {watch_limit!r}")
        self.root_url = root_url.rstrip("/")
        self.min_interval = min_interval
        self.watch_limit = watch_limit
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.held = Histogram(
            "wirecut_slot_held_after_cut_ms",
            "From a cut to the first reading of the provider's /slots that showed the tasks "
            "running at the cut no longer running (ms; an upper bound by the reading pace).",
            buckets=_HELD_BUCKETS,
            registry=registry,
        )
        self.busy_gauge = Gauge(
            "wirecut_slots_busy_after_cut",
            "Provider slots still running a task that was running at a cut.",
            registry=registry,
        )
        self.gave_up = Counter(
            "wirecut_slot_watch_gave_up",
            "Cuts whose slots still ran at the watch limit.",
            registry=registry,
        )
        # None until a reading says whether the provider exposes /slots.
        self.exposes_slots: bool | None = None
        # Made here, once: a client's TLS context takes tens of milliseconds of
        # CPU to build, which on the event loop, at the first cut of a burst,
        # held back the completes of every command cut with it.
        self._http = httpx.AsyncClient(headers=self._headers, timeout=READ_TIMEOUT)
        self._cuts: list[_Cut] = []
        self._last_read = -float("inf")
        self._task: asyncio.Task[None] | None = None

    # -- event loop ---------------------------------------------------------------------

    def start(self) -> None:
        """Load anyio's backend for the running loop now, not at the first reading (see above).

        Its streams are imported with this module; the backend is chosen by
        the loop, so it loads here. Call from the event loop, at startup.
        """
        anyio.Event()

    def completed(self, facts: CompleteFacts, cancel_to_complete_ms: float | None) -> None:
        """The runner observer's hook: watch after a cut command that made requests."""
        if facts.status not in (Status.CANCELLED, Status.TIMEOUT):
            return
        requests = facts.usage.requests
        # A count that is not known (null) may hide a request: watch it too.
        if requests is not None and requests <= 0:
            return
        if self.exposes_slots is False:
            return
        now = time.monotonic()
        back = (cancel_to_complete_ms or 0.0) / 1000
        self._cuts.append(_Cut(at=now - max(0.0, back)))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._watch(), name="wirecut-slot-watch"
            )

    def busy_after_cut(self) -> int | None:
        """Slots still running a task charged to a cut; None when the provider has no /slots."""
        if self.exposes_slots is False:
            return None
        return len(self._charged())

    def health(self) -> dict[str, Any]:
        """The ``slots`` part of ``/api/health``."""
        return {"busy_after_cut": self.busy_after_cut()}

    async def aclose(self) -> None:
        """Stop watching and close the HTTP client; idempotent."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._http.aclose()

    # -- the task -----------------------------------------------------------------------

    async def _watch(self) -> None:
        http = self._http
        while self._cuts:
            # The provider's own pace (MIN_INTERVAL), and the burst's (SETTLE).
            settled = min(cut.at for cut in self._cuts) + SETTLE
            next_read = max(self._last_read + self.min_interval, settled)
            await asyncio.sleep(max(0.0, next_read - time.monotonic()))
            seen = list(self._cuts)
            self._last_read = time.monotonic()
            reading = await self._read(http)
            if self.exposes_slots is False:
                self._cuts.clear()
                break
            if reading is not None:
                self._apply(reading, seen)
            self._give_up(time.monotonic())
            self.busy_gauge.set(len(self._charged()))
        self.busy_gauge.set(len(self._charged()))

    async def _read(self, http: httpx.AsyncClient) -> _Reading | None:
        """One reading of ``/slots``; None when the provider did not answer this time."""
        try:
            response = await http.get(self.root_url + "/slots")
            listing = response.json() if response.status_code == 200 else None
        except httpx.HTTPError:
            return None  # Down for now: the next reading may tell (up to the watch limit).
        except ValueError:
            listing = None  # Not JSON: not llama.cpp's /slots.
        if not (
            isinstance(listing, list)
            and listing
            and all(isinstance(slot, dict) and "is_processing" in slot for slot in listing)
        ):
            # A provider that answers, but not with llama.cpp's slots: nothing to watch.
            self.exposes_slots = False
            return None
        self.exposes_slots = True
        running = set()
        for slot in listing:
            if slot.get("is_processing"):
                # llama.cpp names the task; the simulator the request.
                task = slot.get("id_task", slot.get("request_id"))
                running.add(f"{slot.get('id')}:{task}")
        return _Reading(at=time.monotonic(), running=frozenset(running))

    def _apply(self, reading: _Reading, seen: list[_Cut]) -> None:
        for cut in seen:
            if cut.tasks is None:
                # The first reading after the cut: charge it what runs now.
                cut.tasks = set(reading.running)
            else:
                cut.tasks &= reading.running
            if not cut.tasks:
                self.held.observe(max(0.0, (reading.at - cut.at) * 1000))
                self._cuts.remove(cut)

    def _give_up(self, now: float) -> None:
        for cut in list(self._cuts):
            if now - cut.at >= self.watch_limit:
                self.gave_up.inc()
                self._cuts.remove(cut)

    def _charged(self) -> set[str]:
        return {task for cut in self._cuts for task in cut.tasks or ()}
