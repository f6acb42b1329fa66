"""`exactcall quickstart`: each installed framework crashed right after its payment, for real."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from tests.conftest import ROOT

# hide the frameworks from one child process, as if their extras were not installed
_WITHOUT_FRAMEWORKS = """
import sys
class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("agents", "pydantic_ai", "langgraph") or name in (
            "temporalio.openai_agents", "temporalio.langgraph"):
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, _Hide())
from exactcall.cli._main import main
sys.exit(main(["quickstart"]))
"""


async def _run(*args: str, timeout: float = 240) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "EXACTCALL_LOG_LEVEL": "WARNING"},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_quickstart_pays_twice_plain_and_once_with_exactcall_in_every_framework() -> None:
    rc, out, err = await _run(sys.executable, "-m", "exactcall", "quickstart", "--json")
    report: dict[str, Any] = json.loads(out)
    by_name = {f["framework"]: f for f in report["frameworks"]}
    assert set(by_name) == {"OpenAI Agents SDK", "Pydantic AI", "LangGraph"}, (out, err)
    for name, f in by_name.items():
        assert f["error"] is None, (name, f, err[-3000:])
        assert f["plain_payments"] == 2, (name, f)  # the plain integration's retry paid again
        assert f["exactcall_payments"] == 1, (name, f)
        assert f["worker_kills"] == 2, (name, f)  # one SIGKILL right after each payment
        assert f["plain_answer"] and f["exactcall_answer"], (name, f)
    assert rc == 0


async def test_quickstart_without_any_framework_says_which_extras_to_install() -> None:
    rc, out, _ = await _run(sys.executable, "-c", _WITHOUT_FRAMEWORKS, timeout=60)
    assert rc == 1
    assert "no agent framework is installed" in out
    for extra in ("openai-agents", "pydantic-ai", "langgraph", "agents"):
        assert f"pip install 'exactcall[{extra}]'" in out


async def test_quickstart_refuses_an_unknown_framework() -> None:
    rc, _, err = await _run(sys.executable, "-m", "exactcall", "quickstart", "crewai", timeout=60)
    assert rc == 2 and "unknown framework crewai" in err
