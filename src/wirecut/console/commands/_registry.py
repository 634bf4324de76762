"""Commands as values: ``Command``, ``CommandSet`` and the line parser (``shlex``, no shell).

``@command(name, *params, summary=...)`` turns ``fn(ctx, args) -> None`` into
a ``Command`` value whose parameters (``_params``: flags, options, arguments)
give its usage line and parse its words into ``args``; nothing is
registered anywhere. A runner is given the ``CommandSet`` it accepts
(``builtin_commands()`` for the console's own, plus any a host or a test adds
with ``plus``), as click groups are given their commands. A multi-word
command (``memory add``) is named by its full name and found by the longest
match. ``CommandSet.parse(line)`` splits the line with ``shlex`` (a
command's free text excepted: it is kept as typed) and returns the command
and its remaining words, or raises ``UsageError`` naming what was wrong.
Nothing here ever runs a shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from wirecut.console.commands._context import CommandContext, UsageError
from wirecut.console.commands._params import Args, Param, Params

__all__ = ["Command", "CommandFn", "CommandSet", "command"]

CommandFn = Callable[[CommandContext, Args], None]

#: The most words a command's name has ("curator run" has two).
MAX_NAME_WORDS = 3


@dataclass(frozen=True)
class Command:
    """A console command: its full name, one-line summary, parameters and function.

    Calling it with the words after its name parses them (a ``UsageError``
    if they misfit) and calls the function with the ``Args``, so a command
    is tested like one.
    """

    name: str
    summary: str
    fn: CommandFn
    params: Params = field(default_factory=Params)

    @property
    def usage(self) -> str:
        """The usage line, from the parameters (``curator run [--yes] ...``)."""
        return self.params.usage(self.name)

    def usage_error(self, problem: str) -> UsageError:
        """``UsageError("PROBLEM; usage: USAGE")``, for a problem the parameters cannot see."""
        return UsageError(f"{problem}; usage: {self.usage}")

    def __call__(self, ctx: CommandContext, words: list[str]) -> None:
        self.fn(ctx, self.params.parse(words, self.usage))


def command(name: str, *params: Param, summary: str) -> Callable[[CommandFn], Command]:
    """Make ``fn`` the console command ``name`` (words separated by one space) taking ``params``."""
    words = name.split(" ")
    if not name or "" in words or len(words) > MAX_NAME_WORDS:
        raise ValueError(f"a command name is 1 to {MAX_NAME_WORDS} words, not {name!r}")
    declared = Params(*params)

    def make(fn: CommandFn) -> Command:
        return Command(name, summary, fn, declared)

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
        """Split ``line`` into words and find its command (longest name first).

        A command whose last argument is free text gets its options, then
        the rest of the line as typed, as its words (``Params.split``).
        """
        free = self._free_text(line)
        if free is not None:
            return free
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

    def _free_text(self, line: str) -> tuple[Command, list[str]] | None:
        """The command and words of ``line`` if its longest name is a free-text command's."""
        names = _NAME_WORDS.match(line)
        words = [] if names is None else names[0].split()
        for n in range(min(len(words), MAX_NAME_WORDS), 0, -1):
            found = self._by_name.get(" ".join(words[:n]))
            if found is None:
                continue
            if not found.params.takes_rest:
                return None
            after = re.match(rf"\s*(?:\S+\s+){{{n - 1}}}\S+", line)
            assert after is not None  # the name's words are there
            return found, found.params.split(line[after.end() :])
        return None


#: The words a command's name may be made of, at the start of a line.
_NAME_WORDS = re.compile(rf"\s*(?:\S+(?:\s+|$)){{1,{MAX_NAME_WORDS}}}")
