"""``TokenCounter``: counts text in tokens with the upstream's own tokenizer.

llama.cpp serves its model's tokenizer and chat template beside the
generation APIs: ``POST /tokenize`` (``{"content": TEXT, "add_special":
BOOL}`` -> ``{"tokens": [id, ...]}``) and ``POST /apply-template`` (a chat
body -> ``{"prompt": TEXT}``, the prompt its chat completion would
tokenize). So the proxy can count what it relayed, and the prompt, in the
tokens the upstream itself would have reported, after a cut took the
upstream's own count away.

Never on a request's way: the proxy asks only after the request's cut and
the end of its relay (``_usage.bill``), a few at a time per upstream
(``concurrency``), each ask bounded by the caller's deadline; any failure
(no answer in time, an error status, a body that is not what llama.cpp
sends) is ``None``, and the caller falls back to counting chunks.

Event loop only.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from wirecut._json import JSONError, loads
from wirecut.proxy._dialects import Prompt
from wirecut.proxy._upstream import BodyTooLarge, Upstream, read_bounded

__all__ = ["TokenCounter"]

#: The largest answer read from ``/tokenize`` or ``/apply-template``.
ANSWER_LIMIT = 32 * 1024 * 1024


class TokenCounter:
    """Counts with ``upstream``'s ``/tokenize`` and ``/apply-template`` (see the module)."""

    def __init__(self, upstream: Upstream, *, concurrency: int = 4) -> None:
        self._upstream = upstream
        # Bounds the asks at once: a burst of cuts must not become a burst at the engine.
        self._turns = asyncio.Semaphore(concurrency)

    async def tokens(self, text: str, *, special: bool, deadline: float) -> int | None:
        """How many tokens ``text`` is (``special``: with the BOS the model adds), or None."""
        if not text:
            return 0
        body = json.dumps({"content": text, "add_special": special}, ensure_ascii=False)
        answer = await self._post("/tokenize", body.encode(), deadline)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        return len(tokens) if isinstance(tokens, list) else None

    async def prompt(self, prompt: Prompt, *, deadline: float) -> int | None:
        """How many tokens ``prompt`` is, as the upstream would count it; None if it cannot say."""
        if prompt.tokens is not None:
            return prompt.tokens
        text = prompt.text
        if prompt.template is not None:
            answer = await self._post("/apply-template", prompt.template, deadline)
            text = answer.get("prompt") if isinstance(answer, dict) else None
        if not isinstance(text, str):
            return None
        return await self.tokens(text, special=True, deadline=deadline)

    async def _post(self, path: str, body: bytes, deadline: float) -> Any:
        upstream = self._upstream
        headers = [*upstream.headers, ("Content-Type", "application/json")]
        try:
            async with asyncio.timeout_at(deadline), self._turns:
                response = await upstream.client.send(
                    "POST", upstream.root_prefix + path, headers, body, scope=None
                )
                try:
                    if response.status_code != 200:
                        return None
                    raw = await read_bounded(response, ANSWER_LIMIT, f"the upstream's {path}")
                finally:
                    response.close()
        except (TimeoutError, httpx.HTTPError, BodyTooLarge, OSError, ValueError):
            return None
        try:
            return loads(raw)
        except JSONError:
            return None
