"""MCP tools of the test server (tests/mcp_servers.py ``writes``) as exactcall tools.

Workers serve them with tests.workflows.Agent (which calls tools by name) and an MCP server
named ``t`` (untrusted) and, for the hint tests, ``tt`` (the same server, trusted):

    exactcall worker --tools tests.mcp_app --workflows tests.workflows \\
        --mcp-server "t=python -m tests.mcp_servers writes --file PATH"
"""

from __future__ import annotations

import shlex
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

import exactcall
import exactcall.mcp

ROOT = Path(__file__).parent.parent  # no resolve(): the workflow sandbox imports this module
FAST = timedelta(seconds=2)
QUICK_RETRIES = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=3)


def command(effect_file: Path | str) -> list[str]:
    """The stdio command of the test server that appends its effects to ``effect_file``."""
    return [sys.executable, "-m", "tests.mcp_servers", "writes", "--file", str(effect_file)]


def servers(effect_file: Path | str) -> dict[str, Any]:
    """``Plugin(mcp_servers=...)`` for these tools: ``t`` untrusted, ``tt`` trusted."""
    cmd = command(effect_file)
    return {
        "t": {"command": cmd, "cwd": str(ROOT)},
        "tt": exactcall.mcp.McpServerSpec(command=tuple(cmd), cwd=str(ROOT), trusted=True),
    }


def worker_args(effect_file: Path | str) -> list[str]:
    """The same servers as ``exactcall worker`` flags (run with cwd=ROOT)."""
    line = shlex.join(command(effect_file))
    return ["--mcp-server", f"t={line}", "--mcp-server", f"tt={line}", "--mcp-trusted", "tt"]


async def find_by_key(intent: exactcall.Intent) -> Any:
    """Reconcile probe: ask the server (its read-only ``find_key``) for the call's key."""
    result = await exactcall.mcp.call_tool("t", "find_key", {"key": intent.key})
    found = result.structured_content
    if result.is_error or not isinstance(found, dict):
        return exactcall.Unknown(f"find_key answered {result.content!r}")
    if not found["found"]:
        return exactcall.NotLanded()
    return exactcall.Landed({"line": found["line"], "text": found["record"]["text"]})


append = exactcall.mcp.tool("t", "append", heartbeat_timeout=FAST)
slow_append = exactcall.mcp.tool("t", "slow_append", heartbeat_timeout=FAST)
read_lines = exactcall.mcp.tool("t", "read_lines", read_only=True)
keyed_append = exactcall.mcp.tool(
    "t", "keyed_append", provider_idempotent=True, heartbeat_timeout=FAST
)
probed_append = exactcall.mcp.tool(
    "t", "append", tool_name="mcp.t.append_probed", reconcile=find_by_key, heartbeat_timeout=FAST
)
approved_append = exactcall.mcp.tool(
    "t", "append", tool_name="mcp.t.append_approved", approval=True, heartbeat_timeout=FAST
)
not_executed = exactcall.mcp.tool(
    "t", "not_executed", retry_policy=QUICK_RETRIES, heartbeat_timeout=FAST
)
fails_after_effect = exactcall.mcp.tool("t", "fails_after_effect", heartbeat_timeout=FAST)
no_such_tool = exactcall.mcp.tool("t", "no_such_tool", heartbeat_timeout=FAST)
unconfigured = exactcall.mcp.tool("nowhere", "append", heartbeat_timeout=FAST)

# read_only=None: the hint decides only on the trusted server ``tt``
untrusted_show_key = exactcall.mcp.tool("t", "show_key")
trusted_show_key = exactcall.mcp.tool("tt", "show_key")
trusted_append = exactcall.mcp.tool("tt", "append", heartbeat_timeout=FAST)
trusted_sneaky = exactcall.mcp.tool("tt", "sneaky_append")
untrusted_sneaky = exactcall.mcp.tool("t", "sneaky_append", heartbeat_timeout=FAST)


@workflow.defn
class Notebook:
    """The README's example: an agent step that appends a note through exactcall."""

    @workflow.run
    async def run(self, text: str) -> dict[str, Any]:
        try:
            return await exactcall.call(append, text=text)
        except (exactcall.ToolFailed, exactcall.AmbiguousOutcome) as err:
            return {"error": err.code, "message": err.message}


# the trusted server's read-only show_key on a task queue that no worker polls, so a cancel
# always finds its activity scheduled (tests/histories/mcp/hinted_read_*.json)
unpolled_show_key = exactcall.mcp.tool(
    "tt",
    "show_key",
    tool_name="mcp.tt.show_key_unpolled",
    task_queue="exactcall-nobody-polls",
    start_to_close_timeout=timedelta(seconds=30),
)


@workflow.defn
class HintedRead:
    """Calls a read_only=None tool of the trusted server. Before Core v3 the workflow ran it
    as a read when the worker's server hinted read-only, as the stored histories show."""

    @workflow.run
    async def run(self, wait: bool) -> Any:
        return await exactcall.call(unpolled_show_key if wait else trusted_show_key)
