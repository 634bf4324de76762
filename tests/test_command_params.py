"""A console command's parameters, declared once: its usage line, its parser, its free text."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from wirecut.console.commands import (
    Argument,
    CommandSet,
    Flag,
    Option,
    Params,
    UsageError,
    builtin_commands,
)


def _days(option: str, value: str) -> timedelta:
    return timedelta(days=float(value))


RUN = Params(
    Flag("--yes"),
    Option("--stale-days", "DAYS", _days, timedelta(days=30), missing="needs a number of days"),
)
CHAT = Params(Flag("--new"), Argument("TEXT", rest=True, unless="--new"))


def test_the_usage_line_is_made_from_the_declaration() -> None:
    assert RUN.usage("curator run") == "curator run [--yes] [--stale-days DAYS]"
    assert CHAT.usage("chat") == "chat [--new] TEXT"
    assert Params(Argument("P", choices=("a", "b"))).usage("probe") == "probe a|b"
    usages = {command.name: command.usage for command in builtin_commands()}
    assert usages["curator run"] == (
        "curator run [--consolidate] [--dry-run] [--yes] [--summarize] [--stale-days DAYS]"
        " [--archive-days DAYS]"
    )
    assert usages["memory add"] == "memory add TITLE -- BODY"
    assert usages["sleep"] == "sleep SECONDS"


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ([], {"yes": False, "stale_days": timedelta(days=30)}),
        (["--stale-days", "2", "--yes"], {"yes": True, "stale_days": timedelta(days=2)}),
    ],
)
def test_options_parse_into_args_with_their_defaults(
    words: list[str], expected: dict[str, Any]
) -> None:
    assert dict(RUN.parse(words, "u")) == expected


@pytest.mark.parametrize(
    ("words", "problem"),
    [
        (["--force"], "unknown option '--force'; usage: u"),
        (["--stale-days"], "--stale-days needs a number of days; usage: u"),
        (["--stale-days", "x"], "could not convert string to float: 'x'; usage: u"),
        (["extra"], "unexpected 'extra'; usage: u"),
    ],
)
def test_a_misfit_is_one_usage_error_naming_the_problem(words: list[str], problem: str) -> None:
    with pytest.raises(UsageError) as caught:
        RUN.parse(words, "u")
    assert str(caught.value) == problem


def test_free_text_takes_the_rest_of_the_line_as_typed() -> None:
    assert CHAT.split("  what's the weather?  ") == ["what's the weather?"]
    assert CHAT.split(' --new say "hi"  twice') == ["--new", 'say "hi"  twice']
    assert CHAT.split("--new") == ["--new"]
    assert CHAT.split("--newer things") == ["--newer things"]  # not an option of chat
    assert dict(CHAT.parse(["--new"], "u")) == {"new": True, "text": None}
    assert dict(CHAT.parse(["--new", "it's  here"], "u")) == {"new": True, "text": "it's  here"}
    with pytest.raises(UsageError, match=r"^give TEXT; usage: u$"):
        CHAT.parse([], "u")


def test_a_line_with_an_apostrophe_parses_for_free_text_only() -> None:
    commands = builtin_commands()
    found, words = commands.parse("chat what's the weather?")
    assert found.name == "chat"
    assert words == ["what's the weather?"]
    found, words = commands.parse("memory add 'a b' -- c")  # quotes still group words here
    assert words == ["a b", "--", "c"]
    with pytest.raises(UsageError, match="cannot parse the line"):
        commands.parse('memory show "unclosed')
    with pytest.raises(UsageError, match="cannot parse the line"):
        commands.parse("nope what's")  # an unknown command's line splits as before


def test_an_option_value_in_front_of_free_text_is_unquoted() -> None:
    params = Params(Option("--as", "NAME", lambda name, value: value), Argument("TEXT", rest=True))
    assert params.split("--as 'J. Doe' hello  there") == ["--as", "J. Doe", "hello  there"]
    assert dict(params.parse(params.split("--as 'J. Doe' hello  there"), "u")) == {
        "as": "J. Doe",
        "text": "hello  there",
    }


def test_only_the_last_argument_may_take_what_is_left() -> None:
    with pytest.raises(ValueError, match="must come last"):
        Params(Argument("TEXT", rest=True), Argument("MORE"))
    assert len(CommandSet([])) == 0
