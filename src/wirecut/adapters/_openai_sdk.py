"""``openai_client()``: an ``openai.OpenAI`` whose requests and retry backoff a cancel cuts.

The SDK retries a 408/409/429/5xx answer or a transport error after a backoff
(up to ``Retry-After``, at most 60 s), and it sleeps with ``time.sleep``: a
cancel there was seen only when the sleep ended (p50 263 ms, up to 4.9 s with
``Retry-After: 5``). No HTTP client can reach that sleep, so the client class
overrides the SDK's ``_sleep_for_retry``: with a scope bound, the backoff
(computed by the SDK's own ``_calculate_retry_timeout``, so ``Retry-After``
and the jitter are the SDK's) is a ``scope.sleep``, which a cancel ends at
once with ``Interrupted``. Both methods are private: their names and
parameters are checked at import, and a mismatch is a ``RuntimeError``.
"""

from __future__ import annotations

import inspect
from typing import Any

import openai

from wirecut.adapters._openai import openai_http_client
from wirecut.http import DEFAULT_CONNECT_TIMEOUT
from wirecut.http._core import require_private
from wirecut.scope import current_scope

__all__ = ["openai_client"]

_RELIED_ON = {
    "_sleep_for_retry": ["self", "retries_taken", "max_retries", "options", "response"],
    "_calculate_retry_timeout": ["self", "remaining_retries", "options", "response_headers"],
}

require_private(openai.OpenAI, tuple(_RELIED_ON), "openai")
for _name, _parameters in _RELIED_ON.items():
    if list(inspect.signature(getattr(openai.OpenAI, _name)).parameters) != _parameters:
        raise RuntimeError(
            f"wirecut cannot make the retry backoff of openai {openai.__version__} cuttable: "
            f"OpenAI.{_name} changed; install an openai release that wirecut supports"
        )


class _CuttableBackoffOpenAI(openai.OpenAI):
    """``openai.OpenAI`` whose retry backoff sleeps on the bound scope."""

    def _sleep_for_retry(
        self, *, retries_taken: int, max_retries: int, options: Any, response: Any
    ) -> None:
        scope = current_scope()
        if scope is None:
            super()._sleep_for_retry(
                retries_taken=retries_taken,
                max_retries=max_retries,
                options=options,
                response=response,
            )
            return
        seconds = self._calculate_retry_timeout(
            max_retries - retries_taken, options, None if response is None else response.headers
        )
        scope.sleep(seconds)


def openai_client(
    *, connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT, **openai_kwargs: Any
) -> openai.OpenAI:
    """An ``openai.OpenAI`` that a cancel of the bound scope cuts anywhere, backoff included.

    ``openai_kwargs`` go to ``openai.OpenAI`` (``base_url``, ``api_key``,
    ``max_retries``, ``timeout`` ...). ``http_client`` defaults to
    ``openai_http_client(connect_timeout=connect_timeout)``; one passed in
    should be an ``openai_http_client()`` too, or its requests cannot be cut.

    Cancellation: as ``openai_http_client()`` for a request, and a cancel
    during the SDK's retry backoff ends it at once with ``Interrupted``; no
    retry is sent. With no scope bound, it is the plain SDK client.
    """
    if openai_kwargs.get("http_client") is None:
        openai_kwargs["http_client"] = openai_http_client(connect_timeout=connect_timeout)
    return _CuttableBackoffOpenAI(**openai_kwargs)
