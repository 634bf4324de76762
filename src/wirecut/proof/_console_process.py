"""``wirecut bench``'s console in a process of its own, as ``wirecut serve`` runs.

The bench's client times each ``complete`` frame as it reads it. A console
in the bench's own process shares the GIL with that client: at 64 commands
cancelled at once, the client's reads of the output and ``complete`` frames
took turns with the console's unwinding workers, and its stamps came late
(the curator's cancel -> ``complete`` p50 was 29.3 ms there against 25.8 ms
with the console in a process of its own, 12 batches of 64 each). A
deployed console's client is a browser or a terminal in another process.

``ConsoleProcess`` runs ``python -m wirecut.proof._console_process`` (the
console's commands plus ``bench-nonstream``, ``bench_commands``) against a
provider, and reads its WebSocket URL from its first line. The child answers
two requests on its stdin, a line of JSON each: ``trace`` starts tracing its
Python heap, and ``memory`` gives its resident memory and the heap traced
since (and ends the tracing). Closing its stdin stops it, its commands
cancelled. It leads a session of its own
(``_child``): a bench killed with SIGKILL takes it with it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wirecut.proof._child import Child, ChildService

if TYPE_CHECKING:
    from wirecut.console.commands import CommandSet

__all__ = ["MAX_TOKENS", "NON_STREAM_COMMAND", "ConsoleProcess", "bench_commands", "serve_console"]

#: max_tokens of every request: the simulator is endless, so a reply never ends by itself.
MAX_TOKENS = 4096
NON_STREAM_COMMAND = "bench-nonstream"
#: Seconds the console may take to listen.
START_TIMEOUT = 30.0
#: Seconds it may take to answer a request on its stdin.
ANSWER_TIMEOUT = 30.0


def bench_commands() -> CommandSet:
    """The console's commands plus ``bench-nonstream TEXT``.

    The console has no command that makes a real non-streaming request; this
    one does, through the console's own (scoped) ``ChatClient``, so the
    non-stream scenario runs through the real console like the others.
    """
    from wirecut.console.commands import Args, Argument, CommandContext, builtin_commands, command

    @command(
        NON_STREAM_COMMAND,
        Argument("TEXT", rest=True),
        summary="one real non-streaming chat request (wirecut bench)",
    )
    def bench_nonstream(ctx: CommandContext, args: Args) -> None:
        result = ctx.services.chat_client().chat(
            [{"role": "user", "content": args["text"]}],
            stream=False,
            wire_stream=False,
            model=ctx.services.model,
            max_tokens=ctx.services.max_tokens,
        )
        ctx.add_usage(result.usage)
        ctx.scope.check()  # A cut: the runner reports the cancel.
        ctx.write(result.text + "\n")

    return builtin_commands().plus(bench_nonstream)


@contextlib.contextmanager
def serve_console(provider_url: str, data_dir: Path, workers: int) -> Iterator[str]:
    """A console server in this process over ``provider_url``; its WebSocket URL."""
    from wirecut.console import ConsoleConfig, ConsoleServer
    from wirecut.launch import Provider

    config = ConsoleConfig(
        port=0, data_dir=data_dir, workers=workers, command_timeout=300, max_tokens=MAX_TOKENS
    )
    provider = Provider(provider_url, None, "simulator (bench)")
    with ConsoleServer(config, provider, commands=bench_commands()) as console:
        yield console.ws_url


class ConsoleProcess(ChildService):
    """The bench's console (``serve_console``) in a child process; a context manager."""

    def __init__(self, provider_url: str, data_dir: Path, workers: int) -> None:
        self.argv = [
            sys.executable,
            "-m",
            "wirecut.proof._console_process",
            provider_url,
            str(data_dir),
            str(workers),
        ]
        super().__init__(Child("console", stdin=True))
        self._url: str | None = None

    def start(self, timeout: float = START_TIMEOUT) -> ConsoleProcess:
        """Run the console; return once it listens. RuntimeError (with its stderr) if not."""
        self._url = self._child.start(self.argv, str.strip, timeout)
        return self

    @property
    def ws_url(self) -> str:
        """``ws://127.0.0.1:PORT/api/console?token=…``."""
        if self._url is None:
            raise RuntimeError("the console process is not running (call start())")
        return self._url

    def trace(self) -> None:
        """Start tracing the console's Python heap (``tracemalloc``) until the next ``memory()``."""
        self._child.ask("trace", ANSWER_TIMEOUT)

    def memory(self) -> tuple[int | None, int | None]:
        """The console's resident bytes (None where unknown) and traced heap (None if not tracing).

        Collects garbage first; stops the tracing that ``trace`` started.
        """
        answer = json.loads(self._child.ask("memory", ANSWER_TIMEOUT))
        return answer["resident"], answer["heap"]

    def stop(self) -> None:
        """Close its stdin (its commands are cancelled), then SIGTERM, then SIGKILL. Idempotent."""
        self._url = None
        self._child.stop()


def resident_bytes() -> int | None:
    """This process's resident memory (``/proc/self/statm``), or None where there is none."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _answer(request: str) -> dict[str, Any]:
    if request == "trace":
        tracemalloc.start()
        return {"tracing": True}
    if request == "memory":
        heap = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None
        tracemalloc.stop()
        gc.collect()
        return {"resident": resident_bytes(), "heap": heap}
    return {"error": f"unknown request {request!r}"}


def main(argv: list[str]) -> int:
    """``python -m wirecut.proof._console_process PROVIDER_URL DATA_DIR WORKERS``."""
    provider_url, data_dir, workers = argv
    with serve_console(provider_url, Path(data_dir), int(workers)) as url:
        print(url, flush=True)
        for line in sys.stdin:
            print(json.dumps(_answer(line.strip())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
