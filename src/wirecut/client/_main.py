"""``run_terminal``: the whole client, from an address to an exit code.

Three modes on one connection: the REPL (stdin is a terminal), one line
(``-c``), or the lines of a piped stdin run one after another. One asyncio
loop runs everything; SIGINT is handled on that loop
(``loop.add_signal_handler``), so Ctrl+C becomes a ``cancel`` frame while
output keeps streaming. Every failure of the connection is one line on
stderr and exit 1, never a traceback.

Call from the main thread (it owns SIGINT), outside any running event loop.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from wirecut.client._address import Address
from wirecut.client._link import Link, LinkError
from wirecut.client._render import Renderer, visible
from wirecut.client._repl import PromptAsker, interactive
from wirecut.client._session import (
    EXIT_CANCELLED,
    EXIT_ERROR,
    EXIT_OK,
    TerminalSession,
    exit_code,
)

__all__ = ["run_terminal"]

_PREFIX = "wirecut console: "


def run_terminal(address: Address, *, line: str | None, history_path: Path) -> int:
    """Connect to ``address`` and run ``line`` (``-c``), piped lines, or the REPL.

    Returns the exit code: for one line its status's (0 ok, 1 error, 124
    timeout, 130 cancelled); for piped lines the last line's; for the REPL 0;
    1 when the connection failed or broke.
    """
    out = Console(file=sys.stdout, highlight=False, soft_wrap=True, emoji=False)
    err = Console(file=sys.stderr, highlight=False, soft_wrap=True, emoji=False)
    stdin_tty = sys.stdin.isatty()
    piped: list[str] | None = None
    if line is None and not stdin_tty:
        # Read before connecting: a script's lines are all there, and no
        # thread then sits blocked on stdin when the loop wants to stop.
        piped = [text.strip() for text in sys.stdin.read().splitlines()]
    try:
        return asyncio.run(_main(address, line, piped, history_path, out, err, stdin_tty))
    except LinkError as exc:
        # The line may quote the server (a close reason, a handshake's answer):
        # shown like every other server text, never obeyed, and kept one line.
        err.print(_PREFIX + visible(str(exc)).replace("\n", "\u240a"), markup=False)
        return EXIT_ERROR
    except (KeyboardInterrupt, asyncio.CancelledError):
        # Ctrl+C before the connection was up: nothing ran, nothing to cancel.
        return EXIT_CANCELLED


async def _main(
    address: Address,
    line: str | None,
    piped: list[str] | None,
    history_path: Path,
    out: Console,
    err: Console,
    stdin_tty: bool,
) -> int:
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None

    def stop() -> None:
        main.cancel()

    on_interrupt: list[Callable[[], None]] = [stop]  # until a mode sets its own

    def set_interrupt(handler: Callable[[], None]) -> None:
        on_interrupt[0] = handler

    loop.add_signal_handler(signal.SIGINT, lambda: on_interrupt[0]())
    link: Link | None = None
    try:
        link = await Link.open(address)
        if line is None and piped is None:
            return await interactive(
                link, Renderer(out, err, verbose=True), history_path, set_interrupt
            )
        term = TerminalSession(
            link,
            Renderer(out, err, verbose=False),
            PromptAsker() if stdin_tty else None,
        )

        def on_sigint() -> None:
            if not term.interrupt():
                stop()

        set_interrupt(on_sigint)
        code = EXIT_OK
        for text in [line] if line is not None else (piped or []):
            if not text:
                continue
            code = exit_code((await term.run(text)).status)
            if term.abandoned:
                break
        return code
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        if link is not None:
            await link.aclose()
