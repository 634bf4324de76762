"""``wirecut provider``: the llama.cpp-like simulator as a program.

Imports ``wirecut.simulator`` (and so uvicorn and Starlette) only when the
command runs, so that ``wirecut --help`` stays fast.
"""

from __future__ import annotations

import math

import click

__all__ = ["provider"]


def _positive_finite(ctx: click.Context, param: click.Parameter, value: float) -> float:
    # click's FloatRange lets NaN through (every comparison with NaN is False).
    if not math.isfinite(value) or value <= 0:
        raise click.BadParameter(f"must be a finite number > 0, got {value}")
    return value


def _optional_positive_finite(
    ctx: click.Context, param: click.Parameter, value: float | None
) -> float | None:
    return None if value is None else _positive_finite(ctx, param, value)


def _non_negative_finite(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise click.BadParameter(f"must be a finite number >= 0, got {value}")
    return value


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="TCP port (0 picks a free one).",
)
@click.option(
    "--slots",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Requests decoded at once; the rest wait in a FIFO queue.",
)
@click.option(
    "--tokens-per-second",
    type=float,
    default=20.0,
    show_default=True,
    callback=_positive_finite,
    help="Decode rate of each slot.",
)
@click.option(
    "--prompt-ms",
    type=float,
    default=300.0,
    show_default=True,
    callback=_non_negative_finite,
    help="Time from taking a slot to the first token, whatever the prompt.",
)
@click.option(
    "--prompt-tokens-per-second",
    type=float,
    default=None,
    callback=_optional_positive_finite,
    help="Process each prompt at this rate instead of --prompt-ms, in batches of "
    "--prompt-batch tokens; a client that closed is noticed only between batches, "
    "as llama.cpp does.",
)
@click.option(
    "--prompt-batch",
    type=click.IntRange(min=1),
    default=2048,
    show_default=True,
    help="Prompt tokens per batch with --prompt-tokens-per-second (llama.cpp's n_batch).",
)
@click.option(
    "--reply-tokens",
    type=click.IntRange(min=0),
    default=48,
    show_default=True,
    help="Length of a reply (the request's max_tokens still caps it).",
)
@click.option(
    "--endless",
    is_flag=True,
    help="Decode up to the request's max_tokens, or without end when it gives none.",
)
@click.option(
    "--multibyte-every",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Make every Nth generated word multi-byte text, a token per UTF-8 byte, so a "
    "stream sends fewer chunks than tokens, as llama.cpp does (0: never).",
)
def provider(
    host: str,
    port: int,
    slots: int,
    tokens_per_second: float,
    prompt_ms: float,
    prompt_tokens_per_second: float | None,
    prompt_batch: int,
    reply_tokens: int,
    endless: bool,
    multibyte_every: int,
) -> None:
    """Run the llama.cpp-like OpenAI-compatible simulator until Ctrl+C."""
    from wirecut.simulator import SimConfig, serve_forever

    config = SimConfig(
        slots=slots,
        tokens_per_second=tokens_per_second,
        prompt_ms=prompt_ms,
        prompt_tokens_per_second=prompt_tokens_per_second,
        prompt_batch=prompt_batch,
        reply_tokens=reply_tokens,
        endless=endless,
        multibyte_every=multibyte_every,
    )

    def announce(base_url: str) -> None:
        mode = ", endless" if endless else ""
        if prompt_tokens_per_second is not None:
            mode += f", prompt {prompt_tokens_per_second:g} tok/s in batches of {prompt_batch}"
        if multibyte_every:
            mode += f", a multi-byte word in {multibyte_every}"
        click.echo(
            f"wirecut provider: {base_url} (slots={slots}, {tokens_per_second:g} tok/s{mode})"
        )

    try:
        serve_forever(config, host=host, port=port, on_listening=announce)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
