"""What a console command takes, declared once: ``Flag``, ``Option``, ``Argument``.

click is the model: a command lists its parameters, and the one declaration
gives its usage line (in ``help``, ``/api/commands`` and every usage error)
and its parser. ``Params.parse(words)`` returns the ``Args`` the command's
function gets (a mapping by ``dest``), or raises ``UsageError``
("PROBLEM; usage: USAGE").

Words. A command's line is split like a shell's (``shlex``: quotes group
words, nothing is ever run), except for a free-text argument
(``Argument(..., rest=True)``): it takes the rest of the line as typed, so
``chat what's the weather?`` sends the apostrophe; quoting applies only to
the options before it (``Params.split``). A word is an option only for a
command that declares options: ``memory add`` takes ``--`` and any other word
as part of its note.

Values only: safe to share between threads.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wirecut.console.commands._context import UsageError

__all__ = ["Args", "Argument", "Flag", "Option", "Param", "Params"]

#: What a command's function gets: each parameter's value by its ``dest``.
Args = Mapping[str, Any]

#: One word of a line, as typed (quotes and all).
_WORD = re.compile(r"\s*(\S+)")
#: One shell word: quotes may hold spaces.
_QUOTED = re.compile(r"""\s*((?:[^\s'"\\]|\\.|'[^']*'|"(?:[^"\\]|\\.)*")+)""")


def _dest(name: str) -> str:
    return name.lstrip("-").replace("-", "_").lower()


@dataclass(frozen=True)
class Flag:
    """``--name``: True when given, else False."""

    name: str

    @property
    def dest(self) -> str:
        return _dest(self.name)

    def usage(self) -> str:
        return f"[{self.name}]"


@dataclass(frozen=True)
class Option:
    """``--name VALUE``; ``convert(name, value)`` checks it (a ``ValueError`` is the problem)."""

    name: str
    metavar: str
    convert: Callable[[str, str], Any]
    default: Any = None
    #: The problem when the value is missing (after the name).
    missing: str = "needs a value"

    @property
    def dest(self) -> str:
        return _dest(self.name)

    def usage(self) -> str:
        return f"[{self.name} {self.metavar}]"


@dataclass(frozen=True)
class Argument:
    """A positional argument: one word, every word left (``many``) or the rest of the line.

    ``convert`` checks the value (a word, a list of words for ``many``, the
    text for ``rest``); a ``ValueError`` is the problem. ``choices`` are the
    words it may be (shown in the usage as ``a|b|c``). ``unless`` names a flag
    that makes it optional; ``missing`` is the problem when it is not given.
    """

    metavar: str
    dest: str = ""
    convert: Callable[[Any], Any] = lambda value: value
    many: bool = False
    rest: bool = False
    choices: tuple[str, ...] = ()
    unless: str | None = None
    missing: str = ""

    def __post_init__(self) -> None:
        if not self.dest:
            object.__setattr__(self, "dest", _dest(self.metavar))

    def usage(self) -> str:
        return "|".join(self.choices) if self.choices else self.metavar


Param = Flag | Option | Argument


class Params:
    """A command's parameters: options and flags first, then its arguments, in order."""

    def __init__(self, *params: Param) -> None:
        self.options = {p.name: p for p in params if isinstance(p, Flag | Option)}
        self.arguments = [p for p in params if isinstance(p, Argument)]
        for argument in self.arguments[:-1]:
            if argument.many or argument.rest:
                raise ValueError(f"{argument.metavar} takes what is left: it must come last")
        self._order: Sequence[Param] = params

    @property
    def takes_rest(self) -> bool:
        """True when the last argument is free text (the rest of the line as typed)."""
        return bool(self.arguments) and self.arguments[-1].rest

    def usage(self, name: str) -> str:
        """The usage line: the command's name, then every parameter in order."""
        return " ".join([name, *(param.usage() for param in self._order)])

    def split(self, text: str) -> list[str]:
        """The words of ``text`` for a command that ``takes_rest``: its options, then the text.

        The options at the start are split like a shell's; the first word that
        is not one starts the text, which is kept as typed (stripped at its ends).
        """
        words: list[str] = []
        at = 0
        while (found := _WORD.match(text, at)) is not None:
            option = self.options.get(found[1])
            if option is None:
                break
            words.append(found[1])
            at = found.end()
            if isinstance(option, Option):
                value = _QUOTED.match(text, at) or _WORD.match(text, at)
                if value is not None:
                    words.extend(_unquoted(value[1]))
                    at = value.end()
        rest = text[at:].strip()
        return [*words, rest] if rest else words

    def parse(self, words: list[str], usage: str) -> Args:
        """The ``Args`` of ``words``; ``UsageError`` ("PROBLEM; usage: USAGE") if they misfit."""

        def misfit(problem: str) -> UsageError:
            return UsageError(f"{problem}; usage: {usage}")

        args: dict[str, Any] = {}
        for declared in self.options.values():
            args[declared.dest] = False if isinstance(declared, Flag) else declared.default
        left = list(words)
        while self.options and left and left[0].startswith("--"):
            word = left.pop(0)
            option = self.options.get(word)
            if option is None:
                if self.arguments and self.arguments[0].rest:
                    left.insert(0, word)  # Free text that starts with dashes.
                    break
                raise misfit(f"unknown option {word!r}")
            if isinstance(option, Flag):
                args[option.dest] = True
                continue
            if not left:
                raise misfit(f"{word} {option.missing}")
            args[option.dest] = _checked(option.convert, misfit, word, left.pop(0))
        for argument in self.arguments:
            if argument.many or argument.rest:
                value: Any = left if argument.many else " ".join(left)
                left = []
                if argument.rest and not value:
                    value = None
            elif left:
                value = left.pop(0)
            else:
                value = None
            if value is None:
                if argument.unless is not None and args.get(_dest(argument.unless)):
                    args[argument.dest] = None
                    continue
                problem = argument.missing or f"give {argument.metavar}"
                if argument.choices:
                    problem += f": one of {', '.join(argument.choices)}"
                raise misfit(problem)
            if argument.choices and value not in argument.choices:
                noun = argument.metavar.lower()
                raise misfit(f"unknown {noun} {value!r}: one of {', '.join(argument.choices)}")
            args[argument.dest] = _checked(argument.convert, misfit, value)
        if left:
            raise misfit(f"unexpected {left[0]!r}")
        return args


def _checked(convert: Callable[..., Any], misfit: Callable[[str], UsageError], *given: Any) -> Any:
    try:
        return convert(*given)
    except ValueError as exc:
        raise misfit(str(exc)) from None


def _unquoted(word: str) -> list[str]:
    try:
        return shlex.split(word)
    except ValueError as exc:
        raise UsageError(f"cannot parse the line: {exc}") from None
