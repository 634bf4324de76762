"""Issue 37's measurements of ``wirecut proxy`` against hostile clients and upstreams, rerun.

Run: ``python bench/bench_proxy_hostile.py [--before SRC] [--out DIR]``.

Each scenario starts ``wirecut proxy`` as a process of its own (from this
tree, and with ``--before SRC`` from that ``src`` folder too, the two taking
turns) in front of the simulator or a scripted loopback upstream run by this
process, and measures what the issue quoted: a 24 MiB body of nested lists
(and 4 MiB, under the new default limit) and another client's disconnect
meanwhile; request heads of 64 MiB; 1,120 half-sent heads under a 1,024
descriptor limit; a client that stops reading; a 300 MiB answer; ``/health``
while the upstream's connects hang; ``--upstream-slots auto`` started before
the upstream; the openai SDK's retries of a timeout; an upstream that keeps
its response open after ``[DONE]``; a partial ``n=2`` answer, a deeply
nested event and a lone surrogate; a full disk; credentials in the
upstream URL and a ``/v1/%2E%2E/slots`` path. Prints one table a scenario,
a row a tree; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _procs import status_kib
from _report import Report, cell
from wirecut.loopback import FullBacklog, LoopbackExchange, LoopbackServer

BOUND = 10.0
HERE = str(Path(__file__).resolve().parent.parent / "src")
MESSAGES = [{"role": "user", "content": "tell me a long story"}]


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MESSAGES, **extra}


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


def rss_mib(pid: int) -> float:
    return status_kib(pid, "VmRSS") / 1024


def peak_mib(pid: int) -> float:
    return status_kib(pid, "VmHWM") / 1024


@dataclass
class Proxy:
    proc: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    started_s: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def records(self) -> list[dict[str, Any]]:
        path = self.data_dir / "proxy.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def record(self, bound: float = BOUND) -> dict[str, Any] | None:
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            found = self.records()
            if found:
                return found[-1]
            time.sleep(0.05)
        return None


@contextmanager
def proxy(
    tree: str,
    upstream: str,
    *args: str,
    nofile: int | None = None,
    env: dict[str, str] | None = None,
    data_dir: Path | None = None,
) -> Iterator[Proxy]:
    """``wirecut proxy`` from ``tree``, in front of ``upstream``, until the block ends."""
    port = _free_port()
    directory = data_dir or Path(tempfile.mkdtemp(prefix="hostile-"))

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    started = time.monotonic()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "wirecut", "proxy", "--port", str(port)),
            *("--upstream", upstream, "--data-dir", str(directory), *args),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": tree, **(env or {})},
        preexec_fn=limit,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the proxy from {tree} exited {proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        yield Proxy(proc, port, directory, time.monotonic() - started)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Sim:
    """``wirecut provider`` (this tree) as a process."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "wirecut", "provider", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": HERE},
        )
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip().split(": ", 1)[1].split(" ")[0]
        self.root = self.base_url.removesuffix("/v1")

    def events(self) -> list[dict[str, Any]]:
        return httpx.get(self.root + "/sim/events", timeout=BOUND).json()  # type: ignore[no-any-return]

    def requests(self) -> int:
        return len([e for e in self.events() if e["kind"] == "request_received"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def raw_post(port: int, body: bytes, headers: str = "") -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    conn.sendall(head.encode() + body)
    return conn


def status_of(conn: socket.socket) -> int | None:
    try:
        line = conn.makefile("rb").readline()
        return int(line.split()[1]) if line else None
    except (OSError, ValueError, IndexError):
        return None


def sse_chunk(content: str | None, index: int = 0, finish: str | None = None) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": "u",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
    }


# -- the scenarios: each returns one row (a dict) for one tree ---------------------------------


def body_bomb(tree: str, size: int) -> dict[str, Any]:
    """A nested-list body of ``size`` bytes while another client's stream leaves."""
    sim = Sim("--slots", "2", "--tokens-per-second", "20", "--prompt-ms", "0", "--endless")
    try:
        with proxy(tree, sim.base_url) as p:
            before = rss_mib(p.proc.pid)
            victim = raw_post(p.port, json.dumps(chat(stream=True, max_tokens=100000)).encode())
            seen = b""
            while b'"content"' not in seen:
                seen += victim.recv(65536)
            bomb = b'{"model": "m", "x": [' + b"[]," * ((size - 32) // 3) + b"[]]}"
            attacker = socket.create_connection(("127.0.0.1", p.port), timeout=60)
            attacker.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(bomb)
            )

            def send_body() -> None:
                try:
                    attacker.sendall(bomb)
                except OSError:
                    pass  # Refused before it was read.

            sender = threading.Thread(target=send_body)
            sender.start()
            sender.join(60)  # The body is in (or refused)...
            time.sleep(0.3)  # ...and a proxy that parses it where it arrived is at it now.
            left = time.monotonic()
            victim.close()
            closed_after = None
            deadline = time.monotonic() + 30
            while closed_after is None and time.monotonic() < deadline:
                for event in sim.events():
                    if event["kind"] == "peer_closed":
                        closed_after = (event["t"] - left) * 1000
                time.sleep(0.02)
            status = status_of(attacker)
            attacker.close()
            return {
                "bomb status": status,
                "other client's close reached the upstream after": cell(closed_after, "ms", 0),
                "RSS before / peak": f"{before:.0f} / {peak_mib(p.proc.pid):.0f} MiB",
            }
    finally:
        sim.stop()


def huge_heads(tree: str) -> dict[str, Any]:
    """Two connections send 64 MiB of one header; a token holder's /health meanwhile."""
    sim = Sim("--slots", "1")
    try:
        with proxy(tree, sim.base_url) as p:
            before = rss_mib(p.proc.pid)
            sent = [0, 0]

            def flood(i: int) -> None:
                try:
                    with socket.create_connection(("127.0.0.1", p.port), timeout=30) as conn:
                        conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
                        piece = b"a" * (1 << 20)
                        for _ in range(64):
                            conn.sendall(piece)
                            sent[i] += len(piece)
                except OSError:
                    pass

            threads = [threading.Thread(target=flood, args=(i,)) for i in range(2)]
            for thread in threads:
                thread.start()
            started = time.monotonic()
            answered = httpx.get(p.url + "/health", timeout=30).status_code
            health_ms = (time.monotonic() - started) * 1000
            for thread in threads:
                thread.join(60)
            return {
                "bytes of head taken": f"{sum(sent) / (1 << 20):.0f} MiB",
                "/health meanwhile": f"{answered} in {health_ms:.0f} ms",
                "RSS before / peak": f"{before:.0f} / {peak_mib(p.proc.pid):.0f} MiB",
            }
    finally:
        sim.stop()


def half_heads(tree: str) -> dict[str, Any]:
    """1,120 connections that sent half a head, the proxy at 1,024 descriptors; /health."""
    sim = Sim("--slots", "1")
    conns: list[socket.socket] = []
    try:
        with proxy(tree, sim.base_url, nofile=1024) as p:
            for _ in range(1120):
                try:
                    conn = socket.create_connection(("127.0.0.1", p.port), timeout=5)
                    conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                    conns.append(conn)
                except OSError:
                    break
            started = time.monotonic()
            try:
                answer = str(httpx.get(p.url + "/health", timeout=10).status_code)
            except httpx.HTTPError as exc:
                answer = type(exc).__name__
            took = (time.monotonic() - started) * 1000
            return {"connections opened": len(conns), "/health": f"{answer} in {took:.0f} ms"}
    finally:
        for conn in conns:
            conn.close()
        sim.stop()


def slow_reader(tree: str) -> dict[str, Any]:
    """A client that stops reading a fast stream (--request-timeout 5): memory, and its end."""
    event = b"data: " + json.dumps(sse_chunk("x" * 1000)).encode() + b"\n\n"
    frame = f"{len(event):x}\r\n".encode() + event + b"\r\n"

    def flood(ex: LoopbackExchange) -> None:
        if ex.request.method != "POST":
            ex.json({}, status=404)  # The start's probes: nothing to learn here.
            return
        ex.start_chunked()
        while True:
            try:
                ex.conn.sendall(frame * 64)
            except OSError:
                return

    with LoopbackServer(flood) as upstream:
        with proxy(tree, upstream.url + "/v1", "--request-timeout", "5") as p:
            before = rss_mib(p.proc.pid)
            conn = socket.socket()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conn.connect(("127.0.0.1", p.port))
            body = json.dumps(chat(stream=True)).encode()
            conn.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"X-Request-Id: slow\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body
            )
            time.sleep(4)  # the window: a client that reads nothing, before its timeout
            during = rss_mib(p.proc.pid)
            cancel = httpx.post(p.base_url + "/requests/slow/cancel", timeout=30).status_code
            # Past the timeout and the send bound (30 s), still reading nothing:
            # is the connection let go? Then what is buffered is read, to its end.
            time.sleep(31)
            conn.settimeout(5)
            ended = "still open after 35 s"
            try:
                while conn.recv(1 << 20):
                    pass
                ended = "closed by the proxy"
            except TimeoutError:
                pass
            except OSError:
                ended = "reset by the proxy"
            conn.close()
            return {
                "RSS growth after 4 s": f"{during - before:+.0f} MiB",
                "cancel by id at 4 s": cancel,
                "the client's connection": ended,
                "RSS peak": f"{peak_mib(p.proc.pid):.0f} MiB",
            }


def huge_answer(tree: str) -> dict[str, Any]:
    """A 300 MiB answer to a client that asked for no stream."""
    event = b"data: " + json.dumps(sse_chunk("y" * 4000)).encode() + b"\n\n"

    def flood(ex: LoopbackExchange) -> None:
        if ex.request.method != "POST":
            ex.json({}, status=404)
            return
        ex.start_chunked()
        for _ in range(300 * (1 << 20) // len(event)):
            try:
                ex.chunk(event)
            except OSError:
                return
        ex.chunk(b"data: [DONE]\n\n")
        ex.end_chunked()

    with LoopbackServer(flood) as upstream, proxy(tree, upstream.url + "/v1") as p:
        before = rss_mib(p.proc.pid)
        try:
            status = httpx.post(p.base_url + "/chat/completions", json=chat(), timeout=120)
            answer = str(status.status_code)
        except httpx.HTTPError as exc:
            answer = type(exc).__name__
        record = p.record()
        return {
            "status": answer,
            "record": None if record is None else f"{record['status']} / {record['reason']}",
            "RSS before / peak": f"{before:.0f} / {peak_mib(p.proc.pid):.0f} MiB",
        }


def health_hangs(tree: str) -> dict[str, Any]:
    """/health while every connect to the upstream hangs (a full backlog)."""
    with FullBacklog() as backlog:
        with proxy(tree, f"http://127.0.0.1:{backlog.port}/v1") as p:
            started = time.monotonic()
            httpx.get(p.url + "/health", timeout=60)
            one = (time.monotonic() - started) * 1000
            time.sleep(6)  # past the old re-probe interval (5 s)
            timings: list[float] = []
            # One client for the 20 (a client each would time its own making).
            limits = httpx.Limits(max_connections=20)
            with httpx.Client(timeout=60, limits=limits) as client:

                def ask() -> None:
                    begun = time.monotonic()
                    client.get(p.url + "/health")
                    timings.append((time.monotonic() - begun) * 1000)

                threads = [threading.Thread(target=ask) for _ in range(20)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(120)
            threads_now = len(os.listdir(f"/proc/{p.proc.pid}/task"))
            return {
                "start-up": f"{p.started_s:.1f} s",
                "first /health": f"{one:.0f} ms",
                "20 at once, slowest": f"{max(timings):.0f} ms",
                "proxy threads after": threads_now,
            }


def slots_later(tree: str) -> dict[str, Any]:
    """--upstream-slots auto while the upstream answers 503 (loading); its slots 8 s later."""
    loading = threading.Event()
    loading.set()

    def llama(ex: LoopbackExchange) -> None:
        if loading.is_set():  # llama-server while it loads its model
            ex.json({"error": {"code": 503, "message": "Loading model"}}, status=503)
        elif ex.request.path == "/slots":
            ex.json([{"id": 0, "is_processing": False}, {"id": 1, "is_processing": False}])
        else:
            ex.json({}, status=404)

    with LoopbackServer(llama) as upstream, proxy(tree, upstream.url + "/v1") as p:
        before = httpx.get(p.url + "/health", timeout=BOUND).json()["upstream"]
        loading.clear()
        time.sleep(8)  # the window: a proxy that asks again has learnt by now
        after = httpx.get(p.url + "/health", timeout=BOUND).json()["upstream"]
        return {
            "while it loads": f"{before['kind']}, slots {before['slots']}",
            "8 s after it is ready": f"{after['kind']}, slots {after['slots']}",
        }


def sdk_retries(tree: str) -> dict[str, Any]:
    """The openai SDK (its default retries) against --request-timeout 2."""
    import openai

    sim = Sim("--slots", "1", "--tokens-per-second", "50", "--prompt-ms", "0", "--endless")
    try:
        with proxy(tree, sim.base_url, "--request-timeout", "2") as p:
            client = openai.OpenAI(base_url=p.base_url, api_key="none")
            started = time.monotonic()
            try:
                client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
                outcome = "answered"
            except openai.APIStatusError as exc:
                outcome = str(exc.status_code)
            took = time.monotonic() - started
            return {
                "create() raised": outcome,
                "requests at the engine": sim.requests(),
                "took": f"{took:.1f} s",
            }
    finally:
        sim.stop()


def done_then_hold(tree: str) -> dict[str, Any]:
    """An upstream that keeps its response open after [DONE]."""

    def handler(ex: LoopbackExchange) -> None:
        ex.start_chunked()
        ex.chunk(b"data: " + json.dumps(sse_chunk("hi", finish="stop")).encode() + b"\n\n")
        ex.chunk(b"data: [DONE]\n\n")
        ex.hold(60)

    with LoopbackServer(handler) as upstream:
        with proxy(tree, upstream.url + "/v1", "--request-timeout", "5") as p:
            started = time.monotonic()
            response = httpx.post(p.base_url + "/chat/completions", json=chat(), timeout=30)
            took = time.monotonic() - started
            record = p.record()
            return {
                "status": response.status_code,
                "answered after": f"{took * 1000:.0f} ms",
                "record": None if record is None else f"{record['status']} / {record['reason']}",
            }


def bad_streams(tree: str) -> dict[str, Any]:
    """A partial n=2 answer; a deeply nested event; a lone surrogate in a request."""
    deep = "data: " + '{"choices": [{"finish_reason": "stop", "x": ' + "[" * 5000
    deep += "]" * 5000 + "}]}\n\n"

    def handler(ex: LoopbackExchange) -> None:
        body = ex.request.json()
        if body.get("n") == 2:
            ex.sse(
                [sse_chunk("a"), sse_chunk("b", index=1), sse_chunk(None, finish="stop")],
                done=False,
            )
        else:
            ex.sse([deep])

    with LoopbackServer(handler) as upstream, proxy(tree, upstream.url + "/v1") as p:
        partial = httpx.post(p.base_url + "/chat/completions", json=chat(n=2), timeout=30)
        partial_record = p.record()
        nested = httpx.post(p.base_url + "/chat/completions", json=chat(), timeout=30)
        surrogate = raw_post(
            p.port,
            json.dumps(
                {"model": "m", "messages": [{"role": "user", "content": "\ud83d"}]}
            ).encode(),
        )
        lone = status_of(surrogate)
        surrogate.close()
        return {
            "partial n=2": f"{partial.status_code}, record "
            + ("-" if partial_record is None else partial_record["status"]),
            "nested event": f"{nested.status_code} {nested.json().get('error', {}).get('type')}",
            "lone surrogate": lone,
        }


def full_disk(tree: str) -> dict[str, Any]:
    """proxy.jsonl on a full disk (/dev/full); the mode of a new proxy.jsonl."""
    sim = Sim("--slots", "1", "--tokens-per-second", "200", "--prompt-ms", "0")
    try:
        full = Path(tempfile.mkdtemp(prefix="hostile-full-"))
        (full / "proxy.jsonl").symlink_to("/dev/full")
        with proxy(tree, sim.base_url, data_dir=full) as p:
            whole = httpx.post(p.base_url + "/chat/completions", json=chat(), timeout=30)
            try:
                streamed = httpx.post(
                    p.base_url + "/chat/completions", json=chat(stream=True), timeout=30
                )
                stream = f"{streamed.status_code}, " + (
                    "whole" if streamed.text.rstrip().endswith("[DONE]") else "no [DONE]"
                )
            except httpx.HTTPError as exc:
                stream = f"broken: {type(exc).__name__}"
        fresh = Path(tempfile.mkdtemp(prefix="hostile-mode-"))
        os.umask(0o022)
        with proxy(tree, sim.base_url, data_dir=fresh) as p:
            httpx.post(p.base_url + "/chat/completions", json=chat(), timeout=30)
            p.record()
        mode = oct((fresh / "proxy.jsonl").stat().st_mode & 0o777)
        return {
            "non-stream on a full disk": whole.status_code,
            "stream on a full disk": stream,
            "proxy.jsonl mode": mode,
        }
    finally:
        sim.stop()


def secrets_and_paths(tree: str) -> dict[str, Any]:
    """Credentials in the upstream URL; GET /v1/%2E%2E/slots."""
    expected = "Basic YWxpY2U6czNjcmV0"  # alice:s3cret

    def handler(ex: LoopbackExchange) -> None:
        if ex.request.headers.get("authorization") != expected:
            ex.json({"error": {"message": "unauthorized"}}, status=401)
        elif ex.request.method == "POST":
            ex.sse([sse_chunk("ok", finish="stop")])
        else:
            ex.json({"reached": ex.request.path})

    with LoopbackServer(handler) as upstream:
        url = upstream.url.replace("://", "://alice:s3cret@") + "/v1"
        with proxy(tree, url) as p:
            health = httpx.get(p.url + "/health", timeout=BOUND).text
            models = httpx.get(p.base_url + "/models", timeout=BOUND).status_code
            done = httpx.post(p.base_url + "/chat/completions", json=chat(), timeout=30)
            before = len(upstream.requests)  # The start's probe may have asked /slots.
            conn = socket.create_connection(("127.0.0.1", p.port), timeout=BOUND)
            conn.sendall(b"GET /v1/%2E%2E/slots HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            escaped = status_of(conn)
            conn.close()
            reached = [r for r in upstream.requests[before:] if r.path == "/slots"]
            return {
                "/health shows the password": "s3cret" in health,
                "/v1/models, completion": f"{models}, {done.status_code}",
                "GET /v1/%2E%2E/slots": f"{escaped}, upstream /slots reached {len(reached)}x",
            }


SCENARIOS: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "body24": ("1. a 24 MiB body of nested lists", lambda t: body_bomb(t, 24 << 20)),
    "body4": ("1. a body of nested lists just under 4 MiB", lambda t: body_bomb(t, (4 << 20) - 64)),
    "heads": ("3. two 64 MiB request heads", huge_heads),
    "idle": ("2. 1,120 half-sent heads at 1,024 descriptors", half_heads),
    "slow": ("4. a client that stops reading", slow_reader),
    "answer": ("5. a 300 MiB non-stream answer", huge_answer),
    "health": ("6. /health while the upstream's connects hang", health_hangs),
    "slots": ("7. --upstream-slots auto while the upstream loads its model", slots_later),
    "retries": ("8. the openai SDK and a timeout", sdk_retries),
    "done": ("9. [DONE], then the response kept open", done_then_hold),
    "streams": ("10. a partial n=2, a nested event, a lone surrogate", bad_streams),
    "disk": ("11. records on a full disk, and their mode", full_disk),
    "secrets": ("12. credentials in the upstream URL, a dot-segment path", secrets_and_paths),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", metavar="SRC", help="a wirecut src folder to run beside")
    parser.add_argument("--only", help="comma-separated scenario names: " + ", ".join(SCENARIOS))
    parser.add_argument("--out", type=Path, help="write the tables as DIR/bench_proxy_hostile.json")
    args = parser.parse_args()
    trees = {"this tree": HERE}
    if args.before:
        trees = {"before": args.before, "this tree": HERE}
    chosen = args.only.split(",") if args.only else list(SCENARIOS)
    report = Report(
        "bench_proxy_hostile",
        "wirecut proxy against hostile clients and upstreams",
        "Each scenario against each tree, the proxy a process of its own "
        "(bench/bench_proxy_hostile.py).",
    )
    for name in chosen:
        title, run = SCENARIOS[name]
        rows: list[tuple[str, dict[str, Any]]] = []
        for side, tree in trees.items():
            print(f"{name}: {side}", file=sys.stderr)
            try:
                rows.append((side, run(tree)))
            except Exception as exc:  # A scenario that broke is a row too.
                rows.append((side, {"failed": f"{type(exc).__name__}: {exc}"[:120]}))
        columns = list(dict.fromkeys(key for _, row in rows for key in row))
        made = report.table(title, ["tree", *columns])
        for side, row in rows:
            made.add(side, *(cell(row.get(key, "-")) for key in columns))
        print(f"\n### {title}\n\n{made.markdown()}", flush=True)
    if args.out:
        print(f"wrote {report.write(args.out)}", file=sys.stderr)


if __name__ == "__main__":
    main()
