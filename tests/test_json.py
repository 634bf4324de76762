"""``wirecut._json.loads``: JSON from outside, with its nesting bounded."""

from __future__ import annotations

import pytest

from wirecut._json import MAX_DEPTH, JSONError, loads


def nested(depth: int) -> str:
    return "[" * (depth - 1) + '{"a": 1}' + "]" * (depth - 1)


@pytest.mark.parametrize("kind", [str, bytes])
def test_a_value_nested_to_the_bound_parses_and_one_level_more_is_refused(kind: type) -> None:
    def text(depth: int) -> str | bytes:
        return nested(depth) if kind is str else nested(depth).encode()

    assert loads(text(MAX_DEPTH)) is not None
    with pytest.raises(JSONError, match=f"nested more than {MAX_DEPTH} levels deep"):
        loads(text(MAX_DEPTH + 1))
    with pytest.raises(JSONError, match="nested more than 3 levels deep"):
        loads(text(4), max_depth=3)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = '{"text": "' + "[{" * 500 + '", "list": [[1], {"b": [2]}]}'
    assert loads(text)["list"] == [[1], {"b": [2]}]


def test_what_is_not_json_is_one_json_error() -> None:
    for text in ("", "{", "[1,]", b"\xff"):
        with pytest.raises(JSONError, match="not JSON"):
            loads(text)
    with pytest.raises(JSONError, match="levels deep"):
        loads("[" * 100_000 + "]" * 100_000)  # past the interpreter's recursion limit
