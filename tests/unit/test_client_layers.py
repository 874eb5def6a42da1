"""The SDK's modules import each other in layers, never in a circle: every import statement is
counted (top level, inside functions, under TYPE_CHECKING), so a cycle cannot hide behind a
late import. The context (`_context`) is what tables, watches, sessions and bulk access use of a
client; none of them imports `tablekeeper.client`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

CLIENT = Path(__file__).resolve().parents[2] / "client" / "tablekeeper"
PACKAGE = "tablekeeper"
LAYERED = ("client", "table", "watch", "session", "bulk")


def _module_name(path: Path) -> str:
    parts = path.relative_to(CLIENT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports (`from tablekeeper.x import y` counts as
    `tablekeeper.x.y` when that is a module, else `tablekeeper.x`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in CLIENT.rglob("*.py")}
    modules = set(paths)
    return {
        # The package's __init__ re-exports the public API; a submodule that imported it back
        # would be a cycle through it, so it stays a node like any other.
        name: _imports(path, modules) - {name}
        for name, path in paths.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_the_layered_modules_and_their_imports() -> None:
    graph = _graph()
    for name in LAYERED:
        assert f"{PACKAGE}.{name}" in graph
    assert f"{PACKAGE}.table" in graph[f"{PACKAGE}.client"]
    assert f"{PACKAGE}._context" in graph[f"{PACKAGE}.table"]


def test_no_import_cycle_in_the_sdk() -> None:
    assert _cycles(_graph()) == []


def test_tables_watches_sessions_and_bulk_do_not_import_the_client() -> None:
    graph = _graph()
    for name in LAYERED[1:]:
        assert f"{PACKAGE}.client" not in graph[f"{PACKAGE}.{name}"], name


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
