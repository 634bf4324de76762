"""``wirecut doctor``: does a cancel free the slot on *this* provider?

``run_doctor`` identifies the provider (``_watchers.identify``), then cuts
three requests made through ``wirecut.provider.ChatClient`` under an
``InterruptScope`` and watches, through what the provider exposes, whether
and how fast the provider let each go:

- ``stream``: a long streaming generation, cut once tokens flow;
- ``non-stream``: a long real non-streaming one (``wire_stream=False``), cut
  once the provider shows it running;
- ``queued``: where the provider has slots, one request cut while it waits
  behind a request in every slot; then the slots are freed, and it is
  released if no slot ever ran it;
- ``prefill``: a long prompt (about 3,000 tokens), cut once the provider shows
  it running and before its first token: llama.cpp acts on a cancelled task
  only between batches of ``n_batch`` prompt tokens, so this is the cut that
  can hold a slot for seconds (docs/cancellation-limits.md).

Each check says ``released`` True, False, or None (could not be told),
``release_ms`` (when doctor first *saw* it released: an upper bound, as
llama.cpp is polled at most every 1.5 s) and ``how``. The advice fits what
was found. Runs in the calling thread; its requests live in their own scopes
and every one is cut before it returns.

Before any check, a server that shows nothing of an LLM provider (no
llama.cpp, vLLM or Ollama endpoint) must answer like an OpenAI API
(``GET /v1/models``, or a chat completion or an OpenAI error): else doctor
stops with one line saying it is not one (``DoctorError``).
"""

from __future__ import annotations

import enum
import functools
import json
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import httpx

from wirecut.proof._watchers import (
    LlamaWatcher,
    Poller,
    ProviderKind,
    Sample,
    Watcher,
    identify,
)
from wirecut.provider import ChatClient, ChatResult
from wirecut.scope import InterruptScope

__all__ = ["Check", "CheckMode", "DoctorError", "DoctorReport", "advise", "run_doctor"]

#: What every check asks for: long, so that it is still running when cut.
MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "Write a very long story about a lighthouse keeper."}
]
#: The queued check's own prompt, so no cache makes it start differently.
QUEUED_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "Describe, at great length, every street of an imaginary city."}
]
#: How long a request may take to produce its first token (a model may be loading).
START_TIMEOUT = 60.0
#: After a cut, how long to wait for the provider to let go before saying it did not.
RELEASE_WINDOW = 6.0
#: The first look after a cut comes this long after it: the provider notices at its next token.
SETTLE = 0.25
#: For a provider that cannot say it is running a request: how long to let it start.
BLIND_START = 1.0
#: The prefill check's prompt, in words (about as many tokens for llama.cpp's
#: tokenizers), unless the provider's slot context asks for fewer.
PREFILL_WORDS = 3200
#: ... of which at most this share of one slot's context (llama.cpp's ``n_ctx``).
PREFILL_CONTEXT_SHARE = 0.75
#: A prefill cut that holds the slot longer than this gets advice (issue target: 2 s).
PREFILL_TARGET_MS = 2000.0
_PREFILL_VOCABULARY = (
    "the sea ship rock wave wind tide bell rope lamp door stair glass light night keeper "
    "island harbour storm cloud rain boat sail mast deck chart map star moon sun bird fish"
).split()


class CheckMode(enum.StrEnum):
    """What was cut; the values are docs/protocol.md's ``mode``."""

    STREAM = "stream"  # a streaming request, cut while tokens flow
    NON_STREAM = "non-stream"  # a real non-streaming request, cut while the provider runs it
    QUEUED = "queued"  # a request cut while it waited for a slot
    PREFILL = "prefill"  # a long prompt, cut while the provider processed it


@dataclass
class Check:
    """The outcome of one cut; ``detail`` says in words what was seen."""

    mode: CheckMode
    released: bool | None
    release_ms: float | None
    how: str
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": str(self.mode),
            "released": self.released,
            "release_ms": None if self.release_ms is None else round(self.release_ms, 1),
            "how": self.how,
            "detail": self.detail,
        }


@dataclass
class DoctorReport:
    """What doctor found: docs/protocol.md's ``doctor --json`` object (plus ``url``, ``model``)."""

    provider: ProviderKind
    url: str
    model: str | None
    checks: list[Check] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 when every cut was released; 1 when one was not, or could not be told."""
        return 0 if self.checks and all(c.released is True for c in self.checks) else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "provider": str(self.provider),
            "url": self.url,
            "model": self.model,
            "checks": [check.to_json() for check in self.checks],
            "advice": list(self.advice),
        }

    def lines(self) -> list[str]:
        """The report for people."""
        model = f", model {self.model}" if self.model else ""
        out = [f"provider: {self.provider} at {self.url}{model}"]
        for check in self.checks:
            if check.released is True:
                verdict = "released"
                if check.release_ms is not None:
                    verdict += f" (seen within {check.release_ms:.0f} ms)"
            elif check.released is False:
                verdict = "NOT released"
            else:
                verdict = "unknown"
            out.append(f"{check.mode:<11} {verdict}  [{check.how}]")
            if check.detail:
                out.append(f"{'':<11} {check.detail}")
        out.append("advice:")
        out += [f"  - {line}" for line in self.advice]
        return out


class DoctorError(Exception):
    """Doctor could not run at all; the message is one line for the user."""


def run_doctor(
    base_url: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    min_poll: float | None = None,
    window: float = RELEASE_WINDOW,
    max_tokens: int = 4096,
    modes: tuple[CheckMode, ...] = tuple(CheckMode),
    log: Callable[[str], None] = lambda line: None,
) -> DoctorReport:
    """Identify the provider at ``base_url`` (an API base) and cut three requests on it.

    ``min_poll`` overrides the seconds between two readings of the provider
    (default: the watcher's own, 1.5 s for llama.cpp); ``modes`` limits the
    checks (the queued one runs only where the provider has slots). ``log``
    gets a line as each step begins. Raises ``DoctorError`` when the provider
    cannot be reached, or stops answering while it is watched.

    Cancellation: every request runs on a thread of its own ``InterruptScope``
    and is cut, and its thread joined, before its check returns, also when
    the check ends early or raises (a Ctrl+C included).
    """
    with httpx.Client(headers=_auth(api_key)) as http:
        try:
            watcher = identify(base_url, http)
        except httpx.HTTPError as exc:
            raise DoctorError(f"cannot reach the provider at {base_url}: {exc}") from None
        if watcher.kind is ProviderKind.UNKNOWN:
            problem = not_an_openai_api(base_url, http, model)
            if problem is not None:
                raise DoctorError(problem)
        model = model or _first_model(base_url, http)
        log(f"provider: {watcher.kind} ({watcher.how}); model: {model or 'the default'}")
        params: dict[str, Any] = {"max_tokens": max_tokens}
        if watcher.kind in (ProviderKind.LLAMA_CPP, ProviderKind.VLLM):
            params["ignore_eos"] = True  # A tiny model may stop at once otherwise.
        doctor = _Doctor(
            watcher=watcher,
            poller=Poller(watcher, min_poll),
            client=ChatClient(base_url, api_key=api_key, model=model, max_retries=0),
            params=params,
            window=window,
            log=log,
        )
        report = DoctorReport(watcher.kind, base_url, model)
        checks: list[Callable[[], Check]] = []
        if CheckMode.STREAM in modes:
            checks.append(doctor.stream)
        if CheckMode.NON_STREAM in modes:
            checks.append(doctor.non_stream)
        if CheckMode.QUEUED in modes and watcher.slots:
            checks.append(functools.partial(doctor.queued, watcher.slots))
        if CheckMode.PREFILL in modes:
            checks.append(doctor.prefill)
        try:
            for run_check in checks:
                check = run_check()
                report.checks.append(check)
                if check.released is not True:
                    # What it left running is no baseline for the next check.
                    doctor.idle = None
        except (httpx.HTTPError, ValueError) as exc:
            # /slots, /metrics or /api/ps stopped answering (or answered nonsense).
            raise DoctorError(f"lost the provider at {base_url} while watching it: {exc}") from None
        finally:
            doctor.client.close()
        report.advice = advise(watcher, report.checks, doctor.poller.interval)
        return report


def not_an_openai_api(base_url: str, http: httpx.Client, model: str | None) -> str | None:
    """One line saying why ``base_url`` is not an OpenAI-compatible API; None when it may be.

    Asks ``GET /models``; when that is no OpenAI model list, sends one
    streamed chat completion of one token and reads the start of its answer.
    Only an answer that is neither an event stream nor OpenAI-shaped JSON (a
    completion or an ``{"error": ...}``) counts against it: a timeout or a
    refused connection says nothing, and the checks will tell.
    """
    api = base_url.rstrip("/")
    try:
        listing = http.get(api + "/models", timeout=5)
        if _openai_json(listing.content, ("data",)):
            return None
        body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        body.update(stream=True, **({"model": model} if model else {}))
        with http.stream("POST", api + "/chat/completions", json=body, timeout=10) as answer:
            kind = answer.headers.get("content-type", "").split(";")[0].strip() or "no type"
            if kind == "text/event-stream":
                return None
            start = b""
            for chunk in answer.iter_bytes():
                start += chunk
                if len(start) >= 4096:
                    break
    except httpx.HTTPError:
        return None
    if _openai_json(start, ("choices", "error", "object")):
        return None
    return (
        f"{base_url} is not an OpenAI-compatible API: GET /models answered "
        f"{listing.status_code}, POST /chat/completions answered {answer.status_code} "
        f"({kind}), neither in the OpenAI shape"
    )


def _openai_json(data: bytes, keys: tuple[str, ...]) -> bool:
    try:
        value = json.loads(data)
    except ValueError:
        return False
    return isinstance(value, dict) and any(key in value for key in keys)


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _first_model(base_url: str, http: httpx.Client) -> str | None:
    try:
        body = http.get(base_url.rstrip("/") + "/models", timeout=5).json()
        return str(body["data"][0]["id"])
    except (httpx.HTTPError, ValueError, LookupError, TypeError):
        return None


@dataclass
class _Running:
    """One request of doctor's, on its own thread under its own scope."""

    scope: InterruptScope
    future: Future[ChatResult]
    first_token: threading.Event

    def cut(self, bound: float = 10.0) -> None:
        """Cancel the scope and wait until the request returned and its socket is gone."""
        self.scope.cancel("doctor")
        try:
            self.future.result(bound)
        except BaseException:
            pass  # Interrupted before sending, or the provider failed: it is over either way.
        self.scope.wait_quiescent(bound)


@dataclass
class _Doctor:
    watcher: Watcher
    poller: Poller
    client: ChatClient
    params: dict[str, Any]
    window: float
    log: Callable[[str], None]
    idle: Sample | None = None

    def _start(
        self,
        name: str,
        *,
        stream: bool = True,
        messages: list[dict[str, Any]] = MESSAGES,
        params: dict[str, Any] | None = None,
    ) -> _Running:
        scope = InterruptScope(f"doctor-{name}")
        first = threading.Event()
        kwargs: dict[str, Any] = dict(self.params if params is None else params)
        if stream:
            kwargs["on_token"] = lambda _: first.set()
        else:
            kwargs.update(stream=False, wire_stream=False)
        future = scope.spawn(self.client.chat, messages, **kwargs)
        return _Running(scope, future, first)

    def _idle(self) -> Sample:
        """What runs on the provider when no request of this check does.

        Read once, and again after a check whose request the provider did
        not visibly let go (``run_doctor`` forgets it then).
        """
        if self.idle is None:
            self.idle = self.poller.sample()
        return self.idle

    # -- the checks ---------------------------------------------------------------------

    def stream(self) -> Check:
        self.log("stream: a long streaming generation, cut once tokens flow")
        idle = self._idle()
        run = self._start("stream")
        try:
            problem = _wait_first_token(run)
            if problem is not None:
                return Check(CheckMode.STREAM, None, None, self.watcher.how, problem)
            busy = self.poller.sample()
            # Cut just before the next reading is allowed, so that reading comes SETTLE after.
            _sleep_until(self.poller.next_at() - SETTLE)
            cancelled_at = time.monotonic()
            run.cut()
        finally:
            run.cut()
        return self._watch(CheckMode.STREAM, idle, busy, cancelled_at)

    def non_stream(self) -> Check:
        self.log("non-stream: a long non-streaming generation, cut while it runs")
        idle = self._idle()
        run = self._start("non-stream", stream=False)
        try:
            busy = self._wait_running(run, idle)
            if isinstance(busy, str):
                return Check(CheckMode.NON_STREAM, None, None, self.watcher.how, busy)
            _sleep_until(self.poller.next_at() - SETTLE)
            cancelled_at = time.monotonic()
            run.cut()
        finally:
            run.cut()
        return self._watch(CheckMode.NON_STREAM, idle, busy, cancelled_at)

    def queued(self, slots: int) -> Check:
        self.log(f"queued: {slots} request(s) fill the slots; one more is cut while it waits")
        idle = self._idle()
        how = self.watcher.how
        blockers = [self._start(f"blocker-{i}") for i in range(slots)]
        target: _Running | None = None
        try:
            for blocker in blockers:
                problem = _wait_first_token(blocker)
                if problem is not None:
                    return Check(CheckMode.QUEUED, None, None, how, f"a request ahead: {problem}")
            target = self._start("queued", messages=QUEUED_MESSAGES)
            full = self.poller.sample()  # The target has been waiting at least this long.
            if target.first_token.is_set() or target.future.done():
                return Check(
                    CheckMode.QUEUED, None, None, how, "the request was not queued: it ran at once"
                )
            ahead = full.tasks | full.last_tasks
            target.cut()
            cancelled_at = time.monotonic()
            release_ms = None
            if full.waiting is not None and idle.waiting is not None:
                # llama.cpp counts queued requests: see the count drop back.
                release_ms = self._watch_queue(idle, cancelled_at)
            for blocker in blockers:
                blocker.cut()
            freed_at = time.monotonic()
            readings = [self.poller.sample(not_before=freed_at + SETTLE) for _ in range(2)]
        finally:
            for running in [*blockers, *([target] if target else [])]:
                running.cut()
        if not ahead and not any(r.last_tasks for r in readings):
            return Check(CheckMode.QUEUED, None, None, how, "the slots do not say what they run")
        ran = [
            task
            for r in readings
            for task in r.last_tasks | r.tasks
            if task not in ahead and task not in idle.last_tasks
        ]
        if ran:
            return Check(
                CheckMode.QUEUED,
                False,
                None,
                how,
                f"a slot ran it after its client had left (task {ran[0]})",
            )
        if any(r.running for r in readings[-1:]):
            return Check(
                CheckMode.QUEUED, None, None, how, "the slots were still busy after the cut"
            )
        return Check(
            CheckMode.QUEUED, True, release_ms, how, "no slot ran it after the slots freed"
        )

    def prefill(self) -> Check:
        words = PREFILL_WORDS
        if self.watcher.slot_context is not None:
            words = min(words, int(self.watcher.slot_context * PREFILL_CONTEXT_SHARE))
        self.log(f"prefill: a prompt of {words} words, cut while the provider processes it")
        idle = self._idle()
        how = self.watcher.how
        params = {**self.params, "max_tokens": 16}
        run = self._start("prefill", messages=_long_prompt(words), params=params)
        sent_at = time.monotonic()
        try:
            busy = self._wait_running(run, idle)
            if isinstance(busy, str):
                return Check(CheckMode.PREFILL, None, None, how, busy)
            if run.future.done():
                return Check(CheckMode.PREFILL, None, None, how, _early_end(run))
            if run.first_token.is_set():
                took = time.monotonic() - sent_at
                return Check(
                    CheckMode.PREFILL,
                    None,
                    None,
                    how,
                    f"the provider had processed the whole prompt within {took:.1f} s, before "
                    "doctor could cut it: a prefill cut is bounded by about that",
                )
            cancelled_at = time.monotonic()
            run.cut()
        finally:
            run.cut()
        return self._watch(CheckMode.PREFILL, idle, busy, cancelled_at)

    # -- watching -----------------------------------------------------------------------

    def _watch_queue(self, idle: Sample, cancelled_at: float) -> float | None:
        """Ms until the provider's count of queued requests fell back (None: not in the window)."""
        assert idle.waiting is not None
        while True:
            reading = self.poller.sample(not_before=cancelled_at + SETTLE)
            elapsed = reading.at - cancelled_at
            if reading.waiting is not None and reading.waiting <= idle.waiting:
                return elapsed * 1000
            if elapsed >= self.window:
                return None

    def _wait_running(self, run: _Running, idle: Sample) -> Sample | str:
        """A reading that shows ``run`` running, or a sentence saying why there is none."""
        if not self.watcher.sees:
            return self.poller.sample()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if run.future.done():
                return _early_end(run)
            reading = self.poller.sample()
            busy = self.watcher.busy(reading, idle)
            if busy:
                return reading
            if busy is None:
                # The provider does not count requests: give it time to start.
                _sleep_until(reading.at + BLIND_START)
                return reading if not run.future.done() else _early_end(run)
        return f"the provider did not show it running within {START_TIMEOUT:.0f} s"

    def _watch(self, mode: CheckMode, idle: Sample, busy: Sample, cancelled_at: float) -> Check:
        how = self.watcher.how
        if not self.watcher.sees:
            return Check(mode, None, None, how, _blind(self.watcher))
        if self.watcher.busy(busy, idle) is False:
            return Check(mode, None, None, how, "the provider did not show the request running")
        previous = busy
        while True:
            reading = self.poller.sample(not_before=cancelled_at + SETTLE)
            released = self.watcher.released(reading, busy, idle, previous)
            elapsed = reading.at - cancelled_at
            if released:
                return Check(mode, True, elapsed * 1000, how, "")
            if elapsed >= self.window:
                if released is None:
                    return Check(mode, None, None, how, _blind(self.watcher))
                return Check(mode, False, None, how, f"still running {elapsed:.1f} s after the cut")
            previous = reading


def _long_prompt(words: int) -> list[dict[str, Any]]:
    """A prompt of about ``words`` tokens that no provider has cached a prefix of."""
    rng = random.Random()
    # A new first line each time: llama.cpp reuses a slot's cached prompt prefix.
    text = [f"Logbook {rng.getrandbits(64):x}. Summarise it."]
    text += [rng.choice(_PREFILL_VOCABULARY) for _ in range(words)]
    return [{"role": "user", "content": " ".join(text)}]


def _wait_first_token(run: _Running) -> str | None:
    deadline = time.monotonic() + START_TIMEOUT
    while not run.first_token.wait(0.05):
        if run.future.done():
            return _early_end(run)
        if time.monotonic() > deadline:
            return f"no token within {START_TIMEOUT:.0f} s"
    return None


def _early_end(run: _Running) -> str:
    try:
        result = run.future.result(0)
    except BaseException as exc:
        return f"the request failed: {exc}"
    return f"the provider finished the reply ({result.finish_reason}) before it could be cut"


def _sleep_until(at: float) -> None:
    delay = at - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _blind(watcher: Watcher) -> str:
    if watcher.kind is ProviderKind.UNKNOWN:
        return "this provider exposes nothing that says whether it still runs the request"
    return f"{watcher.how} did not say whether the request still runs"


_PREFILL_ADVICE = {
    ProviderKind.LLAMA_CPP: (
        "a cut during prompt processing held the slot: llama.cpp acts on a cancelled task only "
        "between batches of --batch-size prompt tokens (2048 by default). Start llama-server "
        "with smaller batches (--batch-size and --ubatch-size, e.g. 256 or less on a CPU: 256 "
        "tokens took under a second on two idle cores, at the default's prompt throughput), "
        "or give it a less loaded machine (docs/cancellation-limits.md)."
    ),
    ProviderKind.VLLM: (
        "a cut during prompt processing held the request: vLLM drops an aborted request between "
        "engine steps, and a long prompt is split over steps only by chunked prefill. Keep "
        "--enable-chunked-prefill on and lower --max-num-batched-tokens so that one step's "
        "share of a prompt is short."
    ),
    ProviderKind.OLLAMA: (
        "a cut during prompt processing held the model: Ollama runs llama.cpp's server with "
        "its --batch-size and --ubatch-size set from num_batch (512 by default), and llama.cpp "
        "acts on a cancelled request only between such batches (Ollama's older runner only at "
        "the first token, after the whole prompt). Lower num_batch in the model's options "
        "(PARAMETER num_batch 128 in a Modelfile, or options.num_batch)."
    ),
    ProviderKind.UNKNOWN: (
        "a cut during prompt processing held the request: this provider finishes (a batch of) "
        "the prompt before it looks at the closed connection. Ask its operator for smaller "
        "prompt batches, or keep prompts short."
    ),
}


def advise(watcher: Watcher, checks: list[Check], poll_interval: float = 0.0) -> list[str]:
    """Advice that fits what was found (one sentence each).

    ``poll_interval``: seconds between the readings; a release seen at
    ``release_ms`` happened after the reading before it, ``poll_interval``
    earlier.
    """
    by_mode = {check.mode: check for check in checks}
    advice: list[str] = []
    stream = by_mode.get(CheckMode.STREAM)
    whole = by_mode.get(CheckMode.NON_STREAM)
    queued = by_mode.get(CheckMode.QUEUED)
    if watcher.kind is ProviderKind.UNKNOWN:
        advice.append(
            "doctor cannot see what this provider runs: no llama.cpp /slots or /metrics, vLLM "
            "/metrics or Ollama /api/ps answered. Ask its operator whether a closed connection "
            "stops generation, or point doctor at a provider that says."
        )
    elif isinstance(watcher, LlamaWatcher) and not watcher.use_slots:
        advice.append(
            "llama.cpp's /slots is off: /metrics says less. Start llama-server with --slots "
            "(and --metrics) for a precise answer."
        )
    if stream and stream.released is False:
        advice.append(
            "this provider keeps decoding a streaming request after its client left: a cut "
            "request holds its slot until max_tokens. Set a modest max_tokens on every request "
            "and report it to the provider's maintainers."
        )
    if whole and whole.released is False and (stream is None or stream.released is not False):
        advice.append(
            "this provider keeps non-streaming requests running after the client leaves: keep "
            "wire streaming on (wirecut's ChatClient streams on the wire by default; do not "
            "pass wire_stream=False)."
        )
    if queued and queued.released is False:
        advice.append(
            "a request cut while queued still took a slot once one freed (llama.cpp #13262): it "
            "is let go at its first token, but it costs a prompt pass. No setting of the engine "
            "changes that; keep requests out of its queue: wirecut serve (its console) and "
            "wirecut proxy hand it no more requests than its slots, and a request cancelled in "
            "their own line never reaches it. Other clients: give llama-server as many slots "
            "(-np) as requests they run at once."
        )
    prefill = by_mode.get(CheckMode.PREFILL)
    slow_prefill = False
    if prefill is not None and (
        prefill.released is False
        or (
            # Still busy at the reading before: certainly held past the target.
            prefill.release_ms is not None
            and prefill.release_ms - poll_interval * 1000 > PREFILL_TARGET_MS
        )
    ):
        slow_prefill = True
        advice.append(_PREFILL_ADVICE.get(watcher.kind, _PREFILL_ADVICE[ProviderKind.UNKNOWN]))
    if checks and all(check.released is True for check in checks) and not slow_prefill:
        advice.append(
            "every cut was released: cancelling through wirecut frees the slot on this provider; "
            "nothing to change."
        )
    elif any(check.released is None for check in checks) and watcher.kind is not (
        ProviderKind.UNKNOWN
    ):
        advice.append(
            "some checks could not be told (see their detail); run doctor again when the provider "
            "is otherwise idle."
        )
    return advice
