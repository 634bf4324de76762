"""``wirecut provider``: the llama.cpp-like simulator as a program.

Imports ``wirecut.simulator`` (and so uvicorn and Starlette) only when the
command runs, so that ``wirecut --help`` stays fast.
"""

from __future__ import annotations

import math
from typing import Any

import click

from wirecut.cli._options import Decorator, listen_options

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


#: A count of at least one.
_COUNT = click.IntRange(min=1)


def _number(
    flag: str, default: float | None, help: str, *, type: Any = float, **kwargs: Any
) -> Decorator:
    """A numeric option, its default shown (when it has one)."""
    shown = default is not None
    return click.option(flag, type=type, default=default, show_default=shown, help=help, **kwargs)


@click.command()
@listen_options(
    8080, host_help="Interface to listen on.", port_help="TCP port (0 picks a free one)."
)
@_number("--slots", 1, "Requests decoded at once; the rest wait in a FIFO queue.", type=_COUNT)
@_number("--tokens-per-second", 20.0, "Decode rate of each slot.", callback=_positive_finite)
@_number(
    "--prompt-ms",
    300.0,
    "Time from taking a slot to the first token, whatever the prompt.",
    callback=_non_negative_finite,
)
@_number(
    "--prompt-tokens-per-second",
    None,
    "Process each prompt at this rate instead of --prompt-ms, in batches of "
    "--prompt-batch tokens; a client that closed is noticed only between batches, "
    "as llama.cpp does.",
    callback=_optional_positive_finite,
)
@_number(
    "--prompt-batch",
    2048,
    "Prompt tokens per batch with --prompt-tokens-per-second (llama.cpp's n_batch).",
    type=_COUNT,
)
@_number(
    "--reply-tokens",
    48,
    "Length of a reply (the request's max_tokens still caps it).",
    type=click.IntRange(min=0),
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
