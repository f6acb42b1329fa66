"""``exactcall mcp scan``: real stdio MCP servers started from client configs, no tool called."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp.types import Tool, ToolAnnotations

from exactcall.mcp.scan import classify, looks_read_only
from tests.conftest import ROOT
from tests.mcp_servers import effects

SERVER = [sys.executable, "-m", "tests.mcp_servers"]


def scan(*args: str, home: Path, cwd: Path = ROOT) -> tuple[int, Any, str]:
    """The real CLI in a child process (``HOME`` isolated): exit code, JSON or text, stderr."""
    env = {**os.environ, "HOME": str(home), "EXACTCALL_TEST_ROOT": str(ROOT)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "exactcall", "mcp", "scan", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out: Any = json.loads(proc.stdout) if "--json" in args and proc.stdout else proc.stdout
    return proc.returncode, out, proc.stderr


def entry(which: str, *extra: str) -> dict[str, Any]:
    """A Claude Desktop / Cursor ``mcpServers`` entry that starts a test server."""
    return {"command": SERVER[0], "args": [*SERVER[1:], which, *extra]}


def write_config(path: Path, servers: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def by_tool(report: dict[str, Any], server: str) -> dict[str, dict[str, Any]]:
    [s] = [s for s in report["servers"] if s["name"] == server]
    return {t["tool"]: t for t in s["tools"]}


def tool(name: str, description: str = "", **hints: Any) -> Tool:
    annotations = ToolAnnotations(**hints) if hints else None
    schema = {"type": "object", "properties": {}}
    return Tool(name=name, description=description, input_schema=schema, annotations=annotations)


# -- the classifier ----------------------------------------------------------------------------
def test_high_risk_evidence_wins_over_a_read_only_hint() -> None:
    c = classify(tool("delete_everything", "Remove all records.", read_only_hint=True))
    assert c.risk == "high"
    assert c.reasons == (
        "name matches 'delete' (deletes)",
        "readOnlyHint=true ignored: high-risk evidence wins over a hint",
    )
    c = classify(tool("update_ticket", read_only_hint=True))
    assert (c.risk, c.reasons) == (
        "medium",
        ("name matches 'update' (a write) despite readOnlyHint=true",),
    )
    assert classify(tool("get_weather", read_only_hint=True)).reasons == ("readOnlyHint=true",)


@pytest.mark.parametrize(
    ("name", "description", "hints", "risk"),
    [
        ("sendSlackMessage", "", {}, "high"),
        ("slack_message", "", {}, "high"),
        ("read_message", "", {}, "low"),
        ("get_payment", "", {}, "low"),
        ("refund-order", "", {}, "high"),
        ("exec_sql", "", {}, "high"),
        ("tidy", "Permanently deletes the files older than a week.", {}, "high"),
        ("archive_project", "", {"destructive_hint": True}, "high"),
        ("archive_project", "", {"destructive_hint": False}, "medium"),
        ("frobnicate", "", {}, "medium"),
        ("list_files", "", {}, "low"),
        ("list_and_clear", "", {}, "medium"),
    ],
)
def test_classes_by_name_description_and_hints(
    name: str, description: str, hints: dict[str, Any], risk: str
) -> None:
    assert classify(tool(name, description, **hints)).risk == risk


def test_the_read_only_name_heuristic() -> None:
    assert looks_read_only("search_docs") and looks_read_only("getUser")
    assert not looks_read_only("get_and_delete") and not looks_read_only("create_note")


# -- the command -------------------------------------------------------------------------------
def test_claude_desktop_config_classes_and_reports_a_broken_server(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "claude_desktop_config.json",
        {
            "risky": entry("risky"),
            "broken": entry("crash"),
            "remote": {"type": "http", "url": "http://127.0.0.1:9/mcp"},
        },
    )
    code, report, _ = scan("--config", str(config), "--json", home=tmp_path)
    assert code == 1 and report["exit_code"] == 1 and report["fail_on"] == "high"
    risks = {name: t["risk"] for name, t in by_tool(report, "risky").items()}
    assert risks == {
        "transfer_money": "high",
        "delete_everything": "high",
        "run_shell": "high",
        "send_message": "high",
        "update_ticket": "medium",
        "create_note": "medium",
        "get_weather": "low",
        "search_docs": "low",
    }
    why = by_tool(report, "risky")["transfer_money"]["reasons"]
    assert "name matches 'transfer' (moves money)" in why
    status = {s["name"]: (s["status"], s.get("error", "")) for s in report["servers"]}
    assert status["broken"][0] == "failed"
    assert "this server fails on purpose" in status["broken"][1]  # its stderr, reported
    assert status["remote"] == ("skipped", "not scanned: http server http://127.0.0.1:9/mcp")


def test_fail_on_levels_and_a_hung_server_does_not_decide(tmp_path: Path) -> None:
    effect_file = tmp_path / "effects.jsonl"
    config = write_config(
        tmp_path / "project" / ".cursor" / "mcp.json",
        {"writes": entry("writes", "--file", str(effect_file)), "hung": entry("hang")},
    )
    # the limit is for the hung server: the live one must answer well inside it even on a loaded
    # machine (a Python child that imports mcp took over 2 s under a full test run)
    args = ("--config", str(config), "--json", "--timeout", "8")
    code, report, _ = scan(*args, "--fail-on", "medium", home=tmp_path)
    assert code == 1
    tools = by_tool(report, "writes")
    assert tools["append"]["risk"] == "medium"
    assert tools["read_lines"]["risk"] == "low"
    assert tools["sneaky_append"]["reasons"] == [
        "name matches 'append' (a write) despite readOnlyHint=true"
    ]
    [hung] = [s for s in report["servers"] if s["name"] == "hung"]
    assert (hung["status"], hung["error"]) == (
        "failed",
        "no answer to initialize/tools/list within 8 s",
    )
    assert scan(*args, "--fail-on", "high", home=tmp_path)[0] == 0  # no high tool
    assert scan(*args, "--fail-on", "none", home=tmp_path)[0] == 0
    # only initialize and tools/list: no tool ran, not even the read-only one
    assert effects(effect_file) == [] and effects(effect_file, "reads") == []


def test_default_locations_and_claude_code_format(tmp_path: Path) -> None:
    project = tmp_path / "project"
    reads = {
        "type": "stdio",
        **entry("reads"),
        "env": {"PYTHONPATH": "${EXACTCALL_TEST_ROOT}"},  # Claude Code's ${VAR} expansion
    }
    write_config(project / ".mcp.json", {"reads": reads})
    code, text, _ = scan("--fail-on", "medium", home=tmp_path, cwd=project)
    assert code == 0
    assert "reads  (" in text and f"from {project / '.mcp.json'}" in text
    assert "low     get_weather  pass through      readOnlyHint=true; proxy: " in text
    assert "0 high, 0 medium, 2 low; 0 server(s) not scanned; --fail-on medium: exit 0" in text


def test_a_command_after_dashes_and_nothing_to_scan(tmp_path: Path) -> None:
    code, text, _ = scan("--", *SERVER, "risky", home=tmp_path)
    assert code == 1 and text.startswith("risky  (")
    assert "high    run_shell" in text
    code, _, err = scan(home=tmp_path, cwd=tmp_path)
    assert code == 2 and "no MCP client config found" in err and "--config FILE" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"servers": 3}')
    code, text, _ = scan("--config", str(bad), home=tmp_path)
    assert code == 2 and 'no "mcpServers" object' in text and "config skipped" in text
    only_broken = write_config(tmp_path / "broken.json", {"broken": entry("crash")})
    code, text, _ = scan("--config", str(only_broken), home=tmp_path)
    assert code == 2 and "1 server(s) not scanned" in text


def test_a_bad_config_is_reported_and_skipped_and_the_others_still_count(tmp_path: Path) -> None:
    (tmp_path / ".claude.json").write_text('{"projects": {}}')  # Claude Code's, no mcpServers
    good = write_config(tmp_path / "good.json", {"reads": entry("reads")})
    code, text, _ = scan(
        "--config",
        str(tmp_path / ".claude.json"),
        "--config",
        str(good),
        home=tmp_path,
    )
    assert code == 0, text
    assert "skipped: config skipped: " in text and 'no "mcpServers" object' in text
    assert "low     get_weather" in text and "1 server(s) not scanned" in text
    # a server entry without a command is skipped the same way, its neighbours scanned
    mixed = write_config(tmp_path / "mixed.json", {"nocmd": {"args": []}, "reads": entry("reads")})
    code, report, _ = scan("--config", str(mixed), "--json", home=tmp_path)
    assert code == 0
    status = {s["name"]: (s["status"], s.get("error", "")) for s in report["servers"]}
    assert status["reads"][0] == "scanned"
    assert status["nocmd"][0] == "skipped" and 'has no "command"' in status["nocmd"][1]


def test_declares_client_capabilities_so_capability_tools_are_listed(tmp_path: Path) -> None:
    raw = [sys.executable, "-m", "tests.mcp_proxy_servers", "raw", str(tmp_path / "raw.log")]
    code, report, _ = scan("--json", "--fail-on", "none", "--", *raw, home=tmp_path)
    assert code == 0
    [server] = report["servers"]
    assert sorted(t["tool"] for t in server["tools"]) == [
        "ask_model",
        "ask_user",
        "pick_root",
        "poke",
    ]


def test_the_proxy_column_is_what_the_proxy_does_with_the_same_flags(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.json", {"risky": entry("risky")})
    code, report, _ = scan("--config", str(config), "--json", home=tmp_path)
    tools = by_tool(report, "risky")
    # untrusted: the hint decides nothing, the name does
    assert (tools["get_weather"]["proxy"], tools["search_docs"]["proxy"]) == ("pass", "pass")
    assert tools["get_weather"]["proxy_reason"].startswith("the name starts with 'get'")
    assert tools["delete_everything"]["proxy"] == "guard"
    assert tools["create_note"]["proxy"] == "guard"
    flags = [
        "--trusted",
        "--approve",
        "transfer_money",
        "--read-only",
        "update_ticket",
        "--write",
        "search_docs",
        "--dedupe-window",
        "send_message=10m",
    ]
    code, report, _ = scan("--config", str(config), "--json", *flags, home=tmp_path)
    tools = by_tool(report, "risky")
    got = {name: (t["proxy"], t["proxy_reason"]) for name, t in tools.items()}
    assert got["transfer_money"] == ("approve", "--approve")
    assert got["update_ticket"] == ("pass", "--read-only")
    assert got["search_docs"] == ("guard", "--write")
    assert got["send_message"] == ("guard", "--dedupe-window 10m")
    # trusted: a readOnlyHint counts, except where the name says write
    assert got["get_weather"][0] == "pass"
    assert got["delete_everything"][0] == "guard", got["delete_everything"]
    code, text, _ = scan("--config", str(config), "--trusted", home=tmp_path)
    assert "need approval" not in text and "guard as a write" in text
    code, _, err = scan("--config", str(config), "--read-only", "x", "--write", "x", home=tmp_path)
    assert code == 2 and "tool 'x' is given both as a read" in err
