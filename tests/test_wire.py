"""The wire contract: every name a running workflow depends on lives in ``exactcall._wire``,
which imports nothing of exactcall's; the activity and workflow sides never import each
other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from exactcall import _wire
from tests.conftest import ROOT

PACKAGES = ["exactcall", "activities", "workflows", "approvals"]
WIRE_LITERAL = re.compile(r"^(exactcall[.:\-]|Exactcall[A-Z])")
NOT_WIRE = {
    # names outside any workflow or history: an import path, observability names
    ("exactcall/_crash.py", "CRASH_PLUGIN"),
    ("exactcall/_tracing.py", "TRACER_NAME"),
    ("exactcall/_tracing.py", "SPAN_PREFIX"),
}


def modules() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def imported(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            out.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_wire_module_imports_nothing_of_exactcall() -> None:
    mods = imported(ROOT / "exactcall" / "_wire.py")
    assert not {m for m in mods if m.startswith(("exactcall", "."))}, mods


def test_activities_and_workflows_do_not_import_each_other() -> None:
    for p in sorted((ROOT / "activities").glob("*.py")):
        assert not {m for m in imported(p) if m.startswith("exactcall.workflows")}, p.name
    for p in sorted((ROOT / "workflows").glob("*.py")):
        assert not {m for m in imported(p) if m.startswith("exactcall.activities")}, p.name
    model = imported(ROOT / "exactcall" / "_model.py")
    assert not {m for m in model if "approvals" in m}, model


def test_no_wire_name_is_defined_outside_the_wire_module() -> None:
    found = []
    for p in modules():
        rel = str(p.relative_to(ROOT))
        if rel == "exactcall/_wire.py" or "/demo/" in rel or "/quickstart/" in rel:
            continue
        for node in ast.parse(p.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and WIRE_LITERAL.match(node.value.value)
            ):
                for t in node.targets:
                    if isinstance(t, ast.Name) and (rel, t.id) not in NOT_WIRE:
                        found.append(f"{rel}: {t.id} = {node.value.value!r}")
    assert found == []


def test_each_wire_name_is_unique_and_the_two_state_queries_are_apart() -> None:
    values = {n: getattr(_wire, n) for n in _wire.__all__ if isinstance(getattr(_wire, n), str)}
    # a memo key may share a signal's name (it is another namespace); nothing else repeats
    dupes = {v for v in values.values() if list(values.values()).count(v) > 1}
    assert dupes <= {_wire.CANCELLED_SIGNAL}, dupes
    assert _wire.RECORD_STATE_QUERY != _wire.RECONCILE_STATE_QUERY
    assert sorted(_wire.__all__) == _wire.__all__


ADAPTERS = ["_openai_agents.py", "_pydantic_ai.py", "_langgraph.py"]


def test_the_adapters_import_only_public_names() -> None:
    # exactcall's public API, the shared exactcall.adapters, and wire names from the contract
    import exactcall
    import exactcall.adapters

    for name in ADAPTERS:
        for node in ast.walk(ast.parse((ROOT / "exactcall" / "integrations" / name).read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = "." * node.level + (node.module or "")
            if node.level == 0 and not module.startswith("exactcall"):
                continue  # the framework's own modules, the standard library
            names = {a.name for a in node.names}
            if module in (".", "exactcall"):
                assert names <= set(exactcall.__all__), (name, names - set(exactcall.__all__))
            elif module in ("exactcall.adapters", "exactcall.integrations._adapters"):
                assert names <= set(exactcall.adapters.__all__), (name, names)
            else:
                assert module == "exactcall._wire", (name, module)
