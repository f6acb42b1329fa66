"""The agent and tools of ``bench/explore.py`` (the fault-schedule explorer).

Served by worker processes (``exactcall worker --tools bench._explore_workflows --workflows
bench._explore_workflows``, the repo root as the working directory). Every tool pays at the
demo bank, which is where the explorer counts effects: each workflow id pays its own account,
each step a distinct amount, so a second payment of one (account, amount) is a second effect
of one (workflow id, step). Each tool sleeps ``pause`` seconds before and after paying (the
effect is in a thread, as a blocking HTTP client's would be), so faults land inside calls.

* ``ex_plain`` (amount 1): no key, no probe: after a crash inside it, unknown and parked;
* ``ex_probed`` (2): sends its key; after a crash, a probe asks the bank for it;
* ``ex_idem`` (3): provider-idempotent (the bank dedupes the key), with an undo that pays
  the amount back to ``<account>:refund`` under the undo's own key;
* ``ex_approved`` (4): needs an approval of its exact arguments, then pays with its key.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import exactcall
    from exactcall.demo.bank_client import post_payment, receipt_with_key

__all__ = ["AGENT", "ROLLOVER", "STEPS", "ExploreAgent"]

AGENT = "ExploreAgent"
ROLLOVER = "rollover"
STEPS = (("ex_plain", 1), ("ex_probed", 2), ("ex_idem", 3), ("ex_approved", 4))
"""The agent's calls, in order: (tool, amount). Each tool once: its step is ``<tool>#1``."""
FAST = timedelta(seconds=2)


async def _pay(bank: str, amount: int, to: str, pause: float, keyed: bool) -> dict[str, Any]:
    await asyncio.sleep(pause)
    headers = exactcall.idempotency_headers() if keyed else None
    receipt = await asyncio.to_thread(post_payment, bank, amount, to, headers)
    await asyncio.sleep(pause)  # the effect happened; not yet recorded
    return receipt


@exactcall.tool(heartbeat_timeout=FAST)
async def ex_plain(bank: str, amount: int, to: str, pause: float) -> dict[str, Any]:
    return await _pay(bank, amount, to, pause, keyed=False)


def find_ex_payment(intent: exactcall.Intent) -> Any:
    """Probe of ``ex_probed``: did the bank book a payment under the call's key?"""
    receipt = receipt_with_key(str(intent.args["bank"]), intent.key)
    return exactcall.NotLanded() if receipt is None else exactcall.Landed(receipt)


@exactcall.tool(reconcile=find_ex_payment, heartbeat_timeout=FAST)
async def ex_probed(bank: str, amount: int, to: str, pause: float) -> dict[str, Any]:
    return await _pay(bank, amount, to, pause, keyed=True)


@exactcall.tool(provider_idempotent=True, heartbeat_timeout=FAST)
async def ex_idem(bank: str, amount: int, to: str, pause: float) -> dict[str, Any]:
    return await _pay(bank, amount, to, pause, keyed=True)


@ex_idem.undo(provider_idempotent=True, heartbeat_timeout=FAST)
async def refund_ex_idem(done: exactcall.Done) -> dict[str, Any]:
    """Pays the amount back to ``<account>:refund`` (the undo's own key: once)."""
    a = done.args
    headers = exactcall.idempotency_headers()
    to = f"{a['to']}:refund"
    return await asyncio.to_thread(post_payment, str(a["bank"]), int(str(a["amount"])), to, headers)


@exactcall.tool(approval=True, provider_idempotent=True, heartbeat_timeout=FAST)
async def ex_approved(bank: str, amount: int, to: str, pause: float) -> dict[str, Any]:
    return await _pay(bank, amount, to, pause, keyed=True)


@workflow.defn(name=AGENT)
class ExploreAgent:
    """Makes the four calls in order, each once. The ``rollover`` signal makes it continue as
    new after the call in progress, carrying the rows it has (the new run makes the rest).
    Returns one row per call: its outcome (done, unknown, denied, or error) and reason."""

    def __init__(self) -> None:
        self._rollover = False

    @workflow.signal(name=ROLLOVER)
    def rollover(self) -> None:
        self._rollover = True

    @workflow.run
    async def run(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = list(job.get("rows") or [])
        for tool, amount in STEPS[len(rows) :]:
            rows.append(await self._call(job, tool, amount))
            if self._rollover and len(rows) < len(STEPS):
                workflow.continue_as_new({**job, "rows": rows})
        return rows

    async def _call(self, job: dict[str, Any], tool: str, amount: int) -> dict[str, Any]:
        row: dict[str, Any] = {"tool": tool, "step": f"{tool}#1", "amount": amount}
        on_unknown = "raise" if tool == "ex_plain" else None
        try:
            out = await exactcall.call(
                tool, job["bank"], amount, job["account"], job["pause"], on_unknown=on_unknown
            )
            row.update(outcome="done", payment_id=out["payment_id"])
        except exactcall.AmbiguousOutcome as err:
            row.update(outcome="unknown", reason=str(err.fields.get("reason") or err.message))
        except exactcall.ApprovalDenied as err:
            row.update(outcome="denied", reason=err.message)
        except exactcall.ExactcallError as err:
            row.update(outcome="error", error=err.code, reason=err.message[:300])
        return row
