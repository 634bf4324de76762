"""Tools an agent can call: plain functions with JSON-schema parameters.

A tool's schema is derived from the function's type hints and docstring
(through pydantic), or declared explicitly. Arguments from the model are
checked against the schema before the function runs; a bad call becomes a
``ToolCallError`` whose message goes back to the model, never a crash.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any, get_type_hints

import jsonschema
import pydantic

from wirecut import _json

__all__ = ["MAX_OUTPUT", "Tool", "ToolCallError", "ToolRegistry", "tool", "truncate_output"]

#: What a tool hands back to the model at most, in characters.
MAX_OUTPUT = 16_000


def truncate_output(text: str) -> str:
    """``text`` cut to ``MAX_OUTPUT`` characters, with a note saying how much was cut."""
    if len(text) <= MAX_OUTPUT:
        return text
    return text[:MAX_OUTPUT] + f"\n[... {len(text) - MAX_OUTPUT} more characters cut]"


class ToolCallError(Exception):
    """The model's tool call cannot run: unknown tool, or arguments that do not fit.

    The message is written for the model, which gets it as the tool's result
    and may try again.
    """


class Tool:
    """One callable tool.

    ``parameters`` is a JSON schema for the arguments object; without it the
    schema is derived from ``fn``'s signature. Thread-safe: ``call`` keeps no
    state, so parallel tool calls may share a ``Tool``.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        doc = inspect.getdoc(fn) or ""
        self.description = description if description is not None else doc.split("\n\n")[0]
        self._model: type[pydantic.BaseModel] | None = None
        if parameters is None:
            self._model = _arguments_model(fn, self.name)
            parameters = _clean_schema(self._model.model_json_schema())
        jsonschema.Draft202012Validator.check_schema(parameters)
        self.parameters = parameters
        self._validator = jsonschema.Draft202012Validator(parameters)

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def parse(self, arguments: str) -> dict[str, Any]:
        """Check the model's raw JSON arguments; raise ``ToolCallError`` saying what is wrong."""
        try:
            # Bounded nesting: the validator below recurses into the value.
            value = _json.loads(arguments) if arguments.strip() else {}
        except _json.JSONError as exc:
            raise ToolCallError(f"arguments for {self.name!r} are not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ToolCallError(f"arguments for {self.name!r} must be a JSON object")
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "arguments"
            raise ToolCallError(f"invalid arguments for {self.name!r}: {where}: {error.message}")
        if self._model is not None:
            # Converts to the annotated Python types (a list[str], a float ...).
            try:
                model = self._model.model_validate(value)
            except pydantic.ValidationError as exc:
                raise ToolCallError(f"invalid arguments for {self.name!r}: {exc}") from None
            return {field: getattr(model, field) for field in type(model).model_fields}
        return value

    def call(self, arguments: str) -> str:
        """Run the tool on the model's raw JSON arguments; the result as text for the model."""
        result = self.fn(**self.parse(arguments))
        return result if isinstance(result, str) else json.dumps(result, default=str)

    def __repr__(self) -> str:
        return f"<Tool {self.name}>"


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
) -> Any:
    """Make a ``Tool`` of a function; usable bare (``@tool``) or with options."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, name=name, description=description, parameters=parameters)

    return wrap if fn is None else wrap(fn)


class ToolRegistry:
    """The tools of one agent, by name. Read-only once the agent runs."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            self.add(item)

    def add(self, item: Tool | Callable[..., Any]) -> Tool:
        new = item if isinstance(item, Tool) else Tool(item)
        if new.name in self._tools:
            raise ValueError(f"a tool named {new.name!r} is already registered")
        self._tools[new.name] = new
        return new

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            known = ", ".join(sorted(self._tools)) or "none"
            raise ToolCallError(f"unknown tool {name!r} (available: {known})") from None

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self._tools.values()]

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools


def _arguments_model(fn: Callable[..., Any], name: str) -> type[pydantic.BaseModel]:
    hints = get_type_hints(fn)
    descriptions = _param_docs(inspect.getdoc(fn) or "")
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args and **kwargs cannot be described to a model")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (
            annotation,
            pydantic.Field(default, description=descriptions.get(param.name)),
        )
    return pydantic.create_model(
        f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
    )


def _param_docs(doc: str) -> dict[str, str]:
    """Parameter descriptions from a docstring's ``name: text`` lines (Google style)."""
    found = {}
    for line in doc.splitlines():
        head, sep, text = line.strip().partition(":")
        if sep and head.isidentifier() and text.strip():
            found[head] = text.strip()
    return found


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's titles: noise in a prompt, and some providers reject them."""
    schema = {k: v for k, v in schema.items() if k != "title"}
    if "properties" in schema:
        schema["properties"] = {
            key: {k: v for k, v in prop.items() if k != "title"}
            for key, prop in schema["properties"].items()
        }
    return schema
