"""Which provider an app talks to: one at a URL, else one it starts (llama.cpp, simulator).

``wirecut serve``, ``wirecut proxy`` and ``wirecut doctor`` take a provider URL
from their option, then ``$WIRECUT_PROVIDER_URL``, then ``$OPENAI_BASE_URL``
(``given_provider_url``); with none, ``resolve_provider`` starts the embedded
llama.cpp if the extra ``local`` is installed, else the built-in simulator, and
returns a ``Provider`` that says what it is and how to stop it.

Call from the application's main thread, before it serves: starting the
embedded server may fetch a model (``echo`` gets the progress lines).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from wirecut.provider import SlotGate, provider_slots

__all__ = [
    "PROVIDER_URL_ENV",
    "Provider",
    "ProviderUnavailable",
    "given_provider_url",
    "resolve_provider",
]

#: Where a provider URL comes from when no option gives it, in the order they are looked at.
PROVIDER_URL_ENV = ("WIRECUT_PROVIDER_URL", "OPENAI_BASE_URL")


def given_provider_url(flag: str | None, option: str) -> tuple[str | None, str | None]:
    """The provider URL a command was given and where it came from, unchecked.

    ``flag`` is the value of ``option`` (``--provider-url``, ``--upstream``);
    then the environment (``PROVIDER_URL_ENV``; the source is the variable's
    name). ``(None, None)`` when none of them gives one (an empty value gives none).
    """
    given = [(option, flag), *((name, os.environ.get(name)) for name in PROVIDER_URL_ENV)]
    for source, url in given:
        if url:
            return url, source
    return None, None


class ProviderUnavailable(Exception):
    """No provider could be started; the message says why, in one line."""


@dataclass
class Provider:
    """The provider the console's commands talk to, and how to stop it if we started it.

    ``slots`` is how many requests it runs at once when we started it and so
    know (None: ask it, ``wirecut.provider.provider_slots``).
    """

    base_url: str
    model: str | None
    label: str
    note: str | None = None
    stop: Callable[[], None] = lambda: None
    slots: int | None = None

    def admission(self, api_key: str | None = None) -> SlotGate:
        """The line every request to this provider takes its turn in (``SlotGate``).

        As many places as the slots of a provider we started; for one at a
        URL, as many as it says (llama.cpp's ``/slots`` or ``/props``, asked
        here and, until it answers, again before later requests); unlimited
        for a provider that does not say. Blocks for at most a few seconds.
        """
        if self.slots is not None:
            return SlotGate(self.slots, source="the provider wirecut started")
        gate = SlotGate(learn=functools.partial(provider_slots, self.base_url, api_key=api_key))
        gate.learn_slots()
        return gate


def resolve_provider(
    url: str | None,
    model: str | None,
    data_dir: Path,
    *,
    embedded: str = "auto",
    source: str | None = None,
    local_model: str = "smollm2",
    local_threads: int | None = None,
    echo: Callable[[str], None] | None = None,
) -> Provider:
    """The provider at ``url``; with none, the embedded llama.cpp if installed, else the simulator.

    ``embedded`` is "auto", "local" or "simulator" (which one to start with no URL).
    ``source`` says where ``url`` came from (``--provider-url``,
    ``WIRECUT_PROVIDER_URL``, ``OPENAI_BASE_URL``) for the banner.
    ``local_model`` is the embedded llama.cpp's model ("smollm2", "gemma" or a
    ``.gguf`` path; docs/local-model.md), ``local_threads`` its llama.cpp
    threads (None: ``default_threads()``); ``echo`` gets its fetch's progress
    line and the line saying it fell back to Gemma.
    """
    if url:
        base = url.rstrip("/")
        return Provider(base, model, f"{base} (from {source or 'the caller'})")
    from wirecut.local import LocalError, LocalServer, is_available

    if embedded == "local" or (embedded == "auto" and is_available()):
        server = LocalServer(local_model, echo=echo, threads=local_threads)
        try:
            server.start()
        except LocalError as exc:
            raise ProviderUnavailable(f"the embedded llama.cpp did not start: {exc}") from None
        chosen = server.local_model
        assert chosen is not None  # resolved by start()
        return Provider(
            server.base_url,
            model or chosen.name,
            f"embedded llama.cpp at {server.base_url} ({chosen.name}, {chosen.path}, "
            f"{server.threads} thread{'s' if server.threads != 1 else ''})",
            note=chosen.note,
            stop=server.stop,
            slots=server.n_parallel,
        )
    from wirecut.simulator import SimConfig, SimulatorServer

    config = SimConfig(slots=2, tokens_per_second=30, prompt_ms=200)
    sim = SimulatorServer(config)
    sim.start()
    return Provider(
        sim.base_url,
        model,
        f"built-in simulator at {sim.base_url} (install the extra `local` for a real model)",
        stop=sim.stop,
        slots=config.slots,
    )
