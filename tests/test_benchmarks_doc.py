"""``scripts/benchmarks.py``: docs/benchmarks.md is what the JSON reports render to, and no more.

Each test works on a folder of its own: fixture reports written by the
benchmarks' own ``Report`` (bench/_report.py) and a ``bench.json`` in
``wirecut bench``'s format, rendered by the script as a user runs it (a
subprocess, ``--reports``/``--target`` pointing at the copy). No benchmark
runs here.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "benchmarks.py"
MACHINE = {
    "cpus": 2,
    "cpu_model": "Test CPU",
    "python": "3.11.7",
    "system": "Linux",
    "commit": "abc1234",
    "date": "2026-01-02",
    "load_average": 0.5,
}
SCOPE_SECTION = """\
## The scope layer

A fixture: the per-turn cost and the cut.

*2 CPUs (Test CPU), Python 3.11.7, commit abc1234, 2026-01-02, load average 0.5 at the start; \
`python bench/bench_scope.py --trials 3 --out docs/bench`*

**Per turn**

| measure | value |
|---|---|
| bind + register + unregister | 1.25 us |
| cancel -> recv returned p99 | never |

Three trials.
"""


README = "# wirecut\n\n## Measured\n\n<!-- headline -->\n\n## Documentation\n"


def _report_class() -> Any:
    # bench/ is not a package: its modules import each other by bare name.
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module("_report").Report
    finally:
        sys.path.remove(str(ROOT / "bench"))


def _write_report(folder: Path, name: str, title: str, value: float | None) -> None:
    report = _report_class()(
        name,
        title,
        "A fixture: the per-turn cost and the cut.",
        command=f"python bench/{name}.py --trials 3 --out docs/bench",
        machine=MACHINE,
    )
    table = report.table("Per turn", ["measure", "value"], note="Three trials.")
    table.add("bind + register + unregister", f"{1.25:.2f} us")
    table.add("cancel -> recv returned p99", value)
    report.data = {"raw": [value]}
    report.write(folder)


def _bench_json(folder: Path) -> None:
    row = {
        "system": "wirecut",
        "scenario": "stream",
        "concurrency": 64,
        "trials": 128,
        "cancel_to_complete_ms": {"p50": 12.25, "p99": 13.93},
        "cancel_to_provider_close_ms": {"p50": 2.19, "p99": 5.55, "never": 0},
        "slot_seconds_after_cancel": 3.03,
        "leaked": 0,
    }
    naive = {
        **row,
        "system": "naive",
        "trials": 64,
        "cancel_to_provider_close_ms": {"p50": None, "p99": None, "never": 64},
        "leaked": 64,
    }
    data = {
        "version": "0.1.0",
        "machine": {"cpus": 2, "python": "3.11.7", "platform": "Linux", "date": "2026-01-03"},
        "command": "wirecut bench --out docs/bench",
        "rows": [{**row, "concurrency": 1, "trials": 20}, row, naive],
        "console": {
            "sleep0_commands_per_second": 9799.0,
            "memory_per_command_kib": None,
            "python_heap_per_command_kib": 17.1,
            "workers": 64,
        },
        "settings": {
            "window_s": 1.0,
            "simulator": {"slots": 64, "tokens_per_second": 20, "prompt_ms": 50, "endless": True},
            "max_tokens": 4096,
        },
        "seconds": 72.8,
    }
    (folder / "bench.json").write_text(json.dumps(data))


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    """A docs folder: ``bench/`` with three reports, bench.json and its chart."""
    reports = tmp_path / "docs" / "bench"
    reports.mkdir(parents=True)
    _write_report(reports, "bench_zzz", "A report ORDER does not name", 3.5)
    _write_report(reports, "bench_scope", "The scope layer", None)
    _write_report(reports, "bench_aio", "Cancelling from asyncio", 0.75)
    _bench_json(reports)
    (reports / "bench.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "README.md").write_text(README)
    return tmp_path / "docs"


def _run(docs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--reports",
            str(docs / "bench"),
            "--target",
            str(docs / "benchmarks.md"),
            "--readme",
            str(docs.parent / "README.md"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_render_writes_each_report_as_its_section_exactly(docs: Path) -> None:
    run = _run(docs)
    assert run.returncode == 0, run.stderr
    page = (docs / "benchmarks.md").read_text()
    assert SCOPE_SECTION in page
    assert page.endswith("\n")
    assert not page.endswith("\n\n")


def test_render_orders_sections_by_order_then_by_name(docs: Path) -> None:
    assert _run(docs).returncode == 0
    page = (docs / "benchmarks.md").read_text()
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    assert headings == [
        "## wirecut bench: cancel against what hosts do today",
        "## Cancelling from asyncio",
        "## The scope layer",
        "## A report ORDER does not name",
    ]
    index = page.split("\n## ")[0]
    assert index.index("(#cancelling-from-asyncio)") < index.index("(#the-scope-layer)")


def test_render_is_the_same_page_from_the_same_reports(docs: Path, tmp_path: Path) -> None:
    assert _run(docs).returncode == 0
    first = (docs / "benchmarks.md").read_text()
    # A copy made in another order, rendered again: not a byte differs.
    other = tmp_path / "other"
    (other / "bench").mkdir(parents=True)
    for path in sorted((docs / "bench").iterdir(), reverse=True):
        shutil.copy(path, other / "bench" / path.name)
    assert _run(other).returncode == 0
    assert (other / "benchmarks.md").read_text() == first
    assert _run(docs).returncode == 0
    assert (docs / "benchmarks.md").read_text() == first


def test_wirecut_bench_json_renders_as_a_section_with_its_chart(docs: Path) -> None:
    assert _run(docs).returncode == 0
    page = (docs / "benchmarks.md").read_text()
    section = page.split("## wirecut bench: cancel against what hosts do today\n")[1]
    section = section.split("\n## ")[0]
    assert "*2 CPUs, Python 3.11.7, commit unknown, 2026-01-03; " in section
    assert "`wirecut bench --out docs/bench`*" in section
    assert "![wirecut bench: cancel against what hosts do today](bench/bench.png)" in section
    assert (
        "| stream | 64 | wirecut | 128 | 12.25 / 13.93 ms | 2.19 / 5.55 ms | 0 | 3.030 | 0 |"
        in section
    )
    assert "| stream | 64 | naive | 64 | 12.25 / 13.93 ms | never | 64 | 3.030 | 64 |" in section
    assert "| 9799.0 | unknown | 17.1 KiB | 64 |" in section


def test_the_readme_headline_is_wirecut_benchs_rows_at_the_largest_concurrency(
    docs: Path,
) -> None:
    assert _run(docs).returncode == 0
    readme = (docs.parent / "README.md").read_text()
    assert readme == (
        "# wirecut\n\n## Measured\n\n<!-- headline -->\n"
        "`wirecut bench`, 64 commands cancelled at one instant (2 CPUs, Python 3.11.7, "
        "commit unknown, 2026-01-03; the rest in [docs/benchmarks.md]"
        "(docs/benchmarks.md#wirecut-bench-cancel-against-what-hosts-do-today)):\n\n"
        "| scenario | system | trials | cancel -> complete p50 / p99 | close never seen "
        "| leaked |\n|---|---|---|---|---|---|\n"
        "| stream | wirecut | 128 | 12.25 / 13.93 ms | 0 | 0 |\n"
        "| stream | naive | 64 | 12.25 / 13.93 ms | 64 | 64 |\n\n"
        "<!-- /headline -->\n\n## Documentation\n"
    )
    assert _run(docs).returncode == 0  # Rendered again in place, not appended.
    assert (docs.parent / "README.md").read_text() == readme
    assert _run(docs, "--check").returncode == 0


def test_check_fails_on_a_headline_edited_by_hand(docs: Path) -> None:
    assert _run(docs).returncode == 0
    readme = docs.parent / "README.md"
    readme.write_text(readme.read_text().replace("| 128 |", "| 129 |"))
    run = _run(docs, "--check")
    assert run.returncode == 1
    assert "README.md is not what scripts/benchmarks.py renders" in run.stderr


def test_wirecut_bench_without_its_chart_links_none(docs: Path) -> None:
    (docs / "bench" / "bench.png").unlink()
    assert _run(docs).returncode == 0
    assert "bench.png" not in (docs / "benchmarks.md").read_text()


def test_check_passes_on_the_page_it_rendered(docs: Path) -> None:
    assert _run(docs).returncode == 0
    run = _run(docs, "--check")
    assert run.returncode == 0, run.stderr


def test_check_fails_when_a_report_changed_since_the_page(docs: Path) -> None:
    assert _run(docs).returncode == 0
    page = (docs / "benchmarks.md").read_text()
    _write_report(docs / "bench", "bench_aio", "Cancelling from asyncio", 0.8)
    run = _run(docs, "--check")
    assert run.returncode == 1
    assert "is not what scripts/benchmarks.py renders" in run.stderr
    assert (docs / "benchmarks.md").read_text() == page  # --check writes nothing


def test_check_fails_on_a_page_edited_by_hand(docs: Path) -> None:
    assert _run(docs).returncode == 0
    target = docs / "benchmarks.md"
    target.write_text(target.read_text().replace("1.25 us", "1.00 us"))
    assert _run(docs, "--check").returncode == 1


def test_check_fails_when_the_page_is_missing(docs: Path) -> None:
    assert _run(docs, "--check").returncode == 1


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("broken.json", "{not json", "not readable JSON"),
        ("broken.json", '{"rows": 3}', "neither a benchmark's report"),
        (
            "broken.json",
            '{"name": "x", "title": "X", "about": "", "command": "", "machine": {},'
            ' "tables": [{"title": "t"}]}',
            "'columns' is missing",
        ),
        ("bench.json", '{"version": "0", "machine": {}, "rows": [{"system": "x"}]}', "missing"),
    ],
)
def test_a_file_that_is_not_a_report_is_named_and_nothing_is_written(
    docs: Path, name: str, content: str, says: str
) -> None:
    assert _run(docs).returncode == 0
    page = (docs / "benchmarks.md").read_text()
    (docs / "bench" / name).write_text(content)
    run = _run(docs)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert run.stderr.count("\n") == 1
    assert name in run.stderr
    assert says in run.stderr
    assert (docs / "benchmarks.md").read_text() == page
