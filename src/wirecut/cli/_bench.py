"""``wirecut bench``: cancellation benchmarks of wirecut against what hosts do today.

A progress bar on stderr while it runs; then a table on stdout, and
``DIR/bench.json`` (docs/protocol.md, "Proof tools") and ``DIR/bench.png``.
Needs the ``openai`` SDK (a baseline) and ``matplotlib`` (the chart).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import click

__all__ = ["bench"]


def _levels(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        levels = tuple(int(word) for word in value.split(","))
    except ValueError:
        raise click.BadParameter(f"a comma-separated list of counts, not {value!r}") from None
    if not levels or any(n < 1 or n > 256 for n in levels):
        raise click.BadParameter(f"each count must be in 1..256, not {value!r}")
    return levels


def _window(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise click.BadParameter(f"must be a finite number of seconds > 0, not {value}")
    return value


@click.command("bench")
@click.option(
    "--quick", is_flag=True, help="A reduced set: about a minute on an idle machine of 2 CPUs."
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("bench-out"),
    show_default=True,
    help="Where bench.json and bench.png go.",
)
# For tests and experiments: other concurrency levels, a shorter watch.
@click.option("--concurrency", callback=_levels, default=None, hidden=True)
@click.option("--window", type=float, callback=_window, default=None, hidden=True)
def bench(
    quick: bool,
    out: Path,
    concurrency: tuple[int, ...] | None,
    window: float | None,
) -> None:
    """Cancel latency, provider close and leftovers: wirecut vs three baselines."""
    missing = [name for name in ("openai", "matplotlib") if importlib.util.find_spec(name) is None]
    if missing:
        raise click.ClickException(
            f"wirecut bench needs {' and '.join(missing)}: pip install 'wirecut[bench]' "
            f"(or pip install {' '.join(missing)})"
        )
    from wirecut.proof._bench import BenchSettings, plan
    from wirecut.proof._chart import write_chart
    from wirecut.simulator import SimConfig

    overrides: dict[str, Any] = {}
    if concurrency is not None:
        overrides["concurrency"] = concurrency
    if window is not None:
        overrides["window"] = window
    levels = concurrency or BenchSettings().concurrency
    overrides["sim"] = SimConfig(
        slots=max(levels), endless=True, tokens_per_second=20, prompt_ms=50
    )
    settings = BenchSettings.quick(**overrides) if quick else BenchSettings(**overrides)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.BadParameter(f"cannot create {out}: {exc}", param_hint="--out") from None

    report = _run_with_progress(settings, sum(batches for *_, batches in plan(settings)) + 1)
    data = report.to_json()
    # How to run it again: scripts/benchmarks.py heads the section with it.
    data["command"] = " ".join(
        [
            "wirecut bench",
            *(["--quick"] if quick else []),
            *(["--concurrency", ",".join(map(str, concurrency))] if concurrency else []),
            *(["--window", f"{window:g}"] if window is not None else []),
            "--out",
            str(out),
        ]
    )
    (out / "bench.json").write_text(json.dumps(data, indent=2) + "\n")
    write_chart(data, out / "bench.png")
    _print_table(data)
    click.echo(f"wrote {out / 'bench.json'} and {out / 'bench.png'} ({report.seconds:.0f} s)")
    sys.stdout.flush()


def _run_with_progress(settings: Any, total: int) -> Any:
    import httpx
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from websockets.exceptions import WebSocketException

    from wirecut.client import LinkError
    from wirecut.proof._bench import run_bench

    progress = Progress(
        TextColumn("{task.description:<44}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    with progress:
        task = progress.add_task("bench", total=total)
        first = [True]

        def on_batch(label: str) -> None:
            if not first[0]:
                progress.advance(task)
            first[0] = False
            progress.update(task, description=label)

        try:
            report = run_bench(settings, on_batch=on_batch)
        except (
            TimeoutError,
            RuntimeError,
            OSError,
            httpx.HTTPError,
            LinkError,
            WebSocketException,
        ) as exc:
            # One line: a proof tool's failure is a finding to read, not a traceback.
            said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise click.ClickException(f"{said} ({type(exc).__name__})") from None
        progress.update(task, completed=total, description="done")
    return report


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _print_table(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="cancel: wirecut vs what hosts do today (simulator, endless)")
    for header in (
        "scenario",
        "at once",
        "system",
        "trials",
        "cancel->complete p50/p99 ms",
        "cancel->provider close p50/p99 ms",
        "never",
        "slot-s after cancel",
        "leaked",
    ):
        table.add_column(header, justify="left" if header in ("scenario", "system") else "right")
    for row in data["rows"]:
        complete = row["cancel_to_complete_ms"]
        close = row["cancel_to_provider_close_ms"]
        table.add_row(
            row["scenario"],
            str(row["concurrency"]),
            row["system"],
            str(row["trials"]),
            f"{_ms(complete['p50'])} / {_ms(complete['p99'])}",
            "never" if close["p50"] is None else f"{_ms(close['p50'])} / {_ms(close['p99'])}",
            str(close["never"]),
            f"{row['slot_seconds_after_cancel']:.3f}",
            str(row["leaked"]),
        )
    console = Console(width=max(140, Console().width))
    console.print(table)
    figures = data.get("console") or {}
    memory = figures.get("memory_per_command_kib")
    console.print(
        f"console: `sleep 0` {figures.get('sleep0_commands_per_second')} commands/s; "
        f"memory per command in flight {'-' if memory is None else f'{memory} KiB'} "
        f"({figures.get('workers')} workers)"
    )
