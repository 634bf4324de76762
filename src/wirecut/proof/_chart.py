"""``bench.png``: cancel -> provider close per system and concurrency, one panel per scenario.

matplotlib with the Agg backend, through ``Figure`` (no pyplot, no global
state, no display). A cell whose requests were never closed within the
bench's window is drawn as a hatched bar up to the window and labelled
"never"; one closed only in part is labelled with the count never closed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_chart"]

COLOURS = {
    "wirecut": "#2a9d8f",
    "naive": "#e76f51",
    "anyio-abandon": "#f4a261",
    "openai-close": "#8d99ae",
}


def write_chart(report: dict[str, Any], path: Path) -> None:
    """Draw the rows of a ``bench.json`` object into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    rows = report["rows"]
    window_ms = float(report.get("settings", {}).get("window_s", 1.0)) * 1000
    scenarios = list(dict.fromkeys(row["scenario"] for row in rows))
    systems = list(dict.fromkeys(row["system"] for row in rows))
    levels = sorted({row["concurrency"] for row in rows})
    by_key = {(r["system"], r["scenario"], r["concurrency"]): r for r in rows}

    fig = Figure(figsize=(4.2 * max(1, len(scenarios)), 4.2), layout="constrained")
    axes = fig.subplots(1, max(1, len(scenarios)), sharey=True, squeeze=False)[0]
    width = 0.8 / max(1, len(systems))
    floor = 0.01  # ms: the log axis cannot show zero
    for ax, scenario in zip(axes, scenarios, strict=False):
        for s, system in enumerate(systems):
            for c, level in enumerate(levels):
                row = by_key.get((system, scenario, level))
                if row is None:
                    continue
                x = c + (s - (len(systems) - 1) / 2) * width
                close = row["cancel_to_provider_close_ms"]
                colour = COLOURS.get(system, "#555555")
                label = system if c == 0 else None
                if close["p99"] is None:
                    ax.bar(
                        x,
                        window_ms,
                        width,
                        color="white",
                        edgecolor=colour,
                        hatch="//",
                        label=label,
                    )
                    ax.text(
                        x, window_ms * 0.8, "never", rotation=90, ha="center", va="top", fontsize=7
                    )
                    continue
                ax.bar(x, max(close["p99"], floor), width, color=colour, label=label)
                if close["never"]:
                    ax.text(
                        x,
                        max(close["p99"], floor),
                        f"{close['never']} never",
                        rotation=90,
                        ha="center",
                        va="bottom",
                        fontsize=7,
                    )
        ax.set_title(scenario)
        ax.set_xticks(range(len(levels)), [f"{level} at once" for level in levels])
        ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("cancel -> provider saw the close, p99 (ms)")
    axes[0].set_ylim(top=window_ms * 4)
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        loc="outside lower center",
        ncols=len(systems),
        fontsize=8,
    )
    fig.suptitle(
        f"wirecut {report.get('version', '')}: cancel -> provider close "
        f"(hatched: never, within {window_ms / 1000:g} s)"
    )
    fig.savefig(path, dpi=110)
