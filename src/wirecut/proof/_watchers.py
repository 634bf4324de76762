"""Which provider is this, and what does it expose about the requests it is running?

``identify(base_url)`` asks the provider's well-known endpoints and returns a
``Watcher`` for what it found:

- llama.cpp: ``GET /slots`` (each slot's ``is_processing`` and ``id_task``),
  else ``GET /metrics`` (``llamacpp:requests_processing``,
  ``llamacpp:tokens_predicted_total``). Both are served by llama.cpp's own
  task loop: polling faster than every 1.5 s delays its notice of a closed
  client, so ``min_interval`` is 1.5 s. The simulator answers ``/slots``
  like llama.cpp and is identified as it.
- vLLM: ``GET /metrics`` with ``vllm:`` names (``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``).
- Ollama: ``GET /api/version`` or ``/api/ps``. ``/api/ps`` lists loaded
  models with ``expires_at``, which Ollama sets to now + keep-alive when the
  last request on the model ends: a new, steady ``expires_at`` after a cut
  means the cut request ended.
- anything else: "unknown", with nothing to watch.

A ``Sample`` is one reading; ``Poller`` keeps readings ``min_interval``
apart. Call from one thread at a time (the doctor's).
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = [
    "LLAMA_MIN_INTERVAL",
    "LlamaWatcher",
    "OllamaWatcher",
    "Poller",
    "ProviderKind",
    "Sample",
    "UnknownWatcher",
    "VllmWatcher",
    "Watcher",
    "identify",
    "parse_metrics",
    "root_url",
]

#: Seconds between two polls of llama.cpp's /slots or /metrics (see the module docstring).
LLAMA_MIN_INTERVAL = 1.5
#: How long one observation request may take.
PROBE_TIMEOUT = 5.0


class ProviderKind(enum.StrEnum):
    """What the provider answered as; the values are docs/protocol.md's ``provider``."""

    LLAMA_CPP = "llama.cpp"  # /slots, /props or llamacpp: metrics
    VLLM = "vllm"  # /metrics with vllm: names
    OLLAMA = "ollama"  # /api/version or /api/ps
    UNKNOWN = "unknown"  # none of those: nothing to watch


@dataclass(frozen=True)
class Sample:
    """One reading of the provider, taken at ``at`` (``time.monotonic()`` after the answer).

    ``running`` is how many requests it is running (None: it does not say);
    ``tasks`` identifies what each busy slot runs, where the provider names
    it; ``last_tasks`` is the last task each slot ran, busy or not (llama.cpp
    keeps ``id_task`` after a slot is freed); ``marker`` is a provider-specific
    value whose change means a request ended (Ollama's ``expires_at``).
    """

    at: float
    running: int | None = None
    waiting: int | None = None
    tasks: frozenset[str] = frozenset()
    last_tasks: frozenset[str] = frozenset()
    marker: Any = None
    counter: float | None = None
    note: str = ""


class Watcher:
    """Reads one provider's state; subclasses know one kind of provider."""

    kind: ProviderKind = ProviderKind.UNKNOWN
    #: What it reads, for the report's ``how``.
    how: str = "unknown"
    min_interval: float = 0.2
    #: Requests the provider runs at once, when it says (llama.cpp's slots).
    slots: int | None = None
    #: The context of one slot in tokens, when it says (llama.cpp's ``n_ctx``).
    slot_context: int | None = None
    #: When ``identify`` began reading the provider: its readings count for the pace.
    identified_at: float = -math.inf
    #: False when it exposes nothing to read: there is no point in watching.
    sees: bool = True

    def __init__(self, root: str, http: httpx.Client) -> None:
        self.root = root
        self.http = http

    def sample(self) -> Sample:
        return Sample(at=time.monotonic())

    def busy(self, sample: Sample, idle: Sample) -> bool | None:
        """Is more running than at ``idle``? None when this provider cannot tell."""
        if sample.running is None or idle.running is None:
            return None
        return sample.running > idle.running

    def released(self, sample: Sample, busy: Sample, idle: Sample, previous: Sample) -> bool | None:
        """Did the request running at ``busy`` end by ``sample``? None: cannot tell."""
        running = self.busy(sample, idle)
        return None if running is None else not running

    def _get(self, path: str) -> httpx.Response:
        return self.http.get(self.root + path, timeout=PROBE_TIMEOUT)


class LlamaWatcher(Watcher):
    """llama.cpp (and the simulator): ``/slots``, and ``/metrics`` where it is on."""

    kind = ProviderKind.LLAMA_CPP
    min_interval = LLAMA_MIN_INTERVAL

    def __init__(
        self,
        root: str,
        http: httpx.Client,
        *,
        use_slots: bool,
        use_metrics: bool,
        slots: int | None,
        slot_context: int | None = None,
    ) -> None:
        super().__init__(root, http)
        self.use_slots = use_slots
        self.use_metrics = use_metrics
        self.slots = slots
        self.slot_context = slot_context
        read = [path for path, on in (("/slots", use_slots), ("/metrics", use_metrics)) if on]
        self.how = ", ".join(read) or "unknown"

    def sample(self) -> Sample:
        running: int | None = None
        waiting: int | None = None
        counter: float | None = None
        tasks: set[str] = set()
        last: set[str] = set()
        if self.use_slots:
            running = 0
            for slot in self._get("/slots").json():
                # llama.cpp keeps a slot's id_task after it is freed; the simulator
                # names the request it runs.
                task = slot.get("id_task", slot.get("request_id"))
                if task is not None and task != -1:
                    last.add(str(task))
                if slot.get("is_processing"):
                    running += 1
                    if task is not None:
                        tasks.add(str(task))
        if self.use_metrics:
            metrics = parse_metrics(self._get("/metrics").text)
            gauge = metrics.get("llamacpp:requests_processing")
            deferred = metrics.get("llamacpp:requests_deferred")
            if running is None and gauge is not None:
                running = int(gauge)
            waiting = None if deferred is None else int(deferred)
            counter = metrics.get("llamacpp:tokens_predicted_total")
        return Sample(
            at=time.monotonic(),
            running=running,
            waiting=waiting,
            tasks=frozenset(tasks),
            last_tasks=frozenset(last),
            counter=counter,
        )

    def busy(self, sample: Sample, idle: Sample) -> bool | None:
        # A task that was not running at ``idle``: a slot still held by an
        # earlier request (one its provider kept after the cut) is not ours.
        if self.use_slots and sample.tasks - idle.tasks:
            return True
        return super().busy(sample, idle)

    def released(self, sample: Sample, busy: Sample, idle: Sample, previous: Sample) -> bool | None:
        if self.use_slots and busy.tasks:
            # Released when none of the tasks that ran at the busy reading still runs.
            return not ((busy.tasks - idle.tasks) & sample.tasks)
        if sample.running is not None:
            return sample.running <= (idle.running or 0)
        if sample.counter is not None and previous.counter is not None and previous is not busy:
            # tokens_predicted_total stopped growing between two readings after the cut.
            return sample.counter == previous.counter
        return None


class VllmWatcher(Watcher):
    """vLLM: ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` on ``/metrics``."""

    kind = ProviderKind.VLLM
    how = "/metrics"

    def sample(self) -> Sample:
        metrics = parse_metrics(self._get("/metrics").text)
        at = time.monotonic()
        running = metrics.get("vllm:num_requests_running")
        waiting = metrics.get("vllm:num_requests_waiting")
        return Sample(
            at=at,
            running=None if running is None else int(running),
            waiting=None if waiting is None else int(waiting),
            counter=metrics.get("vllm:generation_tokens_total"),
        )


class OllamaWatcher(Watcher):
    """Ollama: ``/api/ps``; a request ended when its model's ``expires_at`` moved and held."""

    kind = ProviderKind.OLLAMA
    how = "/api/ps"

    def sample(self) -> Sample:
        body = self._get("/api/ps").json()
        at = time.monotonic()
        models = body.get("models") or []
        marker = tuple(
            sorted((str(m.get("name") or m.get("model")), str(m.get("expires_at"))) for m in models)
        )
        return Sample(at=at, marker=marker, running=None)

    def busy(self, sample: Sample, idle: Sample) -> bool | None:
        return None  # /api/ps does not count requests.

    def released(self, sample: Sample, busy: Sample, idle: Sample, previous: Sample) -> bool | None:
        if not sample.marker:
            return None  # No model loaded: nothing to read.
        # A model loaded by this very request shows a moving expires_at until
        # its first request ends; a settled, new value marks the end.
        return bool(sample.marker != busy.marker and sample.marker == previous.marker)


class UnknownWatcher(Watcher):
    """A provider that exposes nothing doctor can read."""

    how = "unknown"
    sees = False

    def released(self, sample: Sample, busy: Sample, idle: Sample, previous: Sample) -> bool | None:
        return None


@dataclass
class Poller:
    """Readings of one watcher, kept at least ``watcher.min_interval`` apart.

    ``sample()`` sleeps until the interval since the previous reading has
    passed (``not_before`` may ask for a later start). Doctor's own thread only.
    """

    watcher: Watcher
    min_interval: float | None = None
    samples: list[Sample] = field(default_factory=list)
    _last_start: float = -math.inf

    @property
    def interval(self) -> float:
        return self.watcher.min_interval if self.min_interval is None else self.min_interval

    def next_at(self) -> float:
        # identify() read the provider too: its readings count for the pace.
        return max(self._last_start, self.watcher.identified_at) + self.interval

    def sample(self, not_before: float = 0.0) -> Sample:
        start = max(self.next_at(), not_before)
        delay = start - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # The provider's own pace: see LLAMA_MIN_INTERVAL.
        self._last_start = time.monotonic()
        reading = self.watcher.sample()
        self.samples.append(reading)
        return reading


def root_url(base_url: str) -> str:
    """The server root of an OpenAI API base: ``http://h:p/v1`` -> ``http://h:p``."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value}, summing the label sets of one name."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        if brace != -1:
            # Label values may hold spaces: the value follows the last "}".
            name, rest = line[:brace], line[line.rfind("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        values[name] = values.get(name, 0.0) + value
    return values


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def identify(base_url: str, http: httpx.Client) -> Watcher:
    """Ask the provider at ``base_url`` what it is; return a watcher for it.

    Raises ``httpx.HTTPError`` only when the server cannot be reached at all.
    """
    root = root_url(base_url)
    started = time.monotonic()
    reached = False
    errors: list[httpx.HTTPError] = []

    def get(path: str) -> httpx.Response | None:
        nonlocal reached
        try:
            response = http.get(root + path, timeout=PROBE_TIMEOUT)
        except httpx.HTTPError as exc:
            errors.append(exc)
            return None
        reached = True
        return response

    slots = get("/slots")
    listing = _json(slots) if slots is not None and slots.status_code == 200 else None
    has_slots = (
        isinstance(listing, list)
        and bool(listing)
        and all(isinstance(s, dict) and "is_processing" in s for s in listing)
    )
    props = get("/props")
    props_body = _json(props) if props is not None and props.status_code == 200 else None
    llama_props = isinstance(props_body, dict) and (
        "total_slots" in props_body or "default_generation_settings" in props_body
    )
    metrics = get("/metrics")
    metrics_text = metrics.text if metrics is not None and metrics.status_code == 200 else ""
    if has_slots or llama_props or "llamacpp:" in metrics_text:
        total = props_body.get("total_slots") if isinstance(props_body, dict) else None
        count = len(listing) if has_slots and isinstance(listing, list) else total
        context = listing[0].get("n_ctx") if has_slots and isinstance(listing, list) else None
        watcher: Watcher = LlamaWatcher(
            root,
            http,
            use_slots=has_slots,
            use_metrics="llamacpp:" in metrics_text,
            slots=count if isinstance(count, int) else None,
            slot_context=context if isinstance(context, int) and context > 0 else None,
        )
    elif "vllm:" in metrics_text:
        watcher = VllmWatcher(root, http)
    else:
        watcher = UnknownWatcher(root, http)
        for path in ("/api/version", "/api/ps"):
            answer = get(path)
            body = _json(answer) if answer is not None and answer.status_code == 200 else None
            if isinstance(body, dict) and ("version" in body or "models" in body):
                watcher = OllamaWatcher(root, http)
                break
        if not reached and errors:
            raise errors[-1]
    watcher.identified_at = started
    return watcher
