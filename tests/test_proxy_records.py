"""``proxy.jsonl``: written off the request path, never failing one, rotated by size, mode 0600.

Through a real proxy and simulator: the requests' answers are read by real
clients; the records from the files on disk. A full disk is the kernel's own
(``/dev/full`` answers every write with ENOSPC).
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import pytest

from test_proxy import BOUND, Setup, chat, proxied


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def all_records(data_dir: Path) -> list[dict[str, object]]:
    found = []
    for name in ("proxy.jsonl.3", "proxy.jsonl.2", "proxy.jsonl.1", "proxy.jsonl"):
        found += lines(data_dir / name)
    return found


def wait_records(setup: Setup, count: int) -> list[dict[str, object]]:
    setup.wait_health(lambda _: len(all_records(setup.data_dir)) >= count)
    return all_records(setup.data_dir)


def test_records_are_mode_0600_and_rotated_by_size(tmp_path: Path) -> None:
    # A record is about 450 bytes: one to a file of 700.
    with proxied(tmp_path, records_max_bytes=700, records_backups=2) as setup:
        ids = []
        for n in range(7):
            name = f"r{n}"
            response = httpx.post(
                setup.proxy.base_url + "/chat/completions",
                json=chat(),
                headers={"X-Request-Id": name},
                timeout=BOUND,
            )
            assert response.status_code == 200
            ids.append(name)
            # One at a time, so that each record is written before the next.
            setup.wait_health(lambda _, name=name: name in {r["id"] for r in all_records(tmp_path)})
    files = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("proxy.jsonl"))
    assert files == ["proxy.jsonl", "proxy.jsonl.1", "proxy.jsonl.2"]  # Two backups kept.
    for name in files:
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
        assert (tmp_path / name).stat().st_size <= 700
    kept = [r["id"] for r in all_records(tmp_path)]
    assert kept == ids[-3:]  # The newest, in order; the oldest rotated away.


def test_an_existing_world_readable_record_file_is_made_0600(tmp_path: Path) -> None:
    path = tmp_path / "proxy.jsonl"
    path.write_text("")
    path.chmod(0o644)
    with proxied(tmp_path) as setup:
        httpx.post(setup.proxy.base_url + "/chat/completions", json=chat(), timeout=BOUND)
        wait_records(setup, 1)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_fails_no_request_and_loses_no_record(tmp_path: Path) -> None:
    path = tmp_path / "proxy.jsonl"
    path.symlink_to("/dev/full")  # Every write fails with ENOSPC.
    with proxied(tmp_path) as setup:
        whole = httpx.post(setup.proxy.base_url + "/chat/completions", json=chat(), timeout=BOUND)
        streamed = httpx.post(
            setup.proxy.base_url + "/chat/completions", json=chat(stream=True), timeout=BOUND
        )
        metrics_url = setup.proxy.url + "/metrics"
        setup.wait_health(
            lambda _: "wirecut_proxy_records_pending 2.0" in httpx.get(metrics_url).text
        )
        # The disk has room again.
        path.unlink()
        third = httpx.post(setup.proxy.base_url + "/chat/completions", json=chat(), timeout=BOUND)
        records = wait_records(setup, 3)
        metrics = httpx.get(metrics_url, timeout=BOUND).text
    assert whole.status_code == streamed.status_code == third.status_code == 200
    assert whole.json()["choices"][0]["message"]["content"]
    assert streamed.text.endswith("data: [DONE]\n\n")  # The stream ran to its end.
    assert [(r["status"], r["stream"]) for r in records] == [
        ("ok", False),
        ("ok", True),
        ("ok", False),
    ]
    assert "wirecut_proxy_records_dropped_total 0.0" in metrics
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
