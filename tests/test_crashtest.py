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
    # the demo agent reports each call's status; its run ended with the abandon it was given
    assert parked["final"].endswith("pay_no_key=CallAbandoned")
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


async def test_a_run_that_made_no_call_proves_nothing_and_exits_1(server: object) -> None:
    rc, out, err = await crashtest(
        "tests.workflows:Agent",
        "--tools",
        "tests.tools",
        "--input",
        json.dumps({"steps": []}),
        "--address",
        server.address,  # type: ignore[attr-defined]
    )
    assert rc == 1, out + err[-2000:]
    assert "found 0 calls" in out  # the progress (stdout without --json)
    assert "NOT PROVEN: the run without a crash made no exactcall call" in err
    assert "no call ran twice" not in out  # never the green line


async def test_a_run_that_does_not_finish_proves_nothing_and_exits_1(server: object) -> None:
    # it waits for a signal that never comes (an agent framework's workflow without its
    # plugin never finished either): not proven, and no boundary is tried
    rc, out, err = await crashtest(
        "tests.workflows:Agent",
        "--tools",
        "tests.tools",
        "--input",
        json.dumps({"steps": [], "wait_first": True}),
        "--timeout",
        "3",
        "--json",
        "--address",
        server.address,  # type: ignore[attr-defined]
    )
    assert rc == 1, out + err[-2000:]
    report = json.loads(out)
    assert report["proven"] is False and "did not finish within" in report["not_proven"]
    assert [b["boundary"] for b in report["boundaries"]] == ["no crash"]
    assert "--plugin" in err and "NOT PROVEN" in err


def framework_input(framework: str, bank: str, who: str) -> tuple[str, str]:
    """The crashtest target of each framework's test app, and its input (one payment)."""
    if framework == "openai-agents":
        plan = {"turns": [[{"tool": "oa_pay", "args": {"bank": bank, "amount": 5, "to": who}}]]}
        return "oa_app:OaAgent", json.dumps({**plan, "final": "done"})
    if framework == "pydantic-ai":
        from tests.pai_app import prompt

        return "pai_app:PaiAgent", json.dumps(prompt(bank, ("pai_pay", 5, who)))
    from tests.lg_app import pay_call

    return "lg_app:LgAgent", json.dumps({"script": [[pay_call("lg_pay", bank, 5, who)]]})


@pytest.mark.parametrize("framework", ["openai-agents", "pydantic-ai", "langgraph"])
async def test_a_framework_agent_is_crashtested_through_its_plugin(
    server: object, bank: Bank, who: str, framework: str
) -> None:
    # the framework's workflow runs only with its plugin: --plugin gives it to the client and
    # to every worker the crashtest starts (without it the run never finished: "not proven")
    target, the_input = framework_input(framework, bank.url, who)
    app = "tests." + target.partition(":")[0]
    rc, out, err = await crashtest(
        "tests." + target,
        "--tools",
        app,
        "--plugin",
        f"{app}:plugins",
        "--input",
        the_input,
        "--json",
        "--address",
        server.address,  # type: ignore[attr-defined]
    )
    assert rc == 0, out[-2000:] + err[-3000:]
    report = json.loads(out)
    assert report["proven"] is True
    [call] = report["calls"]
    step = call["step"]
    names = {b["boundary"] for b in report["boundaries"]}
    assert {f"after the effect of {step}", f"during reconciliation of {step}"} <= names
    assert report["duplicates"] == 0 and report["unapproved"] == 0
    assert all(b["final"] != "did not finish" for b in report["boundaries"])
    assert bank.count(to=who) == len(report["boundaries"])  # one payment per run, never two


def test_an_agent_failed_by_the_crashtests_own_abandon_says_so() -> None:
    # an agent that does not catch CallAbandoned fails: the row says why, not just the type
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import ApplicationError

    from exactcall.dev._crashtest import _final

    loop = asyncio.new_event_loop()
    try:
        abandoned, other = loop.create_future(), loop.create_future()
        abandoned.set_exception(
            WorkflowFailureError(cause=ApplicationError("abandoned", type="CallAbandoned"))
        )
        other.set_exception(WorkflowFailureError(cause=ApplicationError("boom", type="KeyError")))
        assert (
            _final(abandoned, {"pay#1"}) == "ended by the crashtest's abandon of unresolved pay#1"
        )
        assert _final(other, {"pay#1"}) == "failed: WorkflowFailureError"
        assert _final(abandoned, ()) == "failed: WorkflowFailureError"  # it abandoned nothing
    finally:
        loop.close()
