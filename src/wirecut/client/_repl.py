"""The interactive prompt: line editing, history, completion, y/N questions (prompt_toolkit).

History lives in the data directory (``console_history``, created 0600:
lines may hold notes' text). Tab completes command names: those of
docs/protocol.md's table, and any the server's ``help`` lists once it was
run. At the prompt, Ctrl+C clears a line being typed; at an empty prompt the
first says how to leave and a second one leaves, as does Ctrl+D.

While a command runs the REPL keeps reading the terminal itself
(``CommandKeys``: raw mode, the same input prompt_toolkit uses), so Ctrl+C is
a key it sees at once, never a byte that falls between two terminal modes.
A Ctrl+C typed in the same breath as the Enter, or during the up to one
second that prompt_toolkit then waits for the terminal's answer to its cursor
position request (a terminal that never answers: it reads keys meanwhile and
keeps them as typeahead, so they used to wait for the *next* prompt), or in
the instant the terminal was back in cooked mode (a SIGINT then) is held by
the session until the command's id is known, and then cancels it. Other
keys typed while a command runs are kept for the next prompt, as a shell
keeps typeahead.

Event loop only: the prompt runs on the loop that owns the link
(``prompt_async``); SIGINT is handled by the caller's loop handler, never by
prompt_toolkit's (``handle_sigint=False``), so one handler decides what
Ctrl+C means while a command runs.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
from prompt_toolkit.completion import Completer, DynamicCompleter, NestedCompleter
from prompt_toolkit.formatted_text import FormattedText
from prompt_toolkit.history import FileHistory
from prompt_toolkit.input import Input, create_input
from prompt_toolkit.input.typeahead import get_typeahead, store_typeahead
from prompt_toolkit.key_binding import KeyBindings, KeyPress, KeyPressEvent
from prompt_toolkit.keys import Keys

from wirecut.client._link import Link, LinkError
from wirecut.client._render import Renderer
from wirecut.client._session import EXIT_CANCELLED, TerminalSession

__all__ = ["HISTORY_FILE", "CommandKeys", "CommandNames", "PromptAsker", "interactive"]

#: The history file's name in the data directory.
HISTORY_FILE = "console_history"

# The commands of docs/protocol.md's table, with their sub-words and options.
_KNOWN: dict[str, Any] = {
    "help": None,
    "chat": {"--new": None},
    "memory": {"add": None, "list": None, "show": None},
    "curator": {
        "status": None,
        "run": {
            "--consolidate",
            "--dry-run",
            "--yes",
            "--summarize",
            "--stale-days",
            "--archive-days",
        },
    },
    "jobs": None,
    "sleep": None,
    "probe": {
        "connect",
        "ttfb",
        "stream",
        "subprocess",
        "sleep",
        "python-loop",
        "nested-thread",
        "child-agent",
    },
}
_WORD = re.compile(r"[a-z][a-z0-9-]*")


class CommandNames:
    """The command names Tab completes; learns new ones from the server's ``help``."""

    def __init__(self) -> None:
        self.tree: dict[str, Any] = {
            name: (dict(sub) if isinstance(sub, dict) else set(sub) if sub else None)
            for name, sub in _KNOWN.items()
        }
        self._pending = ""
        self._completer: Completer = NestedCompleter.from_nested_dict(self.tree)

    def completer(self) -> Completer:
        return self._completer

    def learn(self, line: str, data: str) -> None:
        """Read the output of a ``help`` command (each line: usage, two spaces, summary)."""
        if line.strip() != "help":
            return
        self._pending += data
        *complete, self._pending = self._pending.split("\n")
        changed = False
        for text in complete:
            usage = text.split("  ", 1)[0]
            words = []
            for word in usage.split():
                if not _WORD.fullmatch(word):
                    break
                words.append(word)
            changed |= self._add(words)
        if changed:
            self._completer = NestedCompleter.from_nested_dict(self.tree)

    def _add(self, words: list[str]) -> bool:
        if not words or words[0] in ("provider",):
            return False
        head, *rest = words
        known = self.tree.get(head)
        if head not in self.tree:
            self.tree[head] = {rest[0]: None} if rest else None
            return True
        if rest:
            if known is None:
                self.tree[head] = {rest[0]: None}
                return True
            if rest[0] not in known:
                if isinstance(known, set):
                    known.add(rest[0])
                else:
                    known[rest[0]] = None
                return True
        return False


class CommandKeys:
    """Reads the terminal while a command runs; Ctrl+C goes to ``on_interrupt`` at once.

    Event loop only. ``watching`` puts the terminal in raw mode (as the
    prompt does, so no key is read under a different mode) and attaches to
    ``input``; what prompt_toolkit kept as typeahead after the Enter is read
    first. A y/N question asked meanwhile attaches over it and gives the
    terminal back when it ends (prompt_toolkit stacks attachments per file
    descriptor). Keys other than Ctrl+C are handed to the next prompt as
    typeahead.
    """

    def __init__(self, input: Input) -> None:
        self.input = input

    @contextlib.contextmanager
    def watching(self, on_interrupt: Callable[[], None]) -> Iterator[None]:
        kept: list[KeyPress] = []

        def take(keys: list[KeyPress]) -> None:
            for key in keys:
                if key.key == Keys.ControlC:
                    on_interrupt()
                else:
                    kept.append(key)

        take(get_typeahead(self.input))
        try:
            with self.input.raw_mode(), self.input.attach(lambda: take(self.input.read_keys())):
                try:
                    yield
                finally:
                    take(self.input.flush_keys())
        finally:
            store_typeahead(self.input, kept)


class PromptAsker:
    """Asks ``confirm_required`` questions with a y/N prompt. Event loop only."""

    def __init__(self, input: Input | None = None) -> None:
        self._session: PromptSession[str] = PromptSession(input=input)

    @property
    def asking(self) -> bool:
        return self._session.app.is_running

    async def ask(self, message: str) -> bool:
        """``message [y/N]``: True only for y or yes with no Ctrl+C typed after it."""
        question = FormattedText([("bold", message.rstrip()), ("", " [y/N] ")])
        try:
            answer = await self._session.prompt_async(question, handle_sigint=False)
        except (KeyboardInterrupt, EOFError):
            return False
        # A Ctrl+C typed right behind the answer's Enter (kept as typeahead)
        # still means no: declining is what cancels the command.
        after = get_typeahead(self._session.input)
        store_typeahead(self._session.input, [k for k in after if k.key != Keys.ControlC])
        if any(key.key == Keys.ControlC for key in after):
            return False
        return answer.strip().lower() in ("y", "yes")

    def abort(self) -> None:
        app = self._session.app
        if app.is_running and app.future is not None and not app.future.done():
            app.exit(result="")


def _key_bindings() -> KeyBindings:
    bindings = KeyBindings()

    @bindings.add("c-c")
    def _interrupt(event: KeyPressEvent) -> None:
        buffer = event.app.current_buffer
        if buffer.text:
            buffer.reset()  # Ctrl+C on a half-typed line drops it, as in a shell.
        else:
            event.app.exit(exception=KeyboardInterrupt(), style="class:aborting")

    return bindings


def _private_history(path: Path) -> FileHistory:
    path.touch(mode=0o600, exist_ok=True)
    return FileHistory(str(path))


async def interactive(
    link: Link,
    renderer: Renderer,
    history_path: Path,
    set_interrupt: Callable[[Callable[[], None]], None],
) -> int:
    """The REPL on ``link`` until Ctrl+D or two Ctrl+C at an empty prompt; returns 0.

    Returns 130 when the user left a command without waiting for its report
    (a third Ctrl+C).
    ``set_interrupt`` installs what the caller's SIGINT handler calls.
    Raises ``LinkError`` when the connection is lost (at the prompt or while
    a command runs).
    """
    names = CommandNames()
    terminal = create_input()
    keys = CommandKeys(terminal)
    term = TerminalSession(link, renderer, PromptAsker(terminal), on_output=names.learn)
    session: PromptSession[str] = PromptSession(
        input=terminal,
        history=_private_history(history_path),
        completer=DynamicCompleter(names.completer),
        complete_while_typing=False,
        auto_suggest=AutoSuggestFromHistory(),
        key_bindings=_key_bindings(),
    )

    def exit_prompt(exception: BaseException) -> None:
        app = session.app
        if app.is_running and app.future is not None and not app.future.done():
            app.exit(exception=exception)

    def on_interrupt() -> None:
        # A Ctrl+C after the Enter and before ``run`` has the id: held for it.
        if not term.interrupt():
            term.hold_interrupt()

    def on_sigint() -> None:
        # At the prompt Ctrl+C is a key; a SIGINT from elsewhere acts like it.
        # Between the Enter and the command's key watch the terminal is in
        # cooked mode for an instant, and a Ctrl+C then is this SIGINT.
        if session.app.is_running:
            exit_prompt(KeyboardInterrupt())
        else:
            on_interrupt()

    set_interrupt(on_sigint)
    link.on_lost = exit_prompt
    renderer.banner(link.address.display, link.version)
    leaving = False
    while True:
        term.drop_held()  # a Ctrl+C that came with an empty line belongs to no command
        try:
            line = await session.prompt_async(link.prompt, handle_sigint=False)
        except KeyboardInterrupt:
            if leaving:
                return 0
            leaving = True
            renderer.note("(Ctrl+C again or Ctrl+D to leave)")
            continue
        except EOFError:
            return 0
        leaving = False
        if link.lost is not None:
            raise link.lost
        if not line.strip():
            continue
        with keys.watching(on_interrupt):
            await term.run(line)
        if term.abandoned:
            return EXIT_CANCELLED
        if link.lost is not None:
            raise LinkError(str(link.lost))
