"""``wirecut doctor``: does a cancel free the slot on *your* provider?

Prints the findings for people, or with ``--json`` one JSON object
(docs/protocol.md, "Proof tools"). Exits 0 when every cut was released, 1 when
one was not or could not be told (or the provider could not be reached),
2 on a usage error.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click

from wirecut.cli._options import api_key, provider_options

__all__ = ["doctor"]


def _poll(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and (not math.isfinite(value) or value < 0):
        raise click.BadParameter(f"must be a finite number of seconds >= 0, not {value}")
    return value


def _modes(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    known = ("stream", "non-stream", "queued", "prefill")
    modes = tuple(word.strip() for word in value.split(",") if word.strip())
    unknown = [mode for mode in modes if mode not in known]
    if unknown or not modes:
        raise click.BadParameter(f"a comma-separated list of {', '.join(known)}, not {value!r}")
    return modes


@click.command("doctor")
@provider_options(
    url_help="The provider's OpenAI-compatible API base (http://host:port/v1). "
    "Default: $WIRECUT_PROVIDER_URL, then $OPENAI_BASE_URL.",
    model_help="The model to ask for. Default: the first listed.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as one JSON object.")
# For tests: the simulator and fakes need no 1.5 s between polls; a shorter watch.
@click.option("--min-poll", type=float, default=None, callback=_poll, hidden=True)
@click.option("--window", type=float, default=None, callback=_poll, hidden=True)
@click.option("--modes", default="stream,non-stream,queued,prefill", callback=_modes, hidden=True)
def doctor(
    provider_url: str | None,
    model: str | None,
    api_key_flag: str | None,
    api_key_file: Path | None,
    as_json: bool,
    min_poll: float | None,
    window: float | None,
    modes: tuple[str, ...],
) -> None:
    """Cut requests (streaming, not, queued, in their prompt); did the provider let go?"""
    from wirecut.launch import given_provider_url
    from wirecut.proof import CheckMode, DoctorError, run_doctor, url_problem
    from wirecut.proof._doctor import RELEASE_WINDOW

    url, _ = given_provider_url(provider_url, "--provider-url")
    if not url:
        raise click.UsageError(
            "give the provider with --provider-url URL (or set WIRECUT_PROVIDER_URL)"
        )
    problem = url_problem(url)
    if problem is not None:
        raise click.BadParameter(problem, param_hint="--provider-url")
    key = api_key("doctor", api_key_flag, api_key_file)

    def log(line: str) -> None:
        click.echo(f"doctor: {line}", err=True)

    try:
        report = run_doctor(
            url,
            model=model,
            api_key=key,
            min_poll=min_poll,
            window=RELEASE_WINDOW if window is None else window,
            modes=tuple(CheckMode(mode) for mode in modes),
            log=log,
        )
    except DoctorError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        for line in report.lines():
            click.echo(line)
    sys.stdout.flush()
    sys.exit(report.exit_code)
