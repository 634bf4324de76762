"""``wirecut repro``: the seed incident in one command; prints the facts of its cancel.

Output (stdout) is docs/protocol.md's "Proof tools" form; progress goes to
stderr. Exits 0 only when every fact holds for wirecut.
"""

from __future__ import annotations

from pathlib import Path

import click

from wirecut.cli._options import exit_with_report, progress_log, proof_api_key, provider_options

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

    from wirecut.proof import ReproError, run_repro

    key = proof_api_key("repro", provider_url, api_key_flag, api_key_file)
    try:
        report = run_repro(
            provider_url=provider_url,
            model=model,
            api_key=key,
            baseline=baseline,
            log=progress_log("repro"),
        )
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach the provider at {provider_url}: {exc}") from None
    except (TimeoutError, ReproError) as exc:
        raise click.ClickException(str(exc)) from None
    exit_with_report(report.lines(), report.exit_code)
