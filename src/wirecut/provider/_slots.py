"""How many requests a provider runs at once: ``provider_slots`` asks llama.cpp.

llama.cpp (and the simulator) list their slots at ``GET /slots`` (when
started with ``--slots``) and give ``total_slots`` in ``GET /props``. Other
providers say nothing of the kind: their count is unknown and an admission
line in front of them is unlimited. A provider that cannot answer yet
(unreachable, or ``503`` while llama.cpp loads its model) has not said:
ask again later.

``slots_in_listing`` and ``slots_in_props`` read the answers and do no
I/O. ``provider_slots`` blocks the calling thread for at most about
``timeout`` seconds; it sends GET requests only, through ``wirecut.http``,
so a cut of the bound scope ends it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

import wirecut.http
from wirecut import _json

__all__ = ["SlotCount", "provider_slots", "slots_in_listing", "slots_in_props"]

#: How long ``provider_slots`` may take by default, in seconds.
SLOTS_TIMEOUT = 2.0
#: The most of one answer it reads (a /slots listing of many slots is long).
MAX_ANSWER_BYTES = 1024 * 1024


@dataclass(frozen=True)
class SlotCount:
    """A provider's slots (None: it does not say), whether that is final, and where it came from.

    ``settled`` is False when the provider could not answer yet (unreachable,
    loading): the count is unknown for now, and worth asking again.
    """

    slots: int | None
    settled: bool
    source: str | None = None


def slots_in_listing(listing: object) -> int | None:
    """The slot count of a llama.cpp ``GET /slots`` answer; None if it is not one."""
    if (
        isinstance(listing, list)
        and listing
        and all(isinstance(slot, dict) and "is_processing" in slot for slot in listing)
    ):
        return len(listing)
    return None


def slots_in_props(props: object) -> tuple[bool, int | None]:
    """Whether a ``GET /props`` answer is llama.cpp's, and its ``total_slots`` if it says."""
    if not isinstance(props, dict):
        return False, None
    if "total_slots" not in props and "default_generation_settings" not in props:
        return False, None
    total = props.get("total_slots")
    if isinstance(total, int) and not isinstance(total, bool) and total > 0:
        return True, total
    return True, None


def provider_slots(
    base_url: str, *, api_key: str | None = None, timeout: float = SLOTS_TIMEOUT
) -> SlotCount:
    """Ask the provider at ``base_url`` (an API base, ``http://host:port/v1``) for its slots.

    ``/slots`` first, then ``/props``, at the server root. Never raises for
    the provider's answers: a connection that fails, or a ``503`` (llama.cpp
    loading its model), is a count not ``settled``; any other answer that is
    neither is a settled unknown (None).
    """
    deadline = time.monotonic() + timeout
    root = base_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with wirecut.http.client(headers=headers, follow_redirects=False, trust_env=False) as http:
        for path in ("/slots", "/props"):
            answer = _get(http, root + path, deadline)
            if answer is None or answer[0] == 503:
                return SlotCount(None, settled=False)
            status, body = answer
            if status != 200:
                continue
            value = _parse(body)
            if path == "/slots":
                slots = slots_in_listing(value)
                if slots is not None:
                    return SlotCount(slots, settled=True, source="/slots")
            else:
                is_llama, total = slots_in_props(value)
                if is_llama and total is not None:
                    return SlotCount(total, settled=True, source="/props")
    return SlotCount(None, settled=True)


def _get(http: httpx.Client, url: str, deadline: float) -> tuple[int, bytes] | None:
    """Status and (at most ``MAX_ANSWER_BYTES`` of) the body; None if nothing answered in time."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None
    try:
        with http.stream("GET", url, timeout=remaining) as response:
            body = bytearray()
            for chunk in response.iter_raw():
                body += chunk
                if len(body) > MAX_ANSWER_BYTES or time.monotonic() >= deadline:
                    break
            return response.status_code, bytes(body)
    except httpx.HTTPError:
        return None


def _parse(body: bytes) -> object:
    try:
        return _json.loads(body)
    except _json.JSONError:
        return None
