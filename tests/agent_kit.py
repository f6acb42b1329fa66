"""What the tests of the Google Gen AI, Google ADK and Strands adapters share: the tools, the
prompt a scripted model plans its calls from, and the crash scenario (plain 2 effects,
exactcall 1). An app module imports the tools, so ``exactcall worker --tools APP`` finds them.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError

import exactcall
from exactcall import approvals, reconciliation
from exactcall.demo.bank import Bank
from exactcall.quickstart._common import (
    CRASH_PLAIN_ENV,
    crash_after_plain_effect,
    find_payment,
    pay_at_bank,
)
from exactcall.testing import WorkerProcess
from tests.conftest import ROOT
from tests.test_approvals import eventually

FAST = timedelta(seconds=2)


# -- tools -------------------------------------------------------------------------------------
@exactcall.tool(reconcile=find_payment, heartbeat_timeout=FAST)
async def kit_pay(bank: str, amount: int, to: str, *, idempotency_key: str) -> dict[str, Any]:
    """Pay `amount` to the account `to` at the bank whose URL is `bank`."""
    return await pay_at_bank(bank, amount, to, key=idempotency_key)


@exactcall.tool(approval=True, heartbeat_timeout=FAST)
async def kit_approved_pay(
    bank: str, amount: int, to: str, *, idempotency_key: str
) -> dict[str, Any]:
    """Pay, once a person approved exactly this call (exactcall's own approval)."""
    return await pay_at_bank(bank, amount, to, key=idempotency_key)


@exactcall.tool(heartbeat_timeout=FAST)
async def kit_held_pay(bank: str, amount: int, to: str, *, idempotency_key: str) -> dict[str, Any]:
    """Pay, once a person confirmed exactly this call (the framework's own human-in-the-loop)."""
    return await pay_at_bank(bank, amount, to, key=idempotency_key)


@exactcall.tool(on_unknown="raise", heartbeat_timeout=FAST)
async def kit_pay_then_lose(
    bank: str, amount: int, to: str, *, idempotency_key: str
) -> dict[str, Any]:
    """Pay, then lose the answer: an unknown outcome, raised (no probe)."""
    await pay_at_bank(bank, amount, to, key=idempotency_key)
    raise ConnectionResetError("the answer was lost after the payment was sent")


@activity.defn(name="kit_plain_pay")
async def kit_plain_pay(bank: str, amount: int, to: str) -> dict[str, Any]:
    """Pay `amount` to the account `to` at the bank whose URL is `bank`."""
    receipt = await pay_at_bank(bank, amount, to)
    crash_after_plain_effect()  # SIGKILL right after the payment (first attempt, when asked)
    return receipt


# -- the scripted model's plan and answer -------------------------------------------------------
def prompt(bank: str, *calls: tuple[str, int, str]) -> str:
    """``bank: URL`` then one ``pay: TOOL AMOUNT ACCOUNT`` line per call to make."""
    return "\n".join([f"bank: {bank}", *(f"pay: {t} {a} {to}" for t, a, to in calls)])


def planned(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The calls a prompt asks for: (tool, arguments)."""
    bank, calls = None, []
    for line in text.splitlines():
        head, _, rest = line.partition(":")
        if head.strip() == "bank":
            bank = rest.strip()
        elif head.strip() == "pay":
            tool, amount, to = rest.split()
            calls.append((tool, {"bank": bank, "amount": int(amount), "to": to}))
    return calls


def said(name: str | None, ok: bool, value: Any) -> str:
    """The scripted model's line about one tool result: ``TOOL ok|failed: JSON``."""
    return f"{name} {'ok' if ok else 'failed'}: {json.dumps(value, sort_keys=True)}"


def paid(bank: Bank, who: str) -> list[int]:
    return [p["amount"] for p in bank.payments() if p["to_account"] == who]


# -- a real SIGKILL right after the payment: plain 2 effects, exactcall 1 -----------------------
async def plain_twice_exactcall_once(
    crash_at: Callable[..., Awaitable[WorkerProcess]],
    client: Client,
    task_queue: str,
    bank: Bank,
    app: str,
    *,
    plain: str,
    exact: str,
) -> tuple[str, str]:
    """Run workflow ``plain`` (the framework's own activity tool, ``kit_plain_pay``), then
    ``exact`` (``kit_pay`` through exactcall), each on a worker process of ``app`` that
    SIGKILLs itself right after the payment; then a healthy worker finishes both. Checks the
    counts at the bank (2 and 1) and returns both answers."""
    kw: dict[str, Any] = {"tools": [app], "workflows": [app], "plugins": [f"{app}:plugins"]}
    kw["cwd"] = ROOT
    handles, accounts = [], []
    for wf, tool in ((plain, "kit_plain_pay"), (exact, "kit_pay")):
        to = f"{tool}-{uuid.uuid4().hex[:8]}"
        worker = await crash_at("kit_pay", "after_call", env={CRASH_PLAIN_ENV: "1"}, **kw)
        handles.append(
            await client.start_workflow(
                wf,
                prompt(bank.url, (tool, 10, to)),
                id=f"{to}-wf",
                task_queue=task_queue,
                result_type=str,
            )
        )
        accounts.append(to)
        assert await worker.killed() == -9
        assert paid(bank, to) == [10]  # killed right after the payment
    await crash_at(**kw)  # a healthy worker: the plain activity runs again; the probe finds it
    texts = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 60)
    assert paid(bank, accounts[0]) == [10, 10]
    assert paid(bank, accounts[1]) == [10]
    key = exactcall.derive_key("default", handles[1].id, "kit_pay#1", "kit_pay", "1")
    assert texts[1].startswith("kit_pay ok:") and key in texts[1], texts[1]
    assert texts[0].startswith("kit_plain_pay ok:"), texts[0]
    return texts[0], texts[1]


# -- the steps every adapter's tests take ------------------------------------------------------
async def unknown_fails_the_run(
    client: Client, workflow: str, wid: str, tq: str, bank: Bank, who: str
) -> None:
    """``kit_pay_then_lose`` pays once and loses its outcome: the run fails with
    AmbiguousOutcome (the model never sees it) and the call is listed as unresolved."""
    text = prompt(bank.url, ("kit_pay_then_lose", 3, who))
    with pytest.raises(WorkflowFailureError) as failed:
        await client.execute_workflow(workflow, text, id=wid, task_queue=tq)
    assert getattr(failed.value.cause, "type", None) == "AmbiguousOutcome", repr(failed.value)
    assert paid(bank, who) == [3]

    async def listed() -> list[str]:
        rows = await reconciliation.list_unresolved(client)
        return [r.tool for r in rows if r.workflow_id == wid]

    assert await eventually(listed, bool, timeout=20) == ["kit_pay_then_lose"]


async def the_pending_request(client: Client, wid: str) -> approvals.ApprovalRequest:
    """The one call of run ``wid`` that waits for a person, once it is listed."""

    async def mine() -> list[approvals.ApprovalRequest]:
        return [r for r in await approvals.list_pending(client) if r.workflow_id == wid]

    [req] = await eventually(mine, bool, timeout=20)
    return req
