"""Parse and validate a ``POST /v1/completions`` body (legacy text completions).

``prompt`` is a string, an array of one string, or an array of token ids
(from ``/tokenize``); it is the whole prompt, with no template, as llama.cpp
takes it. A bad body is a ``BadRequest`` naming the field. Call from anywhere.
"""

from __future__ import annotations

from wirecut.simulator._request import (
    Api,
    BadRequest,
    GenerationRequest,
    load_object,
    optional,
    token_limit,
)
from wirecut.simulator._tokenizer import Tokenizer, UnknownToken, count_tokens

__all__ = ["parse_text_request"]


def parse_text_request(raw: bytes, tokenizer: Tokenizer) -> GenerationRequest:
    """Validate ``raw`` as a text-completion body; raise ``BadRequest`` if it is not one.

    ``tokenizer`` turns a prompt of token ids back into its text.
    """
    body = load_object(raw)
    if "prompt" not in body:
        raise BadRequest("'prompt' is required", "prompt")
    text, n_tokens = _prompt(body["prompt"], tokenizer)
    stream = optional(body, "stream", bool, "a boolean") or False
    optional(body, "stream_options", dict, "an object")
    return GenerationRequest(
        api=Api.TEXT,
        body=body,
        messages=[{"role": "user", "content": text}],
        prompt_tokens=n_tokens,
        stream=stream,
        # llama.cpp's last chunk of a text completion always carries usage.
        include_usage=True,
        max_tokens=token_limit(body, "max_tokens"),
        model=optional(body, "model", str, "a string"),
    )


def _prompt(prompt: object, tokenizer: Tokenizer) -> tuple[str, int]:
    if isinstance(prompt, str):
        return prompt, count_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            try:
                return tokenizer.detokenize(prompt), len(prompt)
            except UnknownToken as exc:
                raise BadRequest(f"'prompt' holds an unknown token: {exc}", "prompt") from None
        if all(isinstance(p, str) for p in prompt):
            if len(prompt) != 1:
                raise BadRequest(
                    f"'prompt' holds {len(prompt)} prompts; the simulator serves one a request",
                    "prompt",
                )
            return prompt[0], count_tokens(prompt[0])
    raise BadRequest(
        "'prompt' must be a string, an array of one string or a non-empty array of token ids",
        "prompt",
    )
