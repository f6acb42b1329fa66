"""`exactcall doctor`: versions and the server, as a person runs it."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from exactcall.embedded._server import DevServer
from tests.conftest import ROOT


async def doctor(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "exactcall",
        "doctor",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode() + err.decode()


async def test_doctor_reports_versions_the_server_and_search_attributes(
    server: DevServer,
) -> None:
    import temporalio

    rc, out = await doctor("--address", server.address, "--json")
    assert rc == 0, out
    report: dict[str, Any] = json.loads(out)
    assert report["problems"] == []
    assert report["packages"]["temporalio"] == temporalio.__version__
    assert report["server"]["reached"] is True
    assert report["server"]["search_attributes"] == {
        "ExactcallPending": True,
        "ExactcallUnresolved": True,
    }
    assert "Server 1." in report["temporal_cli"]["version"]
    frameworks = {f["framework"]: f["packages"] for f in report["frameworks"]}
    assert frameworks["LangGraph"]["temporalio-langgraph"]  # installed by the agents extra
    assert frameworks["OpenAI Agents SDK"]["temporalio-openai-agents"]
    assert frameworks["Google Gen AI"]["temporalio-google-genai"]  # the agents extra too
    assert frameworks["Google ADK"]["temporalio-google-adk"]
    assert "Strands" in frameworks  # its own environment (mcp<2): shown installed or not

    rc, text = await doctor("--address", server.address)
    assert rc == 0 and "no problems found" in text and "reached, version" in text


async def test_doctor_says_what_is_wrong_when_no_server_answers() -> None:
    rc, text = await doctor("--address", "127.0.0.1:1")
    assert rc == 1
    assert "NOT reached" in text
    assert "problem: no Temporal server at 127.0.0.1:1" in text and "exactcall server" in text


async def test_doctor_names_approval_options_that_need_signing(server: DevServer) -> None:
    rc, out = await doctor("--address", server.address, "--tools", "tests.tools", "--json")
    report: dict[str, Any] = json.loads(out)
    assert "wire" in report["tools"] and "transfer" in report["tools"]
    [warning] = report["unsigned_approval_identities"]  # only wire relies on names
    assert warning.startswith("tool wire: approvers=, min_approvals=2, requester_may_approve=False")
    assert "approver_keys" in warning
    assert rc == 0  # a warning: the workers may well sign (the doctor cannot see them)
    rc, text = await doctor("--address", server.address, "--tools", "tests.tools")
    assert rc == 0 and "warning: tool wire: approvers=" in text
