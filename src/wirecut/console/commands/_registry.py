"""Commands as values: ``Command``, ``CommandSet`` and the line parser (``shlex``, no shell).

``@command(name, usage, summary)`` turns ``fn(ctx, args) -> None`` into a
``Command`` value; nothing is registered anywhere. A runner is given the
``CommandSet`` it accepts (``builtin_commands()`` for the console's own, plus
any a host or a test adds with ``plus``), as click groups are given their
commands. A multi-word command (``memory add``) is named by its full name and
found by the longest match. ``CommandSet.parse(line)`` splits the line with
``shlex`` and returns the command and its remaining words, or raises
``UsageError`` naming what was wrong. Nothing here ever runs a shell.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from wirecut.console.commands._context import CommandContext, UsageError

__all__ = ["Command", "CommandFn", "CommandSet", "command"]

CommandFn = Callable[[CommandContext, list[str]], None]

#: The most words a command's name has ("curator run" has two).
MAX_NAME_WORDS = 3


@dataclass(frozen=True)
class Command:
    """A console command: its full name, usage line, one-line summary and function.

    Calling it calls the function, so a command is tested like one.
    """

    name: str
    usage: str
    summary: str
    fn: CommandFn

    def __call__(self, ctx: CommandContext, args: list[str]) -> None:
        self.fn(ctx, args)


def command(name: str, *, usage: str, summary: str) -> Callable[[CommandFn], Command]:
    """Make ``fn`` the console command ``name`` (words separated by one space)."""
    words = name.split(" ")
    if not name or "" in words or len(words) > MAX_NAME_WORDS:
        raise ValueError(f"a command name is 1 to {MAX_NAME_WORDS} words, not {name!r}")

    def make(fn: CommandFn) -> Command:
        return Command(name, usage, summary, fn)

    return make


class CommandSet:
    """The commands a runner accepts, by name. Immutable: ``plus`` makes a new set.

    Safe to share between threads.
    """

    __slots__ = ("_by_name",)

    def __init__(self, commands: Iterable[Command] = ()) -> None:
        by_name: dict[str, Command] = {}
        for found in commands:
            if found.name in by_name:
                raise ValueError(f"the console command {found.name!r} is in the set twice")
            by_name[found.name] = found
        self._by_name = by_name

    def plus(self, *commands: Command) -> CommandSet:
        """This set with ``commands`` added (a name already here is a ValueError)."""
        return CommandSet([*self._by_name.values(), *commands])

    def __iter__(self) -> Iterator[Command]:
        """Every command, sorted by name."""
        return iter(sorted(self._by_name.values(), key=lambda c: c.name))

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Command:
        return self._by_name[name]

    def parse(self, line: str) -> tuple[Command, list[str]]:
        """Split ``line`` into words and find its command (longest name first)."""
        try:
            words = shlex.split(line)
        except ValueError as exc:  # an unclosed quote, a trailing backslash
            raise UsageError(f"cannot parse the line: {exc}") from None
        if not words:
            raise UsageError("empty line: type `help` for the commands")
        for n in range(min(len(words), MAX_NAME_WORDS), 0, -1):
            found = self._by_name.get(" ".join(words[:n]))
            if found is not None:
                return found, words[n:]
        group = [c.usage for c in self if c.name.split(" ")[0] == words[0]]
        if group:
            raise UsageError(f"unknown {words[0]} command; usage: " + " | ".join(group))
        raise UsageError(f"unknown command {words[0]!r}: type `help` for the commands")
