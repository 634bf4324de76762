"""The layering of docs/architecture.md, read from the source: dependencies point down only.

Every ``import`` and ``from ... import`` of every module under ``src/wirecut``
counts, also those inside functions and ``if TYPE_CHECKING:`` blocks (a lazy
import is still a dependency). The rules:

- the library core (``scope``, ``http``, ``provider``, ``adapters``, ``aio``,
  ``record``, ``mcp``) imports no app;
- ``scope`` imports only the standard library (and itself);
- only the CLI and the console itself import ``wirecut.console.server``:
  other apps run a console through ``wirecut.console``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import wirecut

SRC = Path(wirecut.__file__).resolve().parent

CORE = {"scope", "http", "provider", "adapters", "aio", "record", "mcp"}
APPS = {
    "agent",
    "cli",
    "client",
    "console",
    "launch",
    "local",
    "loopback",
    "memory",
    "proof",
    "proxy",
    "serving",
    "simulator",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for every module ``path`` imports (``from a import b``: a and a.b)."""
    return _imports_in(path.read_text(), _module_name(path), package=path.name == "__init__.py")


def _imports_in(source: str, module: str, *, package: bool) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the module's package
                here = module.split(".") if package else module.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, base] if base else here)
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def _layer(module: str) -> str | None:
    """The wirecut package ``module`` belongs to (``wirecut.console.server`` -> ``console``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "wirecut" else None


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _violations(allowed: dict[str, set[str]]) -> list[str]:
    found = []
    for path in _sources():
        here = _layer(_module_name(path))
        if here is None:
            continue
        for line, module in _imports(path):
            there = _layer(module)
            if there is not None and there in allowed.get(here, set()):
                found.append(f"{path.relative_to(SRC.parent)}:{line} imports {module}")
    return found


def test_the_sources_are_found() -> None:
    layers = {_layer(_module_name(path)) for path in _sources()}
    assert CORE - {"mcp"} <= layers  # mcp may not be there yet
    assert APPS <= layers


def test_the_core_imports_no_app() -> None:
    assert _violations({layer: APPS for layer in CORE}) == []


def test_scope_imports_only_the_standard_library() -> None:
    found = []
    for path in sorted((SRC / "scope").rglob("*.py")):
        for line, module in _imports(path):
            top = module.split(".")[0]
            if top == "wirecut" and _layer(module) == "scope":
                continue
            if top in sys.stdlib_module_names or top == "__future__":
                continue
            found.append(f"{path.relative_to(SRC.parent)}:{line} imports {module}")
    assert found == []


def test_only_the_cli_and_the_console_import_the_console_server() -> None:
    found = []
    for path in _sources():
        here = _module_name(path)
        if here.startswith(("wirecut.cli", "wirecut.console")):
            continue
        for line, module in _imports(path):
            if module == "wirecut.console.server" or module.startswith("wirecut.console.server."):
                found.append(f"{path.relative_to(SRC.parent)}:{line} imports {module}")
    assert found == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from wirecut.console import server\n", "wirecut.console.server"),
        ("import wirecut.proxy._app\n", "wirecut.proxy._app"),
        ("def f():\n    from wirecut.cli import main\n", "wirecut.cli.main"),
        ("from ..console import server\n", "wirecut.console.server"),
    ],
)
def test_an_import_in_any_form_is_seen(source: str, expected: str) -> None:
    seen = {module for _, module in _imports_in(source, "wirecut.scope._x", package=False)}
    assert expected in seen
