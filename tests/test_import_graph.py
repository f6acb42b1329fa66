"""The library's import graph has no circles (issue 34 §7): a module imported when the package
loads never needs, directly or through others, a module that needs it back. Counted: the
imports a module runs when it loads (its top level, ``try`` blocks included) and the ones it
makes for its types (``if TYPE_CHECKING:`` blocks: a type-only circle is a circle of design,
issue 34 §2); not counted: imports inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = {  # as pyproject.toml maps them
    "exactcall": ROOT / "exactcall",
    "exactcall.activities": ROOT / "activities",
    "exactcall.workflows": ROOT / "workflows",
    "exactcall.approvals": ROOT / "approvals",
}


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for base, folder in PACKAGES.items():
        for f in folder.rglob("*.py"):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            if base == "exactcall" and parts[0] in ("activities", "workflows", "approvals"):
                continue  # (links, where a checkout has them)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join([base, *parts])] = f
    return mods


def _imports_at_load(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = list(ast.parse(path.read_text()).body)
    while nodes:
        node = nodes.pop()
        typing_only = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        if isinstance(node, ast.Try) or typing_only:
            nodes += node.body
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            m = ".".join([*base, node.module or ""]).strip(".") if node.level else node.module
            subs = {f"{m}.{a.name}" for a in node.names} & mods.keys()
            out |= subs if len(subs) == len(node.names) else {m or "", *subs}
    return (out & mods.keys()) - {name}


def circles() -> list[list[str]]:
    mods = _modules()
    graph = {name: _imports_at_load(name, path, mods) for name, path in mods.items()}
    found: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                found.append(sorted([v, *comp]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_library_imports_no_circle() -> None:
    assert circles() == []


def test_a_circle_is_found(tmp_path: Path) -> None:
    # the finder itself: two modules that import each other at load
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("from .a import x\n")
    (tmp_path / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    # a circle closed by an import for types only (as activities._cancelling's Attempt was)
    (tmp_path / "d.py").write_text("from .e import y\n")
    (tmp_path / "e.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import z\n"
    )
    PACKAGES["exactcall.fixture"] = tmp_path
    try:
        assert ["exactcall.fixture.a", "exactcall.fixture.b"] in circles()
        assert ["exactcall.fixture.d", "exactcall.fixture.e"] in circles()
        assert not any("exactcall.fixture.c" in c for c in circles())
    finally:
        del PACKAGES["exactcall.fixture"]


# The layers (docs/layout.md): the call path and the features under it never load the CLI,
# the developer tooling, the demo or an integration; only the CLI and the tooling load them.
UPPER = ("exactcall.cli", "exactcall.dev", "exactcall.demo", "exactcall.quickstart")
OUTER = (
    *UPPER,
    "exactcall.__main__",
    "exactcall.integrations",
    "exactcall.mcp",
    "exactcall.testing",
)


def _within(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


def layer_breaks() -> list[tuple[str, str]]:
    mods = _modules()
    graph = {name: _imports_at_load(name, path, mods) for name, path in mods.items()}
    # an integration's public path (exactcall.langgraph, ...) re-exports exactcall.integrations
    public = {
        n
        for n, deps in graph.items()
        if n.count(".") == 1 and any(_within(d, ("exactcall.integrations",)) for d in deps)
    }
    outer = {n for n in graph if _within(n, OUTER) or n in public}
    return sorted(
        (name, dep) for name, deps in graph.items() if name not in outer for dep in deps & outer
    )


def test_the_call_path_and_features_load_no_cli_tooling_or_integration() -> None:
    assert layer_breaks() == []
