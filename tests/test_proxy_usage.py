"""Usage that can be billed: a cut request is counted in the upstream's tokens, and says how.

When the upstream reported usage, the record carries it; when the request
was cut first, the proxy counts what it relayed, after the cut, with the
upstream's own tokenizer (llama.cpp's ``/tokenize`` and ``/apply-template``)
and marks it ``estimated``; chunks only as a last resort, and then said so.
Against the simulator (whose multi-byte text comes in fewer chunks than
tokens, as llama.cpp's does), and against a scripted llama.cpp whose
stream, tokenizer and chat template a test fixes exactly.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from _loopback import Exchange, LoopbackServer
from test_proxy import BOUND, MESSAGES, Setup, chat, post, prompt_tokens, proxied
from test_proxy_bounds import chunk
from wirecut.proxy import ProxyConfig, ProxyServer
from wirecut.simulator import EventKind, SimConfig
from wirecut.simulator._tokenizer import apply_template, count_tokens

#: Multi-byte text: each character one token per UTF-8 byte, one chunk each.
PIECES = ["Once", " upon", " 日本", "語", " a", " time"]


def _read_events(conn: socket.socket, count: int, marker: bytes) -> bytes:
    """Read the response until ``count`` events holding ``marker`` came."""
    seen = b""
    while seen.count(marker) < count:
        data = conn.recv(65536)
        assert data, f"the response ended early: {seen[-300:]!r}"
        seen += data
    return seen


def llama(pieces: list[str], *, tokenizer: str = "answers") -> Any:
    """A scripted llama.cpp: it streams ``pieces`` and then nothing; its tokenizer ``tokenizer``s.

    Its counts are the simulator's rule (``count_tokens``, ``apply_template``),
    which the test uses as the oracle.
    """

    def handle(ex: Exchange) -> None:
        path = ex.request.path
        if path == "/slots":
            ex.json([{"id": 0, "is_processing": False}])
        elif path == "/tokenize":
            if tokenizer == "fails":
                ex.json({"error": {"message": "no"}}, status=500)
            elif tokenizer == "hangs":
                ex.hold(BOUND)
            else:
                ex.json({"tokens": [1] * count_tokens(ex.request.json()["content"])})
        elif path == "/apply-template":
            ex.json({"prompt": apply_template(ex.request.json()["messages"])})
        elif path == "/v1/chat/completions":
            ex.sse([chunk(piece) for piece in pieces], stall=True)
        else:
            ex.json({"error": {"message": "not here"}}, status=404)

    return handle


@contextlib.contextmanager
def behind(handler: Any, tmp_path: Path) -> Iterator[tuple[LoopbackServer, Setup]]:
    with LoopbackServer(handler) as upstream:
        config = ProxyConfig(upstream=upstream.url + "/v1", port=0, data_dir=tmp_path)
        with ProxyServer(config) as proxy:
            yield upstream, Setup(None, proxy, tmp_path)  # type: ignore[arg-type]


def cut_after_every_piece(setup: Setup, pieces: list[str]) -> dict[str, Any]:
    """Stream a chat, read every piece the upstream sends, leave; the record."""
    conn = post(setup.proxy.port, chat(stream=True), headers={"X-Request-Id": "cut"})
    _read_events(conn, len(pieces), b'"content"')
    conn.close()
    return setup.record("cut")


def test_a_cut_stream_is_counted_in_the_upstreams_tokens_not_in_chunks(tmp_path: Path) -> None:
    with behind(llama(PIECES), tmp_path) as (_, setup):
        record = cut_after_every_piece(setup, PIECES)
    usage = record["usage"]
    assert (record["status"], record["reason"]) == ("cancelled", "disconnect")
    assert usage["completion_tokens"] == count_tokens("".join(PIECES))
    assert usage["completion_tokens"] > len(PIECES)  # More tokens than chunks.
    assert usage["counted_by"] == "tokenizer"
    assert usage["prompt_tokens"] == count_tokens(apply_template(MESSAGES))
    assert usage["prompt_counted_by"] == "tokenizer"
    assert usage["estimated"] is True


@pytest.mark.parametrize("tokenizer", ["fails", "hangs"])
def test_a_tokenizer_that_fails_or_never_answers_falls_back_to_chunks_and_says_so(
    tmp_path: Path, tokenizer: str
) -> None:
    with behind(llama(PIECES, tokenizer=tokenizer), tmp_path) as (_, setup):
        record = cut_after_every_piece(setup, PIECES)
    assert record["usage"] == {
        "prompt_tokens": None,
        "completion_tokens": len(PIECES),
        "requests": 1,
        "estimated": True,
        "counted_by": "chunks",
        "prompt_counted_by": None,
    }


def test_an_upstream_without_a_tokenizer_is_counted_in_chunks_and_never_asked(
    tmp_path: Path,
) -> None:
    def plain(ex: Exchange) -> None:
        if ex.request.path == "/v1/chat/completions":
            ex.sse([chunk(piece) for piece in PIECES], stall=True)
        else:
            ex.json({"error": {"message": "not here"}}, status=404)

    with behind(plain, tmp_path) as (upstream, setup):
        record = cut_after_every_piece(setup, PIECES)
        asked = [r.path for r in upstream.requests if r.method == "POST"]
    assert asked == ["/v1/chat/completions"]  # No /tokenize: it is no llama.cpp.
    assert record["usage"]["counted_by"] == "chunks"
    assert record["usage"]["completion_tokens"] == len(PIECES)
    assert record["usage"]["prompt_tokens"] is None


def test_the_simulators_multibyte_stream_cut_is_counted_between_what_the_client_read_and_decoded(
    tmp_path: Path,
) -> None:
    sim = SimConfig(slots=1, tokens_per_second=100, prompt_ms=5, endless=True, multibyte_every=2)
    with proxied(tmp_path, sim) as setup:
        conn = post(setup.proxy.port, chat(stream=True), headers={"X-Request-Id": "cut"})
        raw = _read_events(conn, 12, b'"content"')
        conn.close()
        (upstream,) = setup.sim.requests()
        setup.sim.wait_for_event(EventKind.REQUEST_FINISHED, upstream.id, timeout=BOUND)
        record = setup.record("cut")
        decoded = next(s for s in setup.sim.requests() if s.id == upstream.id).n_decoded
        reported = prompt_tokens(setup.sim, chat())
    texts = [
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in raw.decode("utf-8", "replace").split("\n")
        if line.startswith("data: {")
    ]
    read = count_tokens("".join(texts))
    assert read > len([t for t in texts if t])  # Multi-byte: more tokens than chunks.
    assert read <= record["usage"]["completion_tokens"] <= decoded
    assert record["usage"]["counted_by"] == "tokenizer"
    assert record["usage"]["prompt_tokens"] == reported


def test_a_messages_stream_cut_keeps_the_prompt_count_the_upstream_sent_first(
    tmp_path: Path,
) -> None:
    sim = SimConfig(slots=1, tokens_per_second=100, prompt_ms=5, endless=True)
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 100_000, "stream": True}
    with proxied(tmp_path, sim) as setup:
        conn = post(setup.proxy.port, body, path="/v1/messages", headers={"X-Request-Id": "m"})
        _read_events(conn, 3, b"content_block_delta")
        conn.close()
        record = setup.record("m")
        reported = prompt_tokens(setup.sim, {k: body[k] for k in ("model", "messages")}, "messages")
    assert record["usage"]["prompt_tokens"] == reported
    assert record["usage"]["prompt_counted_by"] == "upstream"  # message_start said it.
    assert record["usage"]["counted_by"] == "tokenizer"
    assert record["usage"]["estimated"] is True


def test_a_success_is_counted_with_no_reason_and_its_tokens_by_upstream(tmp_path: Path) -> None:
    with proxied(tmp_path) as setup:
        httpx.post(setup.proxy.base_url + "/chat/completions", json=chat(), timeout=BOUND)
        record = setup.record()
        metrics = httpx.get(setup.proxy.url + "/metrics", timeout=BOUND).text
    upstream = setup.sim.base_url
    assert 'wirecut_proxy_requests_total{reason="",status="ok"} 1.0' in metrics
    assert 'reason="none"' not in metrics
    completion = record["usage"]["completion_tokens"]
    assert (
        f'wirecut_proxy_tokens_total{{counted_by="upstream",key="",kind="completion",'
        f'upstream="{upstream}"}} {completion:.1f}'
    ) in metrics


def test_a_request_sent_after_its_client_left_is_counted_per_upstream_and_key() -> None:
    from wirecut.proxy._metrics import ProxyMetrics
    from wirecut.proxy._record import ProxyRecord, RecordReason
    from wirecut.proxy._usage import BilledUsage
    from wirecut.record import Status

    metrics = ProxyMetrics(lambda: (0, 0, None))

    def record(reason: RecordReason | None) -> ProxyRecord:
        usage = BilledUsage(None, 0, 1, None, None)
        status = Status.OK if reason is None else reason.status
        return ProxyRecord(
            "r", "m", True, status, reason, usage, 0.0, None, (), key="k", upstream="u"
        )

    metrics.observe(record(RecordReason.DISCONNECT), started_after_cut=True)
    metrics.observe(record(RecordReason.DISCONNECT), started_after_cut=False)
    metrics.observe(record(RecordReason.TIMEOUT), started_after_cut=True)  # Its client stayed.
    text = metrics.render().decode()
    assert 'wirecut_proxy_started_after_client_left_total{key="k",upstream="u"} 1.0' in text
