"""The provider fails after the effect (issue 36 §3): between the tool and the real local HTTP
bank, the chaos proxy lets the first request of each payment commit, then loses its answer:
the connection dropped, a 502, or the answer held longer than the tool's own timeout. Each call
ends with one payment at the bank: a provider-idempotent tool's retry carries the same key
(the bank replays it); a tool with a probe is found landed, never re-sent; a plain tool is
unknown until a person, shown the call, settles it, never re-sent either."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

import tests.fault_tools  # noqa: F401  (its tools, for the in-process worker)
from exactcall import reconciliation
from exactcall.demo.bank import Bank
from exactcall.dev._chaos import FAULTS, ChaosProxy
from tests.conftest import plan, start_agent, step
from tests.test_reconcile import parked

TIMEOUT = 1.0
"""The tools' own HTTP timeout; a late-response answer comes 2 s after it."""


@pytest.mark.parametrize("tool", ["via_charge", "via_book", "via_pay"])
@pytest.mark.parametrize("fault", FAULTS)
async def test_an_answer_lost_after_the_provider_committed_is_one_effect(
    client: Client, worker: Worker, tq: str, bank: Bank, who: str, fault: str, tool: str
) -> None:
    with ChaosProxy(bank.url, fault=fault, late_by=TIMEOUT + 2) as proxy:
        the_step = step(tool, bank.url, proxy.url, 10, who, TIMEOUT)
        handle = await start_agent(client, tq, plan(the_step))
        paid = None
        if tool == "via_pay":  # unknown: a person looks at the bank and says it landed
            row = await parked(client, handle.id)
            assert row.reason.startswith("the tool raised"), row.reason
            [paid] = [p for p in bank.payments() if p["to_account"] == who]
            res = await reconciliation.resolve(
                client, handle.id, row.step, "landed", result=paid, by="ops"
            )
            assert res.accepted, res
        [out] = await asyncio.wait_for(handle.result(), 30)
        [action] = proxy.report().actions
    assert "ok" in out, out
    assert bank.count(to=who) == 1
    assert action.response_dropped
    if tool == "via_charge":  # re-sent with the same key: the bank replayed it
        assert len(action.idempotency_keys) == 2 and action.verdict == "protected", action
        assert out["ok"]["to"] == who
    else:  # never re-sent; the probe found the payment, or the person gave it
        assert action.executions == 1, action
        assert out["ok"] == ({"count": 1} if tool == "via_book" else paid), out


LAG = 5.0
"""How long after a request arrives the slow bank commits it (the tool gives up after 1 s)."""


@pytest.mark.parametrize(("tool", "payments"), [("book_late", 2), ("book_late_declared", 1)])
async def test_a_provider_that_commits_after_the_tool_gave_up_needs_late_commit(
    client: Client, worker: Worker, tq: str, tmp_path: Path, who: str, tool: str, payments: int
) -> None:
    # The bank commits each payment LAG s after it arrives; the tool gives up after TIMEOUT s,
    # so its attempt ends in doubt before the payment exists. The reconciliation's probe says
    # "not landed", and again once the attempt's claim is gone (3 s): still before the commit.
    # Without late_commit the call is re-run and the bank is paid twice (the limit the docs
    # state, shown here so the scenario is known to be real); with late_commit (6 s) longer
    # than the lag, the probe is asked again after it and finds the one payment.
    with Bank(tmp_path / "bank.db") as slow:
        _post(f"{slow.url}/faults", {"delay_ms": int(LAG * 1000)})
        handle = await start_agent(client, tq, plan(step(tool, slow.url, 10, who, TIMEOUT)))
        if payments == 1:
            [out] = await asyncio.wait_for(handle.result(), 60)
            assert out["ok"] == {"count": 1}, out
            await asyncio.sleep(LAG + TIMEOUT)  # a second request, had one been sent, commits
        else:
            for _ in range(300):
                if slow.count(to=who) >= payments:
                    break
                await asyncio.sleep(0.1)
        assert slow.count(to=who) == payments


def _post(url: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
