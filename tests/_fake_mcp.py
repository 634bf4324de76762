"""A stdio MCP server that misbehaves on purpose: ``python _fake_mcp.py MODE``.

Stdlib only, and no code shared with the client it tests. It speaks the
handshake-era protocol line by line, and breaks it as ``MODE`` says:

- ``garbage``: writes a line that is not JSON-RPC, then waits;
- ``exit``: says "fatal: no config" on stderr and exits with code 3;
- ``mute``: reads and never answers;
- ``no-list``: finishes the handshake, never answers tools/list;
- ``huge``: answers tools/call with a 1 MB text;
- ``answers-anyway``: answers a tools/call once its notifications/cancelled came;
- ``stays``: ignores SIGTERM and the end of its stdin (only SIGKILL ends it);
- ``good``: one tool, ``echo``, that answers at once.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Any

MODE = sys.argv[1]
TOOL = {"name": "echo", "description": "Echo.", "inputSchema": {"type": "object"}}


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(request: dict[str, Any], result: dict[str, Any]) -> None:
    send({"jsonrpc": "2.0", "id": request["id"], "result": result})


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}], "isError": False}


def main() -> None:
    if MODE == "garbage":
        print("hello, I am not an MCP server", flush=True)
    if MODE == "exit":
        print("fatal: no config", file=sys.stderr, flush=True)
        sys.exit(3)
    if MODE == "stays":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    waiting: dict[str, dict[str, Any]] = {}
    for line in sys.stdin:
        if MODE in ("garbage", "mute"):
            continue
        message = json.loads(line)
        method = message.get("method")
        if "id" not in message:  # A notification.
            if method == "notifications/cancelled" and MODE == "answers-anyway":
                request = waiting.pop(str(message["params"]["requestId"]), None)
                if request is not None:
                    answer(request, text("done anyway"))
            continue
        if method == "initialize":
            answer(
                message,
                {
                    "protocolVersion": message["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": f"fake-{MODE}", "version": "0"},
                },
            )
        elif method == "tools/list":
            if MODE != "no-list":
                answer(message, {"tools": [TOOL]})
        elif method == "tools/call":
            if MODE == "huge":
                answer(message, text("x" * (1 << 20)))
            elif MODE == "answers-anyway":
                waiting[str(message["id"])] = message
                print(f"holding call {message['id']}", file=sys.stderr, flush=True)
            else:
                answer(message, text(json.dumps(message["params"].get("arguments"))))
        else:
            send(
                {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "error": {"code": -32601, "message": "Method not found"},
                }
            )
    if MODE == "stays":
        threading.Event().wait()  # Its stdin ended; it stays anyway.


if __name__ == "__main__":
    main()
