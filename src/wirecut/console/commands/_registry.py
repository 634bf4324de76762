"""The command registry and the line parser: ``shlex`` words, never a shell.

``@command(name, usage, summary)`` registers ``fn(ctx, args) -> None``; a
multi-word command (``memory add``) is registered under its full name and
found by the longest match. ``parse(line)`` splits the line with ``shlex``
and returns the command and its remaining words, or raises ``UsageError``
naming what was wrong. Nothing here ever runs a shell.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass

from wirecut.console.commands._context import CommandContext, UsageError

__all__ = ["Command", "CommandFn", "command", "commands", "parse"]

CommandFn = Callable[[CommandContext, list[str]], None]


@dataclass(frozen=True)
class Command:
    """A registered command: its full name, usage line, one-line summary and function."""

    name: str
    usage: str
    summary: str
    fn: CommandFn


_registry: dict[str, Command] = {}


def command(name: str, *, usage: str, summary: str) -> Callable[[CommandFn], CommandFn]:
    """Register ``fn`` as the console command ``name`` (words separated by one space)."""

    def decorate(fn: CommandFn) -> CommandFn:
        if name in _registry:
            raise ValueError(f"the console command {name!r} is registered twice")
        _registry[name] = Command(name, usage, summary, fn)
        return fn

    return decorate


def commands() -> list[Command]:
    """Every registered command, sorted by name."""
    _load_builtins()
    return sorted(_registry.values(), key=lambda c: c.name)


def parse(line: str) -> tuple[Command, list[str]]:
    """Split ``line`` into words and find its command (longest name first)."""
    _load_builtins()
    try:
        words = shlex.split(line)
    except ValueError as exc:  # an unclosed quote, a trailing backslash
        raise UsageError(f"cannot parse the line: {exc}") from None
    if not words:
        raise UsageError("empty line: type `help` for the commands")
    for n in range(min(len(words), 3), 0, -1):
        found = _registry.get(" ".join(words[:n]))
        if found is not None:
            return found, words[n:]
    group = [c.usage for c in _registry.values() if c.name.split(" ")[0] == words[0]]
    if group:
        raise UsageError(f"unknown {words[0]} command; usage: " + " | ".join(sorted(group)))
    raise UsageError(f"unknown command {words[0]!r}: type `help` for the commands")


def _load_builtins() -> None:
    # The built-in commands register themselves on import.
    import wirecut.console.commands._builtins  # noqa: F401
