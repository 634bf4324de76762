"""``wirecut repro``: the seed incident in one command; prints the facts of its cancel.

Output (stdout) is docs/protocol.md's "Proof tools" form; progress goes to
stderr. Exits 0 only when every fact holds for wirecut.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from wirecut.cli._options import api_key, provider_options

__all__ = ["repro"]


@click.command("repro")
@click.option(
    "--baseline",
    is_flag=True,
    help="Also run the command through a naive host (run_in_executor, cancel the waiter).",
)
@provider_options(
    url_help="An OpenAI-compatible API base (http://host:port/v1) instead of the simulator.",
    model_help="The model to ask a given provider for.",
)
def repro(
    baseline: bool,
    provider_url: str | None,
    model: str | None,
    api_key_flag: str | None,
    api_key_file: Path | None,
) -> None:
    """Replay the cancel of `curator run --consolidate --yes` and print its facts."""
    import httpx

    from wirecut.proof import ReproError, run_repro, url_problem

    problem = None if provider_url is None else url_problem(provider_url)
    if problem is not None:
        raise click.BadParameter(problem, param_hint="--provider-url")
    key = api_key("repro", api_key_flag, api_key_file)

    def log(line: str) -> None:
        click.echo(f"repro: {line}", err=True)

    try:
        report = run_repro(
            provider_url=provider_url, model=model, api_key=key, baseline=baseline, log=log
        )
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach the provider at {provider_url}: {exc}") from None
    except (TimeoutError, ReproError) as exc:
        raise click.ClickException(str(exc)) from None
    for line in report.lines():
        click.echo(line)
    sys.stdout.flush()
    sys.exit(report.exit_code)
