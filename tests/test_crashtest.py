"""`exactcall crashtest`: every boundary of a real agent, real kills, real execution counts."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from exactcall.demo.bank import Bank
from tests.conftest import ROOT

pytestmark = pytest.mark.crash


async def crashtest(*args: str, timeout: float = 400) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "exactcall",
        "crashtest",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_demo_agent_never_runs_a_call_twice() -> None:
    rc, out, err = await crashtest("--demo", "--json")
    assert rc == 0, err[-3000:]
    report = json.loads(out)
    steps = [c["step"] for c in report["calls"]]
    assert steps == ["pay#1", "pay_probed#1", "approved_pay#1", "pay_no_key#1"]
    names = {b["boundary"] for b in report["boundaries"]}
    for step in steps:
        assert {
            f"before {step}",
            f"after the effect of {step}",
            f"after the result of {step}",
        } <= names
    assert "waiting for approval of approved_pay#1" in names
    assert "during reconciliation of pay_probed#1" in names
    assert report["duplicates"] == 0 and report["unapproved"] == 0
    by_name = {b["boundary"]: b for b in report["boundaries"]}
    # the provider-idempotent re-send is reported as such, not as a duplicate
    assert by_name["after the effect of pay#1"]["protected"] == [
        "pay#1 re-sent x1 with the same key"
    ]
    # a crash inside a call with no probe and no dedupe is parked, not re-sent
    parked = by_name["after the effect of pay_no_key#1"]
    assert parked["unknown"] == ["pay_no_key#1"] and parked["executions"]["pay_no_key#1"] == 1
    assert report["plain_temporal"]["executions"] == 2 and report["plain_temporal"]["duplicate"]
    assert "[" in err and "found 4 calls" in err  # progress while it runs


async def test_a_duplicate_makes_it_exit_1(server: object, bank: Bank) -> None:
    rc, out, err = await crashtest(
        "tests.workflows:LyingAgent",
        "--tools",
        "tests.tools",
        "--input",
        json.dumps(bank.url),
        "--address",
        server.address,  # type: ignore[attr-defined]
    )
    assert rc == 1, out + err[-2000:]
    assert "DUPLICATE: lying_pay#1 ran 2 times" in out
