"""What the benchmark scripts share: ``wirecut`` subcommands as processes, and percentiles."""

from __future__ import annotations

import datetime
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["Process", "cpu_ms", "machine", "percentile", "status_kib"]


def machine() -> dict[str, Any]:
    """What a benchmark's numbers were measured on: the host, its CPUs, Python, commit, date."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "system": platform.system(),
        "commit": commit,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "load_average": round(os.getloadavg()[0], 2),
    }


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/PID/status`` (``VmRSS``, ``VmHWM``), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(f"no {field} in /proc/{pid}/status")


def cpu_ms(pid: int) -> tuple[float, float]:
    """CPU time ``pid`` has run, in ms: all its threads, and its main thread alone.

    From ``/proc/PID/task/*/schedstat`` (nanoseconds on a CPU, per thread):
    the ticks of ``/proc/PID/stat`` are 10 ms, as long as a burst. A thread
    that ended is no longer listed, so read it around work whose threads stay
    (a worker pool).
    """
    total = main = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ran = int((task / "schedstat").read_text().split()[0]) / 1e6
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        total += ran
        if task.name == str(pid):
            main = ran
    return total, main


class Process:
    """A ``wirecut`` subcommand whose first stdout line names its URL."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "wirecut", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"wirecut {' '.join(args)} exited: {self.proc.wait()}")
        self.url = line.strip().split(": ", 1)[1].split(" ")[0]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            assert self.proc.stdout is not None
            self.proc.stdout.close()
