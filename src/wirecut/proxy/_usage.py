"""``BilledUsage``: a record's token counts, and how each was known; ``bill`` decides them.

Gateways are used for accounting, so a record carries usage for every
request that reached the upstream: the counts the upstream reported, or,
when it was cut (or broke off) before it said, counts the proxy made and
marks ``estimated``:

- the completion in tokens of the upstream's own tokenizer
  (``counted_by: "tokenizer"``: llama.cpp's ``/tokenize`` of the text that
  was relayed), else, as a last resort, the events that carried output
  (``"chunks"``: one per token at best; fewer for multi-byte text);
- the prompt with the same tokenizer and the upstream's chat template
  (``prompt_counted_by: "tokenizer"``), else ``null`` (never a guess).

The Messages API reports the prompt's count in its first event: a cut after
it keeps that count (``prompt_counted_by: "upstream"``). A request that never
reached the upstream has ``completion_tokens: 0``, ``prompt_tokens: null``
and nothing estimated.

``bill`` runs after the request's cut and the end of its relay, never on
its way (event loop).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from wirecut.proxy._counting import TokenCounter
from wirecut.proxy._relay import UpstreamRequest
from wirecut.proxy._tally import Tally

__all__ = ["COUNT_BOUND", "BilledUsage", "CountedBy", "bill"]

#: Seconds the counting of one record may take before it falls back.
COUNT_BOUND = 2.0


class CountedBy(enum.StrEnum):
    """Where a count in a record came from."""

    UPSTREAM = "upstream"  # the upstream reported it
    TOKENIZER = "tokenizer"  # the proxy counted with the upstream's own tokenizer
    CHUNKS = "chunks"  # the proxy counted the events that carried output (last resort)


@dataclass(frozen=True)
class BilledUsage:
    """A record's usage (docs/protocol.md, "The proxy").

    ``counted_by`` says where ``completion_tokens`` came from, and
    ``prompt_counted_by`` where ``prompt_tokens`` did (None: there is no
    count, or nothing reached the upstream).
    """

    prompt_tokens: int | None
    completion_tokens: int | None
    requests: int
    counted_by: CountedBy | None
    prompt_counted_by: CountedBy | None

    @property
    def estimated(self) -> bool:
        """True unless every count is the upstream's own (or nothing reached it)."""
        if self.requests == 0 and self.counted_by is None:
            return False
        return not (
            self.counted_by is CountedBy.UPSTREAM and self.prompt_counted_by is CountedBy.UPSTREAM
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "requests": self.requests,
            "estimated": self.estimated,
            "counted_by": None if self.counted_by is None else str(self.counted_by),
            "prompt_counted_by": (
                None if self.prompt_counted_by is None else str(self.prompt_counted_by)
            ),
        }


def reported(tally: Tally) -> BilledUsage | None:
    """The usage when it needs no counting (None: it does), decided at once."""
    if tally.requests == 0:
        return BilledUsage(None, 0, 0, None, None)
    if tally.prompt_tokens is not None and tally.completion_tokens is not None:
        return BilledUsage(
            tally.prompt_tokens,
            tally.completion_tokens,
            tally.requests,
            CountedBy.UPSTREAM,
            CountedBy.UPSTREAM,
        )
    return None


def by_chunks(tally: Tally) -> BilledUsage:
    """The usage without a tokenizer: what the upstream reported, the rest by chunks."""
    return reported(tally) or BilledUsage(
        tally.prompt_tokens,
        tally.completion_tokens if tally.completion_tokens is not None else tally.deltas,
        tally.requests,
        CountedBy.UPSTREAM if tally.completion_tokens is not None else CountedBy.CHUNKS,
        CountedBy.UPSTREAM if tally.prompt_tokens is not None else None,
    )


async def bill(
    tally: Tally,
    request: UpstreamRequest,
    counter: TokenCounter | None,
    load: Callable[[bytes], Awaitable[dict[str, Any] | None]],
    *,
    bound: float = COUNT_BOUND,
) -> BilledUsage:
    """The usage of a finished request (see the module docstring).

    ``counter`` is None when the upstream offers no tokenizer; ``load``
    parses the request body (off the loop when it is large) for its prompt.
    Never raises for the upstream; takes ``bound`` seconds at most.
    """
    known = reported(tally)
    if known is not None or counter is None:
        return known or by_chunks(tally)
    deadline = asyncio.get_running_loop().time() + bound
    completion, counted_by = tally.completion_tokens, CountedBy.UPSTREAM
    if completion is None:
        completion = await counter.tokens(tally.transcript.text(), special=False, deadline=deadline)
        counted_by = CountedBy.TOKENIZER
        if completion is None:
            completion, counted_by = tally.deltas, CountedBy.CHUNKS
    prompt, prompt_by = tally.prompt_tokens, CountedBy.UPSTREAM
    if prompt is None:
        prompt_by = CountedBy.TOKENIZER
        dialect = request.dialect
        body = await load(request.body) if dialect.prompt_needs_body else {}
        form = None if body is None else dialect.prompt(body, request.body)
        if form is not None:
            prompt = await counter.prompt(form, deadline=deadline)
    return BilledUsage(
        prompt,
        completion,
        tally.requests,
        counted_by,
        prompt_by if prompt is not None else None,
    )
